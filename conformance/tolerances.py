"""The tolerance rule of spec/tolerances.yaml."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import yaml

from .paths import TOLERANCES_FILE


@dataclass(frozen=True)
class Tolerances:
    multiplier: float
    property_roundings: float
    unit_roundoff: dict
    plain_error_from: dict

    def output(self, dtype: str, plain_error: float, golden: np.ndarray) -> float:
        """Largest absolute error allowed for an output against its golden."""
        finite = np.abs(golden[np.isfinite(golden)])
        magnitude = float(finite.max()) if finite.size else 0.0
        return self.multiplier * max(plain_error, self.unit_roundoff[dtype] * magnitude)

    def prop(self, dtype: str, magnitude: float = 1.0) -> float:
        """Tolerance of a property comparing a backend with itself."""
        return self.multiplier * self.property_roundings * self.unit_roundoff[dtype] * magnitude


@functools.cache
def load_tolerances(path=TOLERANCES_FILE) -> Tolerances:
    data = yaml.safe_load(open(path, encoding="utf-8"))
    dtypes = data["dtypes"]
    return Tolerances(
        multiplier=float(data["multiplier"]),
        property_roundings=float(data["property_roundings"]),
        unit_roundoff={d: float(v["unit_roundoff"]) for d, v in dtypes.items()},
        plain_error_from={d: v["plain_error_from"] for d, v in dtypes.items()
                          if "plain_error_from" in v},
    )
