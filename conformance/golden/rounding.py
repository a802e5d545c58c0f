"""Rounding of the reference's intermediate results: the "plain same-dtype computation"
whose error sets the tolerances (spec/tolerances.yaml). Every intermediate result of the
reference passes through :func:`_r`, the identity in float64 and, inside
``with rounded_to("float16")``, a rounding to that dtype; :func:`_mm` and :func:`_sum`
are a product and a sum computed as the plain computation does; :func:`_rw` rounds the
weights P before P V to an fp8 format in the plain computation of an fp8 case.
"""

from __future__ import annotations

import contextlib
import contextvars

import numpy as np

from ..model.dtypes import FP8_MAX, numpy_dtype, round_to

_ROUNDING = contextvars.ContextVar("rounding", default=None)

#: where products and sums accumulate under rounded_to: None (the dtype, as numpy does
#: it) or "float32" (the accumulation tier of spec/tolerances.yaml)
_ACCUMULATE = contextvars.ContextVar("accumulate", default=None)
#: the fp8 format the weights P are rounded to before P V under rounded_to (None: _r's)
_WEIGHTS = contextvars.ContextVar("weights", default=None)
#: the fp8 format an output written with an o_scale is in (None: none known)
_OUTPUT = contextvars.ContextVar("output_format", default=None)


@contextlib.contextmanager
def rounded_to(dtype: str | None, accumulate: str | None = None, weights: str | None = None):
    """Round every intermediate result to ``dtype`` (None: plain float64); with
    ``accumulate="float32"`` matrix products and sums of dtype-rounded operands are
    accumulated in float32, their results rounded to ``dtype``; with ``weights`` (an fp8
    format) the weights P are rounded to it before P V, as an fp8 kernel's P V product
    takes them (spec/tolerances.yaml)."""
    token = _ROUNDING.set(None if dtype in (None, "float64") else dtype)
    wide = _ACCUMULATE.set(accumulate)
    narrow = _WEIGHTS.set(weights)
    try:
        yield
    finally:
        _WEIGHTS.reset(narrow)
        _ACCUMULATE.reset(wide)
        _ROUNDING.reset(token)


@contextlib.contextmanager
def output_format(dtype: str | None):
    """The fp8 format (a case's dtype; any other: none) that an output written with an
    o_scale is stored in: scaled_output saturates at its largest finite value, and rounds
    to it under rounded_to (the plain computation)."""
    token = _OUTPUT.set(dtype if dtype in FP8_MAX else None)
    try:
        yield
    finally:
        _OUTPUT.reset(token)


def _ro(x):
    """An output as its fp8 format stores it (output_format): saturated at the largest
    finite value; in the plain computation also rounded to the format."""
    fmt = _OUTPUT.get()
    if fmt is None:
        return x
    if _ROUNDING.get() is not None:
        return round_to(x, fmt)
    return np.where(np.isfinite(x), np.clip(x, -FP8_MAX[fmt], FP8_MAX[fmt]), x)


def _r(x):
    dtype = _ROUNDING.get()
    return x if dtype is None else round_to(x, dtype)


def _rw(p):
    """The weights P as the P V product takes them: rounded to the fp8 format of an fp8
    case's plain computation, else as every intermediate result (_r)."""
    weights = _WEIGHTS.get()
    return _r(p) if weights is None else round_to(p, weights)


def _mm(a, b):
    """a @ b; under rounded_to, computed in that dtype (its accumulation error included)."""
    dtype = _ROUNDING.get()
    if dtype is None:
        return a @ b
    dt = numpy_dtype(dtype)
    if _ACCUMULATE.get() == "float32":
        wide = np.matmul(a.astype(dt).astype(np.float32), b.astype(dt).astype(np.float32))
        return round_to(wide.astype(np.float64), dtype)
    return np.matmul(a.astype(dt), b.astype(dt)).astype(np.float64)


def _sum(x, axis):
    """Sum over axis (keepdims); under rounded_to, accumulated in that dtype."""
    dtype = _ROUNDING.get()
    if dtype is None:
        return np.sum(x, axis=axis, keepdims=True)
    if _ACCUMULATE.get() == "float32":
        wide = np.sum(x.astype(numpy_dtype(dtype)).astype(np.float32), axis=axis, keepdims=True)
        return round_to(wide.astype(np.float64), dtype)
    return np.sum(x.astype(numpy_dtype(dtype)), axis=axis, keepdims=True).astype(np.float64)


def rounding_dtype():
    """The dtype intermediate results are rounded to (None: plain float64)."""
    return _ROUNDING.get()
