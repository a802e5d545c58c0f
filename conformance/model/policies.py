"""The behaviours the specification leaves to the implementation: one table.

Each backend declares one choice per policy; a case may expect a different outcome per
choice (docs/interface.md says what each choice means for every op, sdpa_vjp included).
"""

from __future__ import annotations

from dataclasses import dataclass


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
)}

#: policies that set how golden data are compared rather than what a case expects
TOLERANCE_POLICIES = ("accumulation",)

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
