"""The sha256 of every input the cases beside this file generate, in every dtype.

    python tests/determinism/determinism_checksum.py      # prints it

Arrays are hashed as the backend receives them (rounded to the case dtype), written as
little-endian float64 (bool as uint8) with their name, dtype and shape, so the checksum
does not depend on the machine's byte order.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from attention_conformance.golden.compute import rounded_inputs
from attention_conformance.specs.loader import load_spec

HERE = Path(__file__).resolve().parent


def _update(digest, name: str, dtype: str, array: np.ndarray) -> None:
    digest.update(f"{name}|{dtype}|{array.shape}|".encode())
    kind = "u1" if array.dtype == bool else "<f8"
    digest.update(np.ascontiguousarray(array, dtype=kind).tobytes())


def inputs_checksum(cases_dir: Path = HERE) -> str:
    spec = load_spec(cases_dir)
    if spec.errors:
        raise ValueError("\n".join(map(str, spec.errors)))
    digest = hashlib.sha256()
    for case in sorted(spec.cases, key=lambda c: c.id):
        for variant in case.variants:
            for dtype in case.dtypes:
                digest.update(f"{case.id}[{variant.label}-{dtype}]".encode())
                for name, array in sorted(rounded_inputs(case, variant, dtype).items()):
                    _update(digest, name, dtype, array)
    return digest.hexdigest()


if __name__ == "__main__":
    print(inputs_checksum())
