"""Known bug: softcap applied after the bias, cap(scale q k^T + bias), not cap(scale q k^T) + bias.

Upstream: NVIDIA/TransformerEngine PR 3391 (the unfused path capped scale*QK + bias while
FlashAttention-2 caps scale*QK and adds the bias after; fixed by deferring the bias).
"""

import numpy as np

from _tiled import NEG_INF, TiledPlanted, swap


class TiledSoftcapAfterBias(TiledPlanted):
    """Softcap applied after the bias: the bias is squashed by the tanh too."""

    def _logits(self, st, q_t, k_t, i0, i1, j0, j1):
        s = (q_t @ swap(k_t)) * st["scale"]
        if st["bias"] is not None:
            s = s + self._bias_tile(st["bias"], i0, i1, j0, j1)
        t = None
        if st["softcap"] is not None:
            c = s.dtype.type(st["softcap"])
            t = np.tanh(s / c)
            s = c * t
        keep = self._tile_allowed(i0, i1, j0, j1, st["lq"], st["lk"], st["causal"],
                                  st["window"], st["mask"])
        return np.where(keep, s, NEG_INF), t
