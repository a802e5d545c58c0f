"""The tolerance rule of a spec folder's tolerances.yaml (documented in that file)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml


@dataclass(frozen=True)
class Tolerances:
    multiplier: float
    property_roundings: float
    unit_roundoff: dict
    plain_error_from: dict
    source: str = "spec/tolerances.yaml"

    def output(self, dtype: str, plain_error: float, golden: np.ndarray) -> float:
        """Largest absolute error allowed for an output against its golden."""
        finite = np.abs(golden[np.isfinite(golden)])
        magnitude = float(finite.max()) if finite.size else 0.0
        return self.multiplier * max(plain_error, self.unit_roundoff[dtype] * magnitude)

    def prop(self, dtype: str, magnitude: float = 1.0) -> float:
        """Tolerance of a property comparing a backend with itself."""
        return self.multiplier * self.property_roundings * self.unit_roundoff[dtype] * magnitude


@functools.cache
def _load(path: Path, mtime_ns: int) -> Tolerances:
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
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
    """The rule of one tolerances.yaml (read once per file version)."""
    path = Path(path).resolve()
    return _load(path, path.stat().st_mtime_ns)
