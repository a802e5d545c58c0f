"""Known bug: masked scores are set to a finite -1e4 and take part in the max and the sum.

Upstream: ohdearquant/lattice issue 361 and PR 373 (tiled online softmax masked keys with
MASK_VALUE = -10000 folded into the tile max and sum; fixed by masking with -inf).
"""

import numpy as np

from _tiled import TiledPlanted


class TiledMaskedSentinelInSoftmax(TiledPlanted):
    """Masked scores set to -1e4 and kept in the softmax: masked keys get weight."""

    def _logits(self, st, q_t, k_t, i0, i1, j0, j1):
        s, t = self._tile_scores(q_t, k_t, st["scale"], st["softcap"])
        if st["bias"] is not None:
            s = s + self._bias_tile(st["bias"], i0, i1, j0, j1)
        keep = self._tile_allowed(i0, i1, j0, j1, st["lq"], st["lk"], st["causal"],
                                  st["window"], st["mask"])
        return np.where(keep, s, s.dtype.type(-1e4)), t
