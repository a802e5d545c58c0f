"""Known bug (scale): keys past 65,535 are never read (a 16-bit key block index that
stops at the last block it can name): they take no part in the softmax or the output,
as if masked out."""

import numpy as np

from _plant import Planted
from attention_conformance.backends.numpy import NumpyBackend

KEYS = 1 << 16


class KeysPast65535Unread(Planted):
    """Keys past 65,535 never read: the softmax and the output stop at key 65,535."""

    def sdpa(self, q, k, v, *, mask=None, **params):
        lk = np.shape(k)[-2]
        if lk > KEYS:
            read = np.arange(lk) < KEYS
            mask = read if mask is None else np.asarray(mask) & read
        return NumpyBackend.sdpa(self, q, k, v, mask=mask, **params)
