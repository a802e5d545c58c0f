"""The expectations of a case: golden, exact, properties, statistic, policy."""

from __future__ import annotations

import numpy as np

from .golden import GoldenError
from .properties import PROPERTIES
from .runner import CheckFailure, Context, exact_value, target, worst_error
from .statistics import STATISTICS
from .tolerances import load_tolerances


def check_golden(ctx: Context, policy=None) -> float:
    """Compare every output with its golden; return the worst error / tolerance."""
    tolerances = load_tolerances()
    worst = 0.0
    problems = []
    entries = ctx.golden.get(ctx.case, ctx.variant, ctx.dtype, policy)
    for name, (gold, plain_error) in entries.items():
        actual = ctx.outputs[name]
        tol = tolerances.output(ctx.dtype, plain_error, gold)
        error, index, pattern = worst_error(actual, gold)
        ratio = error / tol if tol > 0 else (0.0 if error == 0 else np.inf)
        worst = max(worst, ratio)
        if ratio > 1:
            problems.append(
                f"golden {name}{_policy_label(policy)}: "
                + (f"{pattern} at {list(index)} " if pattern else
                   f"worst abs error {error:.3g} at {list(index)} ")
                + f"(got {actual[index]:.6g}, expected {gold[index]:.6g}); "
                f"tolerance {tol:.3g} = {tolerances.multiplier:g} x max(plain {ctx.dtype}"
                f" error {plain_error:.3g}, u x max|golden|)")
    if problems:
        raise CheckFailure("\n".join(problems))
    return worst


def _policy_label(policy):
    return f" under {policy[0]}={policy[1]}" if policy else ""


def check_exact(ctx: Context, exact: dict, policy=None) -> None:
    problems = []
    for text, value in exact.items():
        _, _, actual = target(ctx, text)
        expected = exact_value(ctx, value, np.shape(actual))
        same = np.array_equal(actual, expected, equal_nan=True)
        if not same:
            bad = np.argwhere(~((actual == expected) | (np.isnan(actual) & np.isnan(expected))))
            where = tuple(int(i) for i in bad[0]) if bad.size else ()
            problems.append(
                f"exact {text}{_policy_label(policy)}: got {np.asarray(actual)[where].tolist()!r} "
                f"at {list(where)} of the selection, expected exactly "
                f"{np.asarray(expected)[where].tolist()!r}")
    if problems:
        raise CheckFailure("\n".join(problems))


def check_properties(ctx: Context, properties, policy=None) -> None:
    problems = []
    for prop in properties:
        name, args = (prop, {}) if isinstance(prop, str) else next(iter(prop.items()))
        try:
            PROPERTIES[name](ctx, **args)
        except CheckFailure as exc:
            problems.append(f"property {name}{_policy_label(policy)}: {exc}")
    if problems:
        raise CheckFailure("\n".join(problems))


def check_outcome(ctx: Context, outcome: dict, policy=None) -> float:
    ratio = 0.0
    problems = []
    for run in (_golden_part, _exact_part, _properties_part):
        try:
            ratio = max(ratio, run(ctx, outcome, policy))
        except CheckFailure as exc:
            problems.append(str(exc))
        except GoldenError as exc:      # the other parts are still checked
            problems.append(f"golden data: {exc}")
    if problems:
        raise CheckFailure("\n".join(problems))
    return ratio


def _golden_part(ctx, outcome, policy):
    return check_golden(ctx, policy) if outcome.get("golden") else 0.0


def _exact_part(ctx, outcome, policy):
    if outcome.get("exact"):
        check_exact(ctx, outcome["exact"], policy)
    return 0.0


def _properties_part(ctx, outcome, policy):
    if outcome.get("properties"):
        check_properties(ctx, outcome["properties"], policy)
    return 0.0


def policy_outcome(ctx: Context, policies: dict) -> float:
    """Check the outcome the case expects under the backend's declared choice."""
    ratio = 0.0
    declared = getattr(ctx.backend, "policy", {}) or {}
    for name, choices in policies.items():
        choice = declared.get(name)
        if choice is None:
            raise CheckFailure(f"policy {name}: the backend declares no choice "
                               f"(the case allows {', '.join(choices)})")
        if choice not in choices:
            raise CheckFailure(f"policy {name}: the backend declares {choice!r}, which this "
                               f"case does not allow ({', '.join(choices)})")
        ratio = max(ratio, check_outcome(ctx, choices[choice], (name, choice)))
    return ratio


def check_statistics(ctx: Context, statistics) -> float:
    problems = []
    for stat in statistics:
        value = STATISTICS[stat["name"]](ctx, stat.get("output"))
        low, high = stat["expected"] - stat["band"], stat["expected"] + stat["band"]
        if not (low <= value <= high):
            problems.append(f"statistic {stat['name']} = {value:.6g}, expected "
                            f"{stat['expected']:g} +/- {stat['band']:g} ({stat['why']})")
    if problems:
        raise CheckFailure("\n".join(problems))
    return 0.0
