"""Known bug: a row whose every state is empty (lse -inf) merged as 0/0: the largest lse
is -inf, so exp(lse - max) is NaN (flash-attention PR 1155's zero-length KV)."""

import numpy as np

from _plant import Planted


class EmptyStateMergedAsZeroOverZero(Planted):
    """Empty states merged as 0/0: no guard for a row without a state."""

    def merge_states(self, outs, lses):
        o, s = outs.astype(np.float64), lses.astype(np.float64)
        s = np.where(np.isinf(s), -np.inf, s)
        with np.errstate(all="ignore"):
            top = np.max(s, axis=0)
            w = np.exp(s - top)
            total = np.sum(w, axis=0)
            out = np.sum(w[..., None] * np.where(w[..., None] > 0, o, 0.0), axis=0) / total[..., None]
            lse = top + np.log(total)
        return out.astype(outs.dtype), lse.astype(lses.dtype)
