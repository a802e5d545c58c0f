"""op_policy: a backend's per-op declarations overriding `policy` (docs/interface.md)."""

import pytest

from attention_conformance.backends.numpy import NumpyBackend
from attention_conformance.backend.interface import (Declaration, declaration_problems, declare,
                                                     describe, op_policy, policy_for)


class PerOp(NumpyBackend):
    op_policy = {"multi_head_attention": {"fully_masked_rows": "nan"}}


class CatchAll(NumpyBackend):
    def __getattr__(self, name):          # makes up every missing attribute
        return 42


def test_op_policy_overrides_policy_for_that_op_only():
    backend = PerOp()
    declared = declare(backend)
    assert policy_for(declared, "multi_head_attention")["fully_masked_rows"] == "nan"
    assert policy_for(declared, "sdpa")["fully_masked_rows"] == backend.policy["fully_masked_rows"]
    assert policy_for(declared, "sdpa") == backend.policy
    assert not declaration_problems(backend)


def test_it_travels_to_reports_and_across_the_process_boundary():
    declared = declare(PerOp())
    assert describe(declared)["op_policy"] == PerOp.op_policy
    assert Declaration.from_dict(declared.as_dict()) == declared
    assert declared.as_dict()["op_policy"] == PerOp.op_policy
    assert "op_policy" not in describe(declare(NumpyBackend()))
    assert declare(NumpyBackend()).as_dict()["op_policy"] == {}


def test_a_catch_all_getattr_declares_no_op_policy_and_no_expected_failures_file():
    backend = CatchAll()
    assert op_policy(backend) == {}
    assert policy_for(declare(backend), "sdpa") == backend.policy
    assert declare(backend).expected_failures_file == ""
    assert not declaration_problems(backend)


@pytest.mark.parametrize("field, value", [
    ("name", 3), ("dtypes", "float32"), ("policy", {"a": 1}), ("op_policy", {"sdpa": [1]}),
    ("ops", [None]), ("versions", None)])
def test_a_declaration_that_crossed_from_the_backends_process_is_checked(field, value):
    """The backend's process runs the adapter's code: what it sends is data to check."""
    data = {**declare(NumpyBackend()).as_dict(), field: value}
    with pytest.raises(ValueError, match="not a declaration"):
        Declaration.from_dict(data)


@pytest.mark.parametrize("value, message", [
    ([("sdpa", {})], "op_policy must be a dict of op name -> {policy: choice}"),
    ({"attention": {"fully_masked_rows": "nan"}}, "op_policy names unknown op 'attention'"),
    ({"sdpa": "nan"}, "op_policy['sdpa'] must be a dict of policy name -> choice"),
    ({"sdpa": {"masked_rows": "nan"}}, "op_policy['sdpa'] names unknown policy 'masked_rows'"),
    ({"sdpa": {"fully_masked_rows": "none"}},
     "op_policy['sdpa'] fully_masked_rows='none' is not one of zeros, uniform, nan"),
])
def test_a_bad_op_policy_is_a_declaration_problem(value, message):
    backend = NumpyBackend()
    backend.op_policy = value
    problems = declaration_problems(backend)
    assert any(message in p for p in problems), problems
