"""The tolerance rule of a spec folder's tolerances.yaml (documented in that file)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from .dtypes import DTYPES, output_dtype


@dataclass(frozen=True)
class Tolerances:
    multiplier: float
    property_roundings: float
    unit_roundoff: dict
    plain_error_from: dict
    source: str = "spec/tolerances.yaml"

    def output(self, dtype: str, plain_error: float, golden: np.ndarray) -> float:
        """Largest absolute error allowed for an output against its golden (the floor: one
        rounding of the output's dtype, float32 for an fp8 case)."""
        finite = np.abs(golden[np.isfinite(golden)])
        magnitude = float(finite.max()) if finite.size else 0.0
        return self.multiplier * max(plain_error,
                                     self.unit_roundoff[output_dtype(dtype)] * magnitude)

    def prop(self, dtype: str, magnitude: float = 1.0, reduction: int = 1,
             order: str | None = None) -> float:
        """Tolerance of a property comparing a backend with itself, derived as the
        golden's: multiplier x max(property_roundings roundings of the dtype, sqrt(n)
        roundings of the dtype the sums are made in: `order`, float32 for a float16 or
        bfloat16 backend of the float32 accumulation tier) x the magnitude involved, n
        the longest reduction (a sum of n terms in another order, as the golden's floor)."""
        u = self.unit_roundoff
        roundings = max(self.property_roundings * u[dtype],
                        math.sqrt(max(reduction, 1)) * u[order or dtype])
        return self.multiplier * roundings * magnitude


class TolerancesError(ValueError):
    """A tolerances file that is not the rule (its message names file, line and key)."""

    def __init__(self, path, line: int, message: str):
        self.path, self.line, self.message = str(path), line, message
        super().__init__(f"{path}:{line}: {message}")


def _number(value) -> bool:
    """A positive finite number, or a string of one (PyYAML reads 1.0e9, whose exponent
    has no sign, as a string; the rule has always taken it through float())."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return False
    try:
        return math.isfinite(float(value)) and float(value) > 0
    except ValueError:
        return False


def _problem(data) -> tuple[tuple, str] | None:
    """(the key path at fault, what is wrong) of a parsed tolerances file, or None."""
    if not isinstance(data, dict):
        return (), "the file is a mapping with multiplier, property_roundings and dtypes"
    for key in ("multiplier", "property_roundings"):
        if not _number(data.get(key)):
            return (key,), f"{key} must be a positive number, not {data.get(key)!r}"
    dtypes = data.get("dtypes")
    if not isinstance(dtypes, dict) or not dtypes:
        return ("dtypes",), "dtypes maps each dtype to {unit_roundoff: NUMBER}"
    for name, entry in dtypes.items():
        if name not in DTYPES:
            return ("dtypes", name), f"dtypes: {name!r} is not a dtype (known: {', '.join(DTYPES)})"
        if not isinstance(entry, dict) or not _number(entry.get("unit_roundoff")):
            return ("dtypes", name), f"dtypes/{name}/unit_roundoff must be a positive number"
        if entry.get("plain_error_from", name) not in dtypes:
            return ("dtypes", name, "plain_error_from"), (
                f"dtypes/{name}/plain_error_from: {entry['plain_error_from']!r} has no tolerance here")
    return None


def _line_of(text: str, keys: tuple) -> int:
    """The line of the deepest key of `keys` found in the YAML text (1: the file's top)."""
    node, line = yaml.compose(text), 1
    for key in keys:
        match = [pair for pair in getattr(node, "value", ()) if isinstance(pair, tuple)
                 and getattr(pair[0], "value", None) == str(key)]
        if not isinstance(node, yaml.MappingNode) or not match:
            break
        line, node = match[0][0].start_mark.line + 1, match[0][1]
    return line


@functools.cache
def _load(path: Path, mtime_ns: int) -> Tolerances:
    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        raise TolerancesError(path, mark.line + 1 if mark else 1,
                              f"invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    problem = _problem(data)
    if problem:
        raise TolerancesError(path, _line_of(text, problem[0]), problem[1])
    dtypes = data["dtypes"]
    return Tolerances(
        multiplier=float(data["multiplier"]),
        property_roundings=float(data["property_roundings"]),
        unit_roundoff={d: float(v["unit_roundoff"]) for d, v in dtypes.items()},
        plain_error_from={d: v["plain_error_from"] for d, v in dtypes.items()
                          if "plain_error_from" in v},
        source=str(path),
    )


def load_tolerances(path) -> Tolerances:
    """The rule of one tolerances.yaml (read once per file version); TolerancesError
    names the file, line and key of a file that is not the rule."""
    path = Path(path).resolve()
    return _load(path, path.stat().st_mtime_ns)
