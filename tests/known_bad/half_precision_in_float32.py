"""Known bug: float32 inputs are computed in float16 (a half-precision kernel in a float32 path)."""

import numpy as np

from _plant import Planted, original


def _dtypes(x):
    dt, ct = original["_dtypes"](x)
    return (dt, np.dtype(np.float16)) if dt == np.float32 else (dt, ct)


class HalfPrecisionInFloat32(Planted):
    """Half precision inside the float32 path: float32 results carry float16 errors."""

    helpers = {"_dtypes": _dtypes}
