"""policy_when: choices that hold only under a condition of the call (docs/interface.md,
"Policies by condition"): checked on load, carried across the process boundary, and
used by the judge to pick the branch of each test."""

from pathlib import Path

import numpy as np
import pytest

from attention_conformance.backend.in_process import InProcess
from attention_conformance.backend.interface import (Declaration, declaration_problems, declare,
                                                     describe, policy_for)
from attention_conformance.backends import rules
from attention_conformance.backends.numpy import NumpyBackend
from attention_conformance.checking.verdict import verdict_of
from attention_conformance.golden.store import GoldenStore
from attention_conformance.model.folder import default_folder
from attention_conformance.model.policies import CONDITIONS
from attention_conformance.reports.markdown import when_text

from _real_spec import real_spec

WINDOW_UNIFORM = [{"when": {"window": True}, "policy": {"fully_masked_rows": "uniform"}}]


class UniformUnderWindow(NumpyBackend):
    """NumPy, except that a query a window leaves without keys attends uniformly (what a
    kernel that builds its window mask as a finite fill does): zeros otherwise."""

    policy_when = WINDOW_UNIFORM

    def sdpa(self, q, k, v, *, window=None, **kw):
        out = super().sdpa(q, k, v, window=window, **kw)
        if window is None:
            return out
        seen = rules.allowed(q.shape[-2], k.shape[-2], kw.get("causal"), window)
        empty = ~seen.any(axis=-1)
        return np.where(empty[:, None], v.astype(out.dtype).mean(axis=-2, keepdims=True), out)


def _verdict(backend, case_id):
    case = next(c for c in real_spec().cases if c.id == case_id)
    return verdict_of(InProcess(backend), case, case.variants[0], "float64",
                      GoldenStore.of(default_folder()))["status"]


@pytest.mark.parametrize("case_id", ["policies-empty-window-sdpa", "policies-empty-window-causal-sdpa",
                                     "policies-fully-masked-mask-sdpa"])
def test_the_judge_picks_the_branch_the_condition_names(case_id):
    assert _verdict(UniformUnderWindow(), case_id) == "pass"


@pytest.mark.parametrize("wrong", [
    [{"when": {"mask": True}, "policy": {"fully_masked_rows": "uniform"}}],
    [{"when": {"window": True, "causal": True}, "policy": {"fully_masked_rows": "uniform"}}],
    []])
def test_a_wrong_condition_makes_the_right_case_fail(wrong):
    backend = UniformUnderWindow()
    backend.policy_when = wrong
    assert _verdict(backend, "policies-empty-window-sdpa") == "fail"


def test_the_first_rule_naming_a_policy_wins_and_conditions_read_the_call():
    backend = NumpyBackend()
    backend.policy_when = [
        {"when": {"causal": "bottom_right", "single_query": True},
         "policy": {"masked_key_nan": "per_row"}},
        {"when": {"bias": True, "ops": ["sdpa", "sdpa_vjp"]},
         "policy": {"fully_masked_rows": "uniform", "masked_key_nan": "propagates"}}]
    declared = declare(backend)
    one_query = {"q": (2, 1, 8), "k": (2, 5, 8), "v": (2, 5, 8), "bias": (1, 5)}
    chosen = policy_for(declared, "sdpa", one_query, {"causal": "bottom_right"})
    assert chosen["masked_key_nan"] == "per_row" and chosen["fully_masked_rows"] == "uniform"
    chosen = policy_for(declared, "sdpa", dict(one_query, q=(2, 3, 8)), {"causal": "bottom_right"})
    assert chosen["masked_key_nan"] == "propagates"
    assert policy_for(declared, "attention_weights", one_query, {}) == backend.policy
    assert policy_for(declared, "sdpa") == backend.policy      # no call: policy alone


def test_it_travels_to_reports_and_across_the_process_boundary():
    declared = declare(UniformUnderWindow())
    assert Declaration.from_dict(declared.as_dict()) == declared
    assert describe(declared)["policy_when"] == WINDOW_UNIFORM
    assert "policy_when" not in describe(declare(NumpyBackend()))
    assert when_text({"causal": True, "mask": False, "ops": ["sdpa"]}) == \
        "causal, not mask, ops in sdpa"


def test_every_condition_is_documented():
    text = (Path(__file__).resolve().parents[2] / "docs" / "interface.md").read_text()
    assert [name for name in CONDITIONS if f"| `{name}` |" not in text] == []


@pytest.mark.parametrize("value, message", [
    ({"when": {"window": True}}, "policy_when must be a list"),
    ([{"when": {"window": True}}], "policy_when[0] must be {'when'"),
    ([{"when": {}, "policy": {"fully_masked_rows": "nan"}}], "both non-empty"),
    ([{"when": {"windowed": True}, "policy": {"fully_masked_rows": "nan"}}],
     "policy_when[0]: unknown condition 'windowed'"),
    ([{"when": {"window": 1}, "policy": {"fully_masked_rows": "nan"}}],
     "condition window must be true or false"),
    ([{"when": {"causal": "top"}, "policy": {"fully_masked_rows": "nan"}}],
     "condition causal must be true, false, or one of top_left, bottom_right"),
    ([{"when": {"ops": ["attention"]}, "policy": {"fully_masked_rows": "nan"}}],
     "condition ops must be a non-empty list of op names"),
    ([{"when": {"bias": True}, "policy": {"fully_masked_rows": "none"}}],
     "policy_when[0] fully_masked_rows='none' is not one of"),
])
def test_a_bad_policy_when_is_a_declaration_problem(value, message):
    backend = NumpyBackend()
    backend.policy_when = value
    problems = declaration_problems(backend)
    assert any(message in p for p in problems), problems
    data = {**declare(NumpyBackend()).as_dict(), "policy_when": value}
    with pytest.raises(ValueError, match="not a declaration"):
        Declaration.from_dict(data)


@pytest.mark.parametrize("notes, message", [
    ({"float64": ""}, "dtype_notes must be a dict"),
    ({"float128": "no such dtype"}, "dtype_notes names unknown dtype 'float128'"),
    ({"float32": "declared and explained"}, "dtype_notes explains 'float32', which dtypes declares"),
])
def test_bad_dtype_notes_are_a_declaration_problem(notes, message):
    backend = NumpyBackend()
    backend.dtypes = frozenset({"float32"})
    backend.dtype_notes = notes
    assert any(message in p for p in declaration_problems(backend))


def test_dtype_notes_reach_the_report():
    backend = NumpyBackend()
    backend.dtypes = frozenset({"float32"})
    backend.dtype_notes = {"float64": "computed in float32"}
    assert not declaration_problems(backend)
    assert describe(declare(backend))["dtype_notes"] == {"float64": "computed in float32"}


def test_a_dtype_left_out_is_unsupported_with_its_note():
    """The tests of a dtype in dtype_notes are unsupported with the note as the reason."""
    from attention_conformance.checking.verdict import run_case
    from attention_conformance.model.errors import Unsupported
    from attention_conformance.specs.loader import load_spec

    backend = NumpyBackend()
    backend.dtypes = frozenset({"float32"})
    backend.dtype_notes = {"float64": "computed in float32"}
    case = next(c for c in load_spec().cases if "float64" in c.dtypes)
    with pytest.raises(Unsupported, match="backend does not declare dtype float64: "
                                          "computed in float32"):
        run_case(InProcess(backend), case, case.variants[0], "float64", GoldenStore())
