"""Known bug (scale): the output slices of batch x head past 65,535 are never written (a
launch grid whose second dimension, batch x heads, is capped at 65,535 + 1)."""

import numpy as np

from _plant import Planted
from attention_conformance.backends.numpy import NumpyBackend

SLICES = 1 << 16


class BatchHeadsPast65535Unwritten(Planted):
    """Batch x head slices past 65,535 never written: their output rows stay 0."""

    def sdpa(self, q, k, v, **params):
        out = NumpyBackend.sdpa(self, q, k, v, **params)
        flat = out.reshape((-1,) + out.shape[-2:])
        if flat.shape[0] > SLICES:
            flat[SLICES:] = 0          # the buffer was zeroed; these blocks never ran
        return flat.reshape(out.shape)
