"""The behaviours the specification leaves to the implementation: one table.

Each backend declares one choice per policy; a case may expect a different outcome per
choice (docs/interface.md says what each choice means for every op, sdpa_vjp included).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .ops import CAUSAL_ALIGNMENTS, OPS


@dataclass(frozen=True)
class Policy:
    name: str
    choices: tuple[str, ...]
    meaning: str                 # what the policy is about, for reports
    reference_default: str       # the float64 reference's choice when a case names none
    #: choices that leave the positions the policy is about free: a golden under such a
    #: choice is not compared there (conformance/checking/expectations.py, docs/interface.md)
    unchecked: tuple[str, ...] = ()


POLICY_TABLE: dict[str, Policy] = {p.name: p for p in (
    Policy("fully_masked_rows", ("zeros", "uniform", "nan"),
           "query whose every key is masked (boolean mask, causal or window)", "zeros"),
    Policy("neg_inf_bias_rows", ("zeros", "uniform", "nan"),
           "query whose every key has a -inf additive bias", "nan"),
    Policy("masked_key_nan", ("ignored", "propagates", "per_row"),
           "NaN stored in a masked-out key", "ignored"),
    Policy("masked_value_nan", ("ignored", "propagates"),
           "NaN stored in a masked-out value", "ignored"),
    # not an outcome of a case but the golden comparison's tolerance tier; a backend
    # that declares none is judged in the input tier (spec/tolerances.yaml)
    Policy("accumulation", ("float32", "input"),
           "float16 / bfloat16 products and sums accumulate in float32 or in the input dtype",
           "input"),
    Policy("padded_query_rows", ("zeros", "unspecified"),
           "query at or past its batch element's q_lengths (padding)", "zeros",
           unchecked=("unspecified",)),
    # not an outcome of a case but the base the backend's lse are in (those it returns
    # and those it takes): the golden data of the ops of LSE_OPS are kept in each base
    Policy("lse_base", ("e", "2"),
           "the base of every log-sum-exp the backend returns and takes (e: ln, 2: log2)", "e"),
)}

#: policies that set how golden data are compared rather than what a case expects
TOLERANCE_POLICIES = ("accumulation",)
#: policies that say how the backend writes a value rather than what a case expects: a
#: case gives no outcome for them, and the golden data of these ops are kept per choice
CONVENTION_POLICIES: dict[str, tuple[str, ...]] = {"lse_base": ("sdpa_lse", "merge_states")}

#: name -> its choices
POLICIES: dict[str, tuple[str, ...]] = {n: p.choices for n, p in POLICY_TABLE.items()}
#: name -> what it is about
POLICY_MEANING: dict[str, str] = {n: p.meaning for n, p in POLICY_TABLE.items()}
#: name -> the reference's choice when a case names none
DEFAULT_POLICIES: dict[str, str] = {n: p.reference_default for n, p in POLICY_TABLE.items()}

#: policy -> {choice: the choice whose golden it is judged against, row by row}. Under
#: such a choice every row of every output (all axes but the last) is either that
#: choice's result or NaN in every element: what a kernel that skips masked tiles gives
#: (a NaN reaches the rows whose visited tiles held it, and no other row). A case needs
#: no branch of its own for it; the other choice's golden serves.
ROW_BY_ROW: dict[str, dict[str, str]] = {"masked_key_nan": {"per_row": "ignored"}}


@dataclass(frozen=True)
class Condition:
    """A fact of one call that a conditional declaration (`policy_when`) may name."""
    name: str
    values: str                  # what the declaration gives: "bool", "ops" or "causal"
    meaning: str
    #: (op, input shapes by name, params) -> the call's value, compared with the declared one
    of_call: Callable


def _has(name):
    return lambda op, shapes, params: name in shapes


def _causal(op, shapes, params):
    return params.get("causal") or False


def _single_query(op, shapes, params):
    sides = OPS[op].query_side if op in OPS else ()
    return bool(sides) and sides[0] in shapes and len(shapes[sides[0]]) >= 2 \
        and shapes[sides[0]][-2] == 1


#: the closed vocabulary of `policy_when` (docs/interface.md, "Policies by condition")
CONDITIONS: dict[str, Condition] = {c.name: c for c in (
    Condition("ops", "ops", "the call is of one of these ops", lambda op, shapes, params: op),
    Condition("mask", "bool", "a boolean mask is given", _has("mask")),
    Condition("bias", "bool", "a float bias is given", _has("bias")),
    Condition("sink", "bool", "a sink (attention-sink logit per head) is given", _has("sink")),
    Condition("causal", "causal", "causal is set (true, false, or an alignment)", _causal),
    Condition("window", "bool", "a sliding window is set",
              lambda op, shapes, params: params.get("window") is not None),
    Condition("lengths", "bool", "per-batch q_lengths or kv_lengths are given",
              lambda op, shapes, params: any(params.get(k) is not None
                                             for k in ("q_lengths", "kv_lengths"))),
    Condition("single_query", "bool", "the call has one query (Lq = 1: decode)", _single_query),
)}


def condition_holds(name: str, wanted, op: str, shapes: dict, params: dict) -> bool:
    """Whether the call (op, input shapes, params) meets one condition of a declaration."""
    value = CONDITIONS[name].of_call(op, shapes, params)
    if name == "ops":
        return value in wanted
    if name == "causal" and isinstance(wanted, bool):
        return bool(value) == wanted
    return value == wanted


def condition_problem(name: str, wanted) -> str | None:
    """What is wrong with one declared condition, or None."""
    if name not in CONDITIONS:
        return f"unknown condition {name!r}; known: {', '.join(CONDITIONS)}"
    kind = CONDITIONS[name].values
    if kind == "ops":
        if not isinstance(wanted, (list, tuple)) or not wanted \
                or any(op not in OPS for op in wanted):
            return f"condition ops must be a non-empty list of op names, not {wanted!r}"
    elif kind == "causal":
        if not isinstance(wanted, bool) and wanted not in CAUSAL_ALIGNMENTS:
            return f"condition causal must be true, false, or one of {', '.join(CAUSAL_ALIGNMENTS)}, " \
                   f"not {wanted!r}"
    elif not isinstance(wanted, bool):
        return f"condition {name} must be true or false, not {wanted!r}"
    return None

