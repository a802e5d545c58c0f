"""Known bug (vLLM merge_attn_states before its fix): an lse of +inf, FlashAttention's
lse of an empty row, taken as a real state instead of an empty one."""

import numpy as np

from _plant import Planted


class InfLseTakenAsRealState(Planted):
    """+inf lse taken as a real state: only -inf marks an empty one."""

    def merge_states(self, outs, lses):
        o, s = outs.astype(np.float64), lses.astype(np.float64)
        with np.errstate(all="ignore"):
            top = np.max(s, axis=0)
            top = np.where(np.isneginf(top), 0.0, top)
            w = np.exp(s - top)
            total = np.sum(w, axis=0)
            share = np.where(total > 0, w / np.where(total > 0, total, 1.0), 0.0)
            out = np.sum(share[..., None] * np.where(share[..., None] > 0, o, 0.0), axis=0)
            lse = top + np.log(total)
        return out.astype(outs.dtype), lse.astype(lses.dtype)
