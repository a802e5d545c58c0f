"""op_policy: a backend's per-op declarations overriding `policy` (docs/interface.md)."""

import pytest

from attention_conformance.backends.numpy import NumpyBackend
from attention_conformance.backend.interface import (declaration_problems, describe, op_policy,
                                             policy_for)
from attention_conformance.process.backend_host import declaration


class PerOp(NumpyBackend):
    op_policy = {"multi_head_attention": {"fully_masked_rows": "nan"}}


class CatchAll(NumpyBackend):
    def __getattr__(self, name):          # makes up every missing attribute
        return 42


def test_op_policy_overrides_policy_for_that_op_only():
    backend = PerOp()
    assert policy_for(backend, "multi_head_attention")["fully_masked_rows"] == "nan"
    assert policy_for(backend, "sdpa")["fully_masked_rows"] == backend.policy["fully_masked_rows"]
    assert policy_for(backend, "sdpa") == backend.policy
    assert not declaration_problems(backend)


def test_it_travels_to_reports_and_across_the_process_boundary():
    backend = PerOp()
    assert describe(backend)["op_policy"] == PerOp.op_policy
    assert declaration(backend)["op_policy"] == PerOp.op_policy
    assert "op_policy" not in describe(NumpyBackend())
    assert declaration(NumpyBackend())["op_policy"] == {}


def test_a_catch_all_getattr_declares_no_op_policy():
    backend = CatchAll()
    assert op_policy(backend) == {}
    assert policy_for(backend, "sdpa") == backend.policy
    assert not declaration_problems(backend)


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
