"""Running one case variant in one dtype on one backend, and judging the result."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .checks_static import output_shapes
from .dtypes import dtype_name, numpy_dtype, round_to
from .golden import GoldenError, GoldenStore, rounded_inputs
from .indexing import parse_index, split_target
from .interface import OPERATIONS, OUTPUTS


class Unsupported(Exception):
    """The backend does not support this case (NotImplementedError, or dtype not declared)."""


class CheckFailure(AssertionError):
    """The backend's result breaks an expectation of the case."""


@dataclass
class Result:
    """What a case variant produced on a backend, for reports."""

    worst_ratio: float = 0.0          # largest error / tolerance over golden comparisons
    failures: list = field(default_factory=list)


@dataclass
class Context:
    """Everything a check needs about one run."""

    backend: object
    case: object
    variant: object
    dtype: str
    arrays: dict            # inputs as given to the backend (dtype-cast)
    exact_inputs: dict      # the same inputs in float64
    outputs: dict           # output name -> backend result as float64
    golden: GoldenStore

    @property
    def params(self):
        return self.case.params

    def call(self, arrays=None, op=None, **params):
        """Call the backend again (metamorphic properties), returning float64 outputs."""
        op = op or self.case.op
        merged = dict(self.case.params if op == self.case.op else {}, **params)
        arrays = arrays or self.arrays
        before = _snapshot(arrays)
        try:
            raw = call_backend(self.backend, op, arrays, merged)
        except NotImplementedError as exc:   # the case cannot be judged on this backend
            raise Unsupported(f"a check of this case calls {op}, which the backend does "
                              f"not support here: {exc or type(exc).__name__}") from None
        _unchanged(before, arrays)
        return [np.asarray(r, dtype=np.float64) for r in raw]

    def cast(self, array):
        """A float64 array as the backend receives it (the case dtype; bool unchanged)."""
        array = np.asarray(array)
        return array if array.dtype == bool else array.astype(numpy_dtype(self.dtype))


def cast_inputs(exact_inputs: dict, dtype: str) -> dict:
    return {n: a if a.dtype == bool else a.astype(numpy_dtype(dtype))
            for n, a in exact_inputs.items()}


def call_backend(backend, op, arrays, params):
    """Call op with positional inputs in interface order; always a tuple of outputs."""
    positional = [arrays[name] for name in OPERATIONS[op]]
    keywords = {n: a for n, a in arrays.items() if n not in OPERATIONS[op]}
    method = getattr(backend, op, None)
    if method is None:
        raise NotImplementedError(f"backend has no method {op!r}")
    result = method(*positional, **keywords, **params)
    if len(OUTPUTS[op]) == 1:
        return (result,)
    if not isinstance(result, (tuple, list)) or len(result) != len(OUTPUTS[op]):
        raise CheckFailure(f"{op} must return a tuple {OUTPUTS[op]}, got {type(result).__name__}")
    return tuple(result)


def _validate_output(name, value, shape, dtype) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise CheckFailure(f"output {name} is a {type(value).__module__}.{type(value).__name__},"
                           " not a NumPy array (convert it back in the adapter)")
    if value.shape != tuple(shape):
        raise CheckFailure(f"output {name} has shape {value.shape}, expected {tuple(shape)}")
    if dtype_name(value.dtype) != dtype:
        raise CheckFailure(f"output {name} has dtype {value.dtype}, expected {dtype}")
    return value.astype(np.float64)


def _snapshot(arrays: dict) -> dict:
    """Each input's bytes, shape and dtype, to find a backend that writes into its inputs
    (bytes compare bitwise in C: NaN equals itself, and nothing is copied twice)."""
    return {n: (a.tobytes(), a.shape, a.dtype) for n, a in arrays.items()}


def _unchanged(before: dict, after: dict) -> None:
    for name, (data, shape, dtype) in before.items():
        now = after[name]
        if now.shape != shape or now.dtype != dtype or now.tobytes() != data:
            original = np.frombuffer(data, dtype=dtype).reshape(shape)
            raise CheckFailure(f"the backend wrote into its input array {name!r}"
                               f"{_first_change(original, now)}; inputs must not be modified")


def _first_change(original, now) -> str:
    if now.shape != original.shape:
        return f" (its shape changed from {original.shape} to {now.shape})"
    same = (original == now) | (np.isnan(original) & np.isnan(now)) if original.dtype != bool \
        else original == now
    changed = np.argwhere(~same)
    if not changed.size:
        return " (only its bits changed: a NaN payload, the sign of a zero or its dtype)"
    where = tuple(int(i) for i in changed[0])
    return f" (first change at {list(where)}: {original[where]} became {now[where]})"


def run_case(backend, case, variant, dtype, golden: GoldenStore) -> Result:
    """Run and judge; raises Unsupported or CheckFailure, returns Result on a pass."""
    if dtype not in set(getattr(backend, "dtypes", ())):
        raise Unsupported(f"backend does not declare dtype {dtype}")
    exact_inputs = rounded_inputs(case, variant, dtype)
    arrays = cast_inputs(exact_inputs, dtype)
    before = _snapshot(arrays)
    try:
        raw = call_backend(backend, case.op, arrays, case.params)
    except NotImplementedError as exc:
        raise Unsupported(str(exc) or type(exc).__name__) from None
    _unchanged(before, arrays)
    shapes = output_shapes(case.op, {n: a.shape for n, a in arrays.items()}, case.params)
    outputs = {name: _validate_output(name, value, shape, dtype)
               for name, value, shape in zip(OUTPUTS[case.op], raw, shapes)}
    ctx = Context(backend, case, variant, dtype, arrays, exact_inputs, outputs, golden)
    return judge(ctx)


def judge(ctx: Context) -> Result:
    from .checks import check_outcome, check_statistics, policy_outcome

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
        ratio = check(*args)
        result.worst_ratio = max(result.worst_ratio, ratio or 0.0)
    except CheckFailure as exc:
        result.failures.append(str(exc))
    except GoldenError as exc:
        result.failures.append(f"golden data: {exc}")


def worst_error(actual: np.ndarray, expected: np.ndarray):
    """(largest abs error, its index) over finite positions; NaN/inf must match exactly."""
    if actual.size and np.isfinite(actual).all() and np.isfinite(expected).all():
        diff = np.abs(actual - expected)
        index = np.unravel_index(int(np.argmax(diff)), diff.shape)
        return float(diff[index]), tuple(int(i) for i in index), ""
    nan_a, nan_e = np.isnan(actual), np.isnan(expected)
    if not np.array_equal(nan_a, nan_e):
        where = np.argwhere(nan_a != nan_e)[0]
        return np.inf, tuple(int(i) for i in where), "NaN pattern differs"
    inf_a, inf_e = np.isinf(actual), np.isinf(expected)
    if not np.array_equal(actual[inf_a | inf_e], expected[inf_a | inf_e]) or \
            not np.array_equal(inf_a, inf_e):
        where = np.argwhere(inf_a != inf_e)
        where = where[0] if where.size else np.argwhere(inf_a)[0]
        return np.inf, tuple(int(i) for i in where), "inf pattern differs"
    diff = np.where(np.isfinite(expected), np.abs(actual - expected), 0.0)
    if diff.size == 0:
        return 0.0, (), ""
    index = np.unravel_index(int(np.argmax(diff)), diff.shape)
    return float(diff[index]), tuple(int(i) for i in index), ""


def exact_value(ctx: Context, value, shape):
    """The expected exact value of a spec 'exact' entry, rounded to the case dtype."""
    if isinstance(value, dict):
        source = ctx.exact_inputs[value["input"]][parse_index(value.get("at", "[...]"))]
        return np.broadcast_to(source, shape)
    return np.broadcast_to(round_to(np.array(value, dtype=np.float64), ctx.dtype), shape)


def target(ctx: Context, text: str):
    output, index = split_target(text, OUTPUTS[ctx.case.op][0])
    return output, index, ctx.outputs[output][index]

