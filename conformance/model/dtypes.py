"""The dtypes of the spec: one table of names, NumPy types (bfloat16 through ml_dtypes)
and unit roundoffs, that the schema, the command line and the tolerances follow."""

from __future__ import annotations

import ml_dtypes
import numpy as np

NUMPY_DTYPES = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}

#: the spec's dtype names, widest first
DTYPES: tuple[str, ...] = tuple(NUMPY_DTYPES)

#: unit roundoff u = 2**-p, p the significand precision in bits (including the implicit one)
UNIT_ROUNDOFF = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
}


def numpy_dtype(name: str) -> np.dtype:
    return NUMPY_DTYPES[name]


def dtype_name(dtype) -> str | None:
    """The spec's name of a NumPy dtype, or None if it is not one of the four."""
    dtype = np.dtype(dtype)
    for name, candidate in NUMPY_DTYPES.items():
        if candidate == dtype:
            return name
    return None


def round_to(x, name: str) -> np.ndarray:
    """x rounded to dtype `name`, returned as float64 (beyond its range: +-inf, as a cast)."""
    x = np.asarray(x)
    if name == "float64":
        return x.astype(np.float64)
    with np.errstate(over="ignore"):
        return x.astype(NUMPY_DTYPES[name]).astype(np.float64)
