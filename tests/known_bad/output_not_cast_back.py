"""Known bug: half-precision inputs get the float32 compute result back (no cast at the end)."""

import numpy as np

from _plant import Planted


class OutputNotCastBack(Planted):
    """Output not cast back: float16 and bfloat16 inputs give float32 outputs."""

    def sdpa(self, q, k, v, **kw):
        out = super().sdpa(q, k, v, **kw)
        return out.astype(np.float32) if out.dtype.itemsize < 4 else out
