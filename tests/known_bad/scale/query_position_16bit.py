"""Known bug (scale): the query position is held in 16 bits, so a query row past 65,535
is masked (causal, window) as the row 65,536 before it."""

import numpy as np

from _plant import Planted
from attention_conformance.backends.numpy import NumpyBackend

WRAP = 1 << 16


def _rows_past(x, keys):
    """A mask or bias of the rows past the wrap over the first `keys` keys."""
    if x is None:
        return None
    x = np.asarray(x)
    x = x[..., WRAP:, :] if x.ndim >= 2 and x.shape[-2] != 1 else x
    return x[..., :keys] if x.shape[-1] != 1 else x


class QueryPosition16Bit(Planted):
    """16-bit query position: a row past 65,535 sees the keys of row i mod 65,536."""

    def sdpa(self, q, k, v, *, mask=None, bias=None, causal=None, window=None, **params):
        out = NumpyBackend.sdpa(self, q, k, v, mask=mask, bias=bias, causal=causal,
                                window=window, **params)
        lq, lk = np.shape(q)[-2], np.shape(k)[-2]
        if lq <= WRAP or (causal is None and window is None) or lk <= WRAP:
            return out
        # positions restart at 0 past the wrap: the same rows over the keys before it
        keys = lk - WRAP
        out[..., WRAP:, :] = NumpyBackend.sdpa(
            self, q[..., WRAP:, :], k[..., :keys, :], v[..., :keys, :],
            mask=_rows_past(mask, keys), bias=_rows_past(bias, keys), causal=causal,
            window=window, **params)
        return out
