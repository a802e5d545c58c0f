"""The dtypes of the spec: one table of names, NumPy types (bfloat16 and the fp8 formats
through ml_dtypes) and unit roundoffs, that the schema, the command line and the
tolerances follow; and the rule of which dtype each input and output of a case has
(docs/interface.md, "Arrays and dtypes", "fp8 inputs and descale factors")."""

from __future__ import annotations

import ml_dtypes
import numpy as np

NUMPY_DTYPES = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
}

_NAMES = {dtype: name for name, dtype in NUMPY_DTYPES.items()}

#: the spec's dtype names, widest first
DTYPES: tuple[str, ...] = tuple(NUMPY_DTYPES)

#: unit roundoff u = 2**-p, p the significand precision in bits (including the implicit one)
UNIT_ROUNDOFF = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
    "float8_e4m3fn": 2.0**-4,
    "float8_e5m2": 2.0**-3,
}

#: the fp8 formats and their largest finite value: quantizing to one saturates there
#: (e4m3fn has no infinity; a value past 448 would otherwise become NaN)
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
FP8_DTYPES: tuple[str, ...] = tuple(FP8_MAX)
#: the dtypes of the plain (not quantized) cases: what fuzzing draws
PLAIN_DTYPES: tuple[str, ...] = tuple(d for d in DTYPES if d not in FP8_MAX)
#: the inputs an fp8 case quantizes; its other floating inputs and every output are WIDE
QUANTIZED_INPUTS = ("q", "k", "v", "k_pages", "v_pages")
WIDE = "float32"
#: inputs whose dtype is fixed whatever the case's: the descale factors of fp8
FIXED_INPUT_DTYPES = {"q_descale": WIDE, "k_descale": WIDE, "v_descale": WIDE}
#: the half-precision dtypes, beside which a log-sum-exp is float32 (FlashAttention's
#: softmax_lse, FlashInfer's lse and merge_state's s, vLLM's merge_attn_states)
HALF = ("float16", "bfloat16")
#: the log-sum-exps: sdpa_lse's and merge_states' output `lse`, merge_states' input `lses`
LSE_NAMES = ("lse", "lses")


def numpy_dtype(name: str) -> np.dtype:
    return NUMPY_DTYPES[name]


def dtype_name(dtype) -> str | None:
    """The spec's name of a NumPy dtype, or None if it is not one of the table's."""
    return _NAMES.get(np.dtype(dtype))     # every output is checked: a lookup, not a loop


def output_dtype(case_dtype: str, name: str | None = None, params=None) -> str:
    """The dtype of output `name` of a case of this dtype (docs/interface.md, "Arrays and
    dtypes"): its own, float32 for fp8; a log-sum-exp (LSE_NAMES) float32 beside float16
    and bfloat16; `out` in the case's fp8 format when `params` give an `o_scale` (the fp8
    output that an output scale writes)."""
    if name in LSE_NAMES and case_dtype in HALF:
        return WIDE
    if name == "out" and case_dtype in FP8_MAX and (params or {}).get("o_scale") is not None:
        return case_dtype
    return WIDE if case_dtype in FP8_MAX else case_dtype


def input_dtype(case_dtype: str, name: str, passed_as: str | None = None) -> str:
    """The dtype input `name` of a case of dtype `case_dtype` is given in: its own
    `passed_as` (mixed dtypes: a float32 bias beside bfloat16 q, k, v), a fixed one (the
    descales), float32 for merge_states' lses beside half outputs and for the inputs an
    fp8 case does not quantize, else the case's."""
    if passed_as:
        return passed_as
    if name in FIXED_INPUT_DTYPES:
        return FIXED_INPUT_DTYPES[name]
    if name in LSE_NAMES and case_dtype in HALF:
        return WIDE
    if case_dtype in FP8_MAX and name not in QUANTIZED_INPUTS:
        return WIDE
    return case_dtype


def round_to(x, name: str) -> np.ndarray:
    """x rounded to dtype `name`, returned as float64 (beyond its range: +-inf, as a cast;
    an fp8 format saturates at its largest finite value, as fp8 quantizers do)."""
    x = np.asarray(x)
    if name == "float64":
        return x.astype(np.float64)
    with np.errstate(over="ignore"):
        return cast_to(x, name).astype(np.float64)


def cast_to(x: np.ndarray, name: str) -> np.ndarray:
    """x in dtype `name`, as round_to rounds it (its caller ignores overflow: a value
    beyond the range becomes +-inf)."""
    if name in FP8_MAX:
        top = FP8_MAX[name]
        x = np.where(np.isfinite(x), np.clip(x, -top, top), x)
    return x.astype(NUMPY_DTYPES[name])


def rounded_and_cast(arrays: dict, dtypes: dict) -> tuple[dict, dict]:
    """(each float array rounded to its dtype in `dtypes`, in float64; the same in that
    dtype), from one cast each: what round_to and then a cast of its result to the dtype
    give, bit for bit. A bool mask is copied, the copy in both."""
    exact, cast = {}, {}
    with np.errstate(over="ignore"):
        for name, array in arrays.items():
            if array.dtype == bool:
                exact[name] = cast[name] = array.copy()
            elif dtypes[name] == "float64":
                exact[name], cast[name] = array.astype(np.float64), array.astype(np.float64)
            else:
                cast[name] = cast_to(array, dtypes[name])
                exact[name] = cast[name].astype(np.float64)
    return exact, cast
