"""Calling an adapter: inputs in interface order, outputs checked against the contract
(a NumPy array of the expected shape and dtype), inputs that must stay unchanged. The
same in the runner's process (--in-process) and in the backend's own (process/)."""

from __future__ import annotations

import functools
import inspect

import numpy as np

from ..model.dtypes import dtype_name, numpy_dtype, output_dtype
from ..model.ops import OPS, output_shapes, outputs_for
from ..model.errors import BackendRaised, CaseTimeout, CheckFailure, Unsupported


def cast_inputs(exact_inputs: dict, dtype: str, dtypes: dict | None = None) -> dict:
    """float64 inputs as a backend receives them: the case dtype, or each input's own in
    `dtypes` (Case.input_dtypes: mixed dtypes, fp8's descales); bool masks unchanged."""
    dtypes = dtypes or {}
    return {n: a if a.dtype == bool else a.astype(numpy_dtype(dtypes.get(n, dtype)))
            for n, a in exact_inputs.items()}


def unaccepted(method, names) -> list[str]:
    """The names among `names` that method's signature cannot take as keywords: none when
    it takes **kwargs or has no signature to read. A backend written before a param or
    keyword input existed is then unsupported for it, not failed (the interface grows
    compatibly). Read once per function: this runs on every call."""
    function = getattr(method, "__func__", method)
    try:
        accepted = _keywords_taken(function)
    except TypeError:                       # an unhashable callable: read it each time
        accepted = _keywords_taken.__wrapped__(function)
    return [] if accepted is None else [name for name in names if name not in accepted]


@functools.lru_cache(maxsize=256)
def _keywords_taken(function) -> frozenset | None:
    """The keyword names function takes, or None when it takes any (or cannot be read)."""
    try:
        signature = inspect.signature(function, follow_wrapped=False)
    except (TypeError, ValueError):
        return None
    parameters = signature.parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(p.name for p in parameters
                     if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def unaccepted_text(op, missing) -> str:
    return f"the backend's {op} takes no {', '.join(missing)}"


def call_arguments(op, arrays: dict) -> tuple[list, dict]:
    """The inputs as a call passes them: the op's positional ones in interface order, the
    rest (mask, bias, sink, ...) as keywords."""
    positional = OPS[op].positional
    return [arrays[name] for name in positional], \
        {n: a for n, a in arrays.items() if n not in positional}


def invoke(adapter, op, arrays, params):
    """Call the adapter's op with positional inputs in interface order; its raw result.
    Unsupported for an op, keyword or param it lacks (or NotImplementedError);
    BackendRaised for anything else it raises; CheckFailure if it wrote into an input."""
    method = getattr(adapter, op, None)
    if method is None:
        raise Unsupported(f"backend has no method {op!r}")
    positional, keywords = call_arguments(op, arrays)
    missing = unaccepted(method, [*keywords, *params])
    if missing:
        raise Unsupported(unaccepted_text(op, missing))
    before = snapshot(arrays)
    try:
        result = method(*positional, **keywords, **params)
    except (CaseTimeout, KeyboardInterrupt):
        raise
    except NotImplementedError as exc:
        raise Unsupported(str(exc) or type(exc).__name__) from None
    except BaseException as exc:          # SystemExit included: the adapter's, not ours
        raise BackendRaised(exc) from exc
    assert_unchanged(before, arrays)
    return result


def output_tuple(op, arrays, result) -> tuple:
    """An op's result as a tuple of its outputs (CheckFailure if it is not that)."""
    outputs = outputs_for(op, arrays)
    if len(outputs) == 1:
        return (result,)
    if not isinstance(result, (tuple, list)) or len(result) != len(outputs):
        got = type(result).__name__ + (f" of {len(result)}" if isinstance(result, (tuple, list))
                                       else "")
        raise CheckFailure(f"{op} must return a tuple {outputs}, got {got}")
    return tuple(result)


def checked_outputs(op, raw, arrays, params, dtype) -> dict:
    """output name -> float64 copy of each output, after checking type, shape and dtype
    (output_dtype: the case's, float32 for fp8 and for an lse beside half outputs)."""
    shapes = output_shapes(op, {n: a.shape for n, a in arrays.items()}, params)
    return {name: _validated(name, value, shape, output_dtype(dtype, name, params))
            for name, value, shape in zip(outputs_for(op, arrays), raw, shapes)}


def _validated(name, value, shape, dtype) -> np.ndarray:
    if isinstance(value, np.ndarray) and type(value) is not np.ndarray or \
            getattr(value, "subclass", False):
        kind = getattr(value, "type_name", f"{type(value).__module__}.{type(value).__name__}")
        raise CheckFailure(f"output {name} is a {kind}, a subclass of numpy.ndarray; return a "
                           "plain numpy.ndarray (np.asarray(x) in the adapter)")
    if hasattr(value, "type_name"):         # what crossed from the backend's process
        raise CheckFailure(f"output {name} is a {value.type_name}, not a NumPy array"
                           " (convert it back in the adapter)")
    if not isinstance(value, np.ndarray):
        raise CheckFailure(f"output {name} is a {type(value).__module__}.{type(value).__name__},"
                           " not a NumPy array (convert it back in the adapter)")
    if value.shape != tuple(shape):
        raise CheckFailure(f"output {name} has shape {value.shape}, expected {tuple(shape)}")
    if dtype_name(value.dtype) != dtype:
        raise CheckFailure(f"output {name} has dtype {value.dtype}, expected {dtype}")
    return np.array(value, dtype=np.float64, subok=False)


def snapshot(arrays: dict) -> dict:
    """Each input's bytes, shape and dtype, to find a backend that writes into its inputs
    (bytes compare bitwise in C: NaN equals itself, and nothing is copied twice)."""
    return {n: (a.tobytes(), a.shape, a.dtype) for n, a in arrays.items()}


def assert_unchanged(before: dict, after: dict) -> None:
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
