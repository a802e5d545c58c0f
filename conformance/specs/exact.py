"""A case's `exact` values held against the float64 reference, by the checker's own rule
(checking/expectations.py's exact_mismatches): a value the reference does not give is a
spec problem, found by `golden regenerate` and `golden check`, never a failure blamed on
every backend. Only the quick cases are held (the commands compute their golden data
anyway); a long or scale case's reference is too costly to compute here."""

from __future__ import annotations

from ..checking.comparison import digits
from ..checking.context import Context
from ..checking.expectations import exact_mismatches
from ..golden.compute import compute, rounded_inputs
from ..model.case import frozen
from ..model.dtypes import output_dtype, round_to
from .yaml_reader import SpecError


def exact_problems(cases, tolerances) -> list[SpecError]:
    """One SpecError for each `exact` target of a quick case that the reference, rounded
    to the output's dtype, does not hold, at the first variant and dtype that shows it."""
    return [problem for case in cases if frozen(case) for problem in _case_problems(case, tolerances)]


def _case_problems(case, tolerances) -> list[SpecError]:
    problems = []
    for policy, exact, raw in _outcomes(case):
        found = _mismatches(case, tolerances, policy, exact)
        problems += [SpecError(case.file, _line(raw, text, case.line), case.id, found[text])
                     for text in exact if text in found]
    return problems


def _outcomes(case):
    """(policy or None, exact entries, their YAML mapping, for its lines) of every outcome
    of the case that states exact values."""
    expect, raw = case.expect, _get(case.raw, "expect")
    if expect.get("exact"):
        yield None, expect["exact"], _get(raw, "exact")
    for name, choices in expect.get("policy", {}).items():
        for choice, outcome in choices.items():
            if outcome.get("exact"):
                branch = _get(_get(_get(raw, "policy"), name), choice)
                yield (name, choice), outcome["exact"], _get(branch, "exact")


def _get(mapping, key):
    return mapping.get(key) if isinstance(mapping, dict) else None


def _line(raw, text, default) -> int:
    """The line of an exact target's key (the case's own line when not known)."""
    return getattr(raw, "key_lines", {}).get(text, default)


def _mismatches(case, tolerances, policy, exact) -> dict[str, str]:
    """target -> what the reference gives in place of its stated value, at the first
    variant and dtype where they differ (a target that holds in every one: absent)."""
    found = {}
    for variant in case.variants:
        for dtype in case.dtypes:
            left = {text: value for text, value in exact.items() if text not in found}
            if not left:
                return found
            ctx = _reference_context(case, variant, dtype, tolerances, policy)
            for text, where, got, want in exact_mismatches(ctx, left):
                n = digits(dtype)
                test = f"{variant.label}-{dtype}" if variant.label else dtype
                label = f" under {policy[0]}={policy[1]}" if policy else ""
                found[text] = (f"exact {text!r}{label}: the float64 reference gives "
                               f"{got:.{n}g} at {where} of the selection [{test}], the case "
                               f"states {want:.{n}g}")
    return found


def _reference_context(case, variant, dtype, tolerances, policy) -> Context:
    """A Context whose outputs are the reference's (under `policy`), rounded to each
    output's dtype: what a right backend returns, with no policy of its own declared."""
    inputs = rounded_inputs(case, variant, dtype)
    outputs = {name: round_to(gold, output_dtype(dtype, name, case.params))
               for name, (gold, _) in compute(case, variant, dtype, tolerances, policy).items()}
    return Context(None, case, variant, dtype, inputs, inputs, outputs, None, tolerances,
                   _policy={})
