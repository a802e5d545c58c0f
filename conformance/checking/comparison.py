"""Comparing an output with its golden: the one comparison that checks and api use.

NaN and inf must sit where the golden has them (and inf with its sign); elsewhere the
largest absolute error is set against the tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def worst_error(actual: np.ndarray, expected: np.ndarray):
    """(largest abs error, its index, pattern) over finite positions; a differing NaN or
    inf pattern gives inf and names itself in `pattern`."""
    if actual.size and _all_finite(actual) and _all_finite(expected):
        diff = np.abs(actual - expected)
        index = _unravel(int(diff.argmax()), diff.shape)
        return float(diff[index]), index, ""
    nan_a, nan_e = np.isnan(actual), np.isnan(expected)
    if not np.array_equal(nan_a, nan_e):
        where = np.argwhere(nan_a != nan_e)[0]
        return np.inf, tuple(int(i) for i in where), "NaN pattern differs"
    inf_a, inf_e = np.isinf(actual), np.isinf(expected)
    # an inf where the golden has none (or none where it has one), or one of the other sign
    differs = (inf_a != inf_e) | (inf_a & inf_e & (actual != expected))
    if np.any(differs):
        return np.inf, tuple(int(i) for i in np.argwhere(differs)[0]), "inf pattern differs"
    with np.errstate(invalid="ignore"):     # inf - inf at the matching infs, masked out
        diff = np.where(np.isfinite(expected), np.abs(actual - expected), 0.0)
    if diff.size == 0:
        return 0.0, (), ""
    index = _unravel(int(diff.argmax()), diff.shape)
    return float(diff[index]), index, ""


def _all_finite(array: np.ndarray) -> bool:
    """np.isfinite(array).all(), without the Python layer of ndarray.all."""
    return np.count_nonzero(np.isfinite(array)) == array.size


def _unravel(flat: int, shape: tuple) -> tuple:
    """np.unravel_index(flat, shape) as a tuple of ints, without its NumPy scalars."""
    index = []
    for size in reversed(shape):
        flat, i = divmod(flat, size)
        index.append(i)
    return tuple(reversed(index))


def digits(dtype: str) -> int:
    """Significant digits that tell two values of a dtype apart."""
    return {"float64": 17, "float32": 9, "float16": 5, "bfloat16": 4}.get(dtype, 17)


@dataclass(frozen=True)
class Comparison:
    error: float
    index: tuple
    pattern: str            # "" or "NaN pattern differs" / "inf pattern differs"
    tolerance: float
    actual: float
    expected: float

    @property
    def ratio(self) -> float:
        if self.tolerance > 0:
            return self.error / self.tolerance
        return 0.0 if self.error == 0 else np.inf

    @property
    def ok(self) -> bool:
        return self.ratio <= 1

    def describe(self, dtype: str) -> str:
        """What differs, with enough digits to tell the two values apart."""
        n = digits(dtype)
        where = list(self.index)
        got, want = f"{self.actual:.{n}g}", f"{self.expected:.{n}g}"
        if self.pattern:
            return f"{self.pattern} at {where} (got {got}, expected {want})"
        relative = self.error / abs(self.expected) if self.expected else np.inf
        return (f"worst abs error {self.error:.3g} at {where} (got {got}, expected {want};"
                f" relative {relative:.3g})")


def compare(actual: np.ndarray, gold: np.ndarray, tolerance: float,
            nan_allowed=None) -> Comparison:
    """An output against its golden (both float64, same shape) under a tolerance.

    nan_allowed (boolean, broadcastable, or None): positions where the spec accepts a
    second exact form, NaN, in place of the golden (the `key_nan_columns` rule of
    docs/interface.md); a NaN there counts as the golden's value."""
    if nan_allowed is not None:
        actual = np.where(nan_allowed & np.isnan(actual), gold, actual)
    error, index, pattern = worst_error(actual, gold)
    at = index if actual.ndim else ()
    return Comparison(error, index, pattern, tolerance, float(actual[at]) if actual.size else 0.0,
                      float(gold[at]) if gold.size else 0.0)
