"""The expectations of a case, judged on one run: golden, exact, close, properties, statistic,
and the outcome under the backend's declared policy. check_case() runs them all and raises
one CheckFailure that lists every broken expectation."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from .comparison import compare, digits
from .context import Context
from ..model.dtypes import output_dtype, round_to
from ..golden import sampled
from ..model.case import memo
from ..model.indexing import parse_index, split_target
from ..model.ops import OPS
from ..model.errors import CheckFailure
from ..model.policies import CONVENTION_POLICIES, DEFAULT_POLICIES, POLICY_TABLE, ROW_BY_ROW
from .properties import CALLS_BACKEND, PROPERTIES, property_entry
from ..golden.reference import key_nan_columns, padded_queries
from .statistics import STATISTICS


@dataclass
class Result:
    """What a case variant produced on a backend, for reports."""

    worst_ratio: float = 0.0          # largest error / tolerance over golden comparisons
    failures: list = field(default_factory=list)


def _policy_label(policy):
    return f" under {policy[0]}={policy[1]}" if policy else ""


def declared_policy(ctx: Context) -> dict[str, str]:
    """The backend's choices for this call (Context.declared_policy)."""
    return ctx.declared_policy()


def accumulation(ctx: Context) -> str:
    """The backend's declared accumulation tier for this call (`input` when it declares none)."""
    return ctx.declared_policy().get("accumulation") or "input"


def convention(ctx: Context):
    """(policy, choice) of the backend's declared convention that this op's golden data
    depend on, when it is not the reference's default (lse_base 2), else None."""
    for name, ops in CONVENTION_POLICIES.items():
        if ctx.case.op in ops:
            choice = ctx.declared_policy().get(name)
            if choice and choice != DEFAULT_POLICIES[name]:
                return name, choice
    return None


def _golden(ctx: Context, policy, tier) -> dict:
    """output -> (golden, plain error) in the tier and the declared convention; a store
    that knows one tier only (a golden source of its own with get(case, variant, dtype,
    policy)) serves the input one."""
    extra = {"accumulation": tier} if tier == "float32" else {}
    chosen = convention(ctx)
    if chosen:
        extra["convention"] = chosen
    return ctx.golden.get(ctx.case, ctx.variant, ctx.dtype, policy, **extra)


def unchecked_positions(ctx: Context, name: str, shape, policy=None):
    """Boolean (broadcastable to the output) of the positions a golden is not compared at
    under `policy`, or None: a choice of the policy's `unchecked` leaves them free. For
    padded_query_rows: unspecified, the rows of padded queries (i >= q_lengths[b]) of the
    query-side outputs (`out` of attention_weights and sdpa, `dq` of sdpa_vjp)."""
    if not policy or policy[1] not in POLICY_TABLE[policy[0]].unchecked:
        return None
    q_lengths = ctx.case.params.get("q_lengths")
    if policy[0] != "padded_query_rows" or q_lengths is None or name not in ("out", "dq"):
        return None
    return padded_queries(tuple(shape), q_lengths)


def sampled_positions(ctx: Context, name: str, policy=None):
    """(indices, length) of the query rows (key columns of dk and dv) at which a sampled
    golden checks output `name` (golden/sampled.py), or None: every row."""
    if policy is not None or not sampled.is_sampled(ctx.case.expect):
        return None
    return sampled.positions_for(ctx.case, ctx.variant, name, ctx.exact_inputs)


def _at_rows(result, name, ndim, rows):
    """A comparison of sampled rows (or columns), its index named in the output's own."""
    if rows is None or not result.index:
        return result
    index = list(result.index)
    axis = sampled.row_axis(name, ndim)
    index[axis] = int(rows[index[axis]])
    return dataclasses.replace(result, index=tuple(index))


def plain_key_nan(ctx: Context, name: str, policy=None):
    """key_nan_allowed() of this test's call."""
    return key_nan_allowed(ctx.case.op, name, ctx.arrays, ctx.params, policy)


def key_nan_allowed(op: str, name: str, arrays: dict, params: dict, policy=None):
    """Boolean of the dq positions where NaN stands for the golden, or None: unless the
    golden is masked_key_nan's `propagates`, a dq element that a plain dS K fills with
    0 * NaN from a key its row does not read (reference.key_nan_columns)."""
    k = arrays.get("k")
    if op != "sdpa_vjp" or name != "dq" or k is None \
            or np.all(np.isfinite(np.asarray(k, dtype=np.float64))) \
            or policy == ("masked_key_nan", "propagates"):
        return None
    return key_nan_columns(arrays["q"], k, mask=arrays.get("mask"), **params)


def check_golden(ctx: Context, policy=None) -> float:
    """Compare every output with its golden; return the worst error / tolerance.

    Positions that the policy choice leaves free (unchecked_positions) take the golden's
    value before the comparison; every other position is compared as usual. A sampled
    golden compares its rows (or key columns) alone, and its message names them."""
    rule = ctx.tolerances
    worst, problems = 0.0, []
    tier = accumulation(ctx)
    for name, (gold, plain_error) in _golden(ctx, policy, tier).items():
        actual = ctx.outputs[name]
        positions = sampled_positions(ctx, name, policy)
        rows = None if positions is None else positions[0]
        free = unchecked_positions(ctx, name, np.shape(actual), policy)
        if free is not None:
            actual = np.where(free, gold, actual)
        ndim = np.ndim(actual)
        if rows is not None:
            actual = sampled.select(actual, name, rows)
        result = _at_rows(compare(actual, gold, rule.output(ctx.dtype, plain_error, gold),
                                  plain_key_nan(ctx, name, policy)), name, ndim, rows)
        worst = max(worst, result.ratio)
        if not result.ok:
            problems.append(
                f"golden {name}{_policy_label(policy)}: {result.describe(ctx.dtype)}"
                + ("" if rows is None else f" (of {sampled.describe(name, *positions)})")
                + ("" if result.pattern else
                   f"; tolerance {result.tolerance:.3g} = {rule.multiplier:g} x max(plain"
                   f" {ctx.dtype} error {plain_error:.3g}"
                   + (", float32 accumulation" if tier == "float32"
                      and ctx.dtype in ("float16", "bfloat16") else "")
                   + ", u x max|golden|)"))
    if problems:
        raise CheckFailure("\n".join(problems))
    return worst


def exact_value(ctx: Context, value, shape, output=None):
    """The expected exact value of a spec 'exact' entry, rounded to the dtype of its
    output (model/dtypes.py output_dtype), once per case, dtype and value."""
    if isinstance(value, dict):
        source = ctx.exact_inputs[value["input"]][parse_index(value.get("at", "[...]"))]
        return np.broadcast_to(source, shape)
    dtype = output_dtype(ctx.dtype, output, ctx.params)
    return np.broadcast_to(memo(ctx.case, ("exact", dtype, repr(value)),
                                lambda: _read_only(round_to(np.array(value, np.float64), dtype))),
                           shape)


def _read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


def target(ctx: Context, text: str):
    """(output, index, selected values) of an `exact` key such as ``out[0, :]`` (parsed
    once per case)."""
    output, index = memo(ctx.case, ("target", text),
                         lambda: split_target(text, OPS[ctx.case.op].outputs[0]))
    return output, index, ctx.outputs[output][index]


def exact_mismatches(ctx: Context, exact: dict) -> list[tuple[str, list, float, float]]:
    """(target, position in its selection, value found, value expected) of the first
    position of each `exact` target whose outputs break the exact rule: the value rounded
    to its output's dtype, equal bit for bit, NaN where NaN is stated (an lse in a
    declared base 2, read back x ln 2). check_exact, and the spec's own check of its
    exact values against the float64 reference (specs/exact.py), judge by it."""
    mismatches = []
    for text, value in exact.items():
        output, _, actual = target(ctx, text)
        expected = exact_value(ctx, value, np.shape(actual), output)
        same = _rebased_equal(ctx, output, actual, expected)
        if same is None:
            same = actual == expected
            if np.all(same):
                continue
            same = same | (np.isnan(actual) & np.isnan(expected))   # NaN where NaN is expected
        if not np.all(same):
            bad = np.argwhere(~np.asarray(same))
            where = tuple(int(i) for i in bad[0]) if bad.size else ()
            mismatches.append((text, list(where), float(np.asarray(actual)[where]),
                               float(np.asarray(expected)[where])))
    return mismatches


def check_exact(ctx: Context, exact: dict, policy=None) -> None:
    n = digits(ctx.dtype)
    problems = [f"exact {text}{_policy_label(policy)}: got {got:.{n}g} at {where} of the "
                f"selection, expected exactly {want:.{n}g}"
                + (" (an lse in base 2, read back x ln 2)" if convention(ctx) else "")
                for text, where, got, want in exact_mismatches(ctx, exact)]
    if problems:
        raise CheckFailure("\n".join(problems))


def _rebased_equal(ctx: Context, output: str, actual, expected):
    """For an lse written in a declared base other than e: where the actual value, read
    back as a natural log (x ln 2), equals the expected one (NaN and infinities exactly,
    a finite value within the rule's multiplier of unit roundoffs: the change of base
    rounds once more); None for any other output."""
    if output != "lse":
        return None
    chosen = convention(ctx)
    if not chosen or chosen[0] != "lse_base":
        return None
    natural = np.asarray(actual) * math.log(2.0)
    finite = np.isfinite(expected)
    slack = ctx.tolerances.multiplier * ctx.tolerances.unit_roundoff[ctx.dtype] * np.abs(expected)
    with np.errstate(invalid="ignore"):
        near = np.abs(natural - expected) <= slack
    return np.where(finite, near & np.isfinite(natural),
                    (natural == expected) | (np.isnan(natural) & np.isnan(expected)))


def close_tolerance(value, dtype, rule, entry) -> float:
    """The absolute tolerance of a `close` entry: its `atol`, or half a unit in the last
    written digit of the largest |value| plus the rule's rounding of it in the dtype."""
    if "atol" in entry:
        return float(entry["atol"])
    largest = float(np.max(np.abs(value), initial=0.0))
    exponent = math.floor(math.log10(largest)) if largest > 0 else 0
    written = 0.5 * 10.0 ** (exponent - entry["digits"] + 1)
    return written + rule.multiplier * rule.unit_roundoff[dtype] * largest


def check_close(ctx: Context, close: dict, policy=None) -> None:
    """Each `close` target within its tolerance of its value (docs/writing-cases.md)."""
    problems = []
    n = digits(ctx.dtype)
    for text, entry in close.items():
        _, _, actual = target(ctx, text)
        value = np.array(entry["value"], dtype=np.float64)
        tolerance = close_tolerance(value, ctx.dtype, ctx.tolerances, entry)
        expected = np.broadcast_to(value, np.shape(actual))
        with np.errstate(invalid="ignore"):
            error = np.abs(np.asarray(actual) - expected)
        bad = ~(error <= tolerance)                     # NaN is never close
        if np.any(bad):
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            got, want = np.asarray(actual)[where], expected[where]
            problems.append(f"close {text}{_policy_label(policy)}: got {float(got):.{n}g} at "
                            f"{list(where)} of the selection, expected {float(want)!r} "
                            f"within {tolerance:.3g}")
    if problems:
        raise CheckFailure("\n".join(problems))


def check_properties(ctx: Context, properties, policy=None) -> None:
    problems = []
    for prop in properties:
        name, args = property_entry(prop)
        try:
            PROPERTIES[name](ctx, **args)
        except CheckFailure as exc:
            problems.append(f"property {name}{_policy_label(policy)}: {exc}")
    if problems:
        raise CheckFailure("\n".join(problems))


def check_outcome(ctx: Context, outcome: dict, policy=None) -> float:
    """Every part of one outcome (golden, exact, properties), each checked even when
    another fails; the worst golden error / tolerance. Golden data missing or broken
    (GoldenError) end the judgement: the test is the suite's error (verdict.py)."""
    ratio, problems = 0.0, []
    for part in (_golden_part, _exact_part, _close_part, _properties_part):
        try:
            ratio = max(ratio, part(ctx, outcome, policy))
        except CheckFailure as exc:     # a GoldenError goes on: the suite's, not a failure
            problems.append(str(exc))
    if problems:
        raise CheckFailure("\n".join(problems))
    return ratio


def _golden_part(ctx, outcome, policy):
    return check_golden(ctx, policy) if outcome.get("golden") else 0.0


def _exact_part(ctx, outcome, policy):
    if outcome.get("exact"):
        check_exact(ctx, outcome["exact"], policy)
    return 0.0


def _close_part(ctx, outcome, policy):
    if outcome.get("close"):
        check_close(ctx, outcome["close"], policy)
    return 0.0


def _properties_part(ctx, outcome, policy):
    if outcome.get("properties"):
        check_properties(ctx, outcome["properties"], policy)
    return 0.0


def check_rows_or_nan(ctx: Context, policy) -> float:
    """Each row of every output (all axes but the last) is either NaN in every element or
    the golden under `policy` (a (name, choice) pair) within its tolerance. Gradients go
    element by element: dq = dS K multiplies a stored NaN by exact zeros, column by
    column, so a NaN there fills only the columns that hold one."""
    rule = ctx.tolerances
    worst, problems = 0.0, []
    by_element = ctx.case.op == "sdpa_vjp"          # the gradients
    for name, (gold, plain_error) in _golden(ctx, policy, accumulation(ctx)).items():
        actual = np.asarray(ctx.outputs[name])
        if actual.ndim == 0:
            actual, gold = actual[None], np.asarray(gold)[None]
        nan = np.isnan(actual)
        whole = nan if by_element else np.all(nan, axis=-1, keepdims=True)
        partial = np.any(nan & ~whole, axis=-1)
        if np.any(partial):
            where = [int(i) for i in np.argwhere(partial)[0]]
            problems.append(f"{name} row {where} is partly NaN ({int(nan[tuple(where)].sum())}"
                            f" of {actual.shape[-1]}): a row is NaN in every element or "
                            f"the {policy[1]} result")
            continue
        kept = np.where(whole, gold, actual)
        result = compare(kept, np.asarray(gold), rule.output(ctx.dtype, plain_error, gold))
        worst = max(worst, result.ratio)
        if not result.ok:
            problems.append(f"{name} (rows without NaN vs the {policy[1]} golden): "
                            f"{result.describe(ctx.dtype)}")
    if problems:
        raise CheckFailure("\n".join(problems))
    return worst


def policy_outcome(ctx: Context, policies: dict) -> float:
    """Check the outcome the case expects under the backend's declared choice."""
    ratio = 0.0
    declared = declared_policy(ctx)
    for name, choices in policies.items():
        choice = declared.get(name)
        if choice is None:
            raise CheckFailure(f"policy {name}: the backend declares no choice "
                               f"(the case allows {', '.join(choices)})")
        base = ROW_BY_ROW.get(name, {}).get(choice)
        if choice not in choices and base in choices and choices[base].get("golden"):
            try:
                ratio = max(ratio, check_rows_or_nan(ctx, (name, base)))
            except CheckFailure as exc:
                raise CheckFailure(f"policy {name}={choice}: {exc}") from None
            continue
        if choice not in choices:
            raise CheckFailure(f"policy {name}: the backend declares {choice!r}, which this "
                               f"case does not allow ({', '.join(choices)})")
        ratio = max(ratio, check_outcome(ctx, choices[choice], (name, choice)))
    return ratio


@dataclass
class _Planning(Context):
    """A Context without outputs whose call() records the call (planned_calls)."""
    planned: list = field(default_factory=list)

    def call(self, arrays=None, op=None, **params):
        self.planned.append(self.request(arrays, op, params))
        return (None, None)             # what the property then does with it fails


def planned_calls(ctx: Context) -> list:
    """The calls the properties of the case (and of the policy the backend declares) will
    make, as (op, arrays, params): each property is run without the outputs, which it
    reads only after its calls (properties.py), so that an isolated backend computes
    them with the test's own first call."""
    if CALLS_BACKEND.isdisjoint(memo(ctx.case, "properties", lambda: named_properties(ctx.case))):
        return []                   # most tests: nothing to plan
    expect, outcomes = ctx.case.expect, [ctx.case.expect]
    declared = ctx.declared_policy() if "policy" in expect else {}
    for name, choices in expect.get("policy", {}).items():
        outcomes.append(choices.get(declared.get(name), {}))
    calling = [entry for outcome in outcomes for entry in map(property_entry,
               outcome.get("properties") or ()) if entry[0] in CALLS_BACKEND]
    if not calling:                 # not under the declared choice
        return []
    planning = _Planning(**{f: getattr(ctx, f) for f in Context.__dataclass_fields__})
    for name, args in calling:
        try:
            PROPERTIES[name](planning, **args)
        except Exception:           # past its calls, it needs the outputs
            pass
    return planning.planned


def named_properties(case) -> frozenset:
    """The names of the properties of every outcome of the case (its expect's and each
    policy choice's)."""
    outcomes = [case.expect] + [outcome for choices in case.expect.get("policy", {}).values()
                                for outcome in choices.values()]
    return frozenset(property_entry(entry)[0] for outcome in outcomes
                     for entry in outcome.get("properties") or ())


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


def check_case(ctx: Context) -> Result:
    """Every expectation of the case; CheckFailure listing each one broken."""
    result = Result()
    expect = ctx.case.expect
    _collect(result, check_outcome, ctx, expect, None)
    if "policy" in expect:
        _collect(result, policy_outcome, ctx, expect["policy"])
    if "statistic" in expect:
        _collect(result, check_statistics, ctx, expect["statistic"])
    if result.failures:
        raise CheckFailure("\n".join(result.failures))
    return result


def _collect(result, check, *args):
    try:
        result.worst_ratio = max(result.worst_ratio, check(*args) or 0.0)
    except CheckFailure as exc:
        result.failures.append(str(exc))
