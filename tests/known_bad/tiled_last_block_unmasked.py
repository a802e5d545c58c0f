"""Known bug: the last, partial key tile is not masked, so its zero padding gets weight.

Upstream: flashinfer-ai/flashinfer PR 5090 ("correct SM100 blk64 output when
seqlen_k % 64 != 0": zero-filled out-of-bounds keys gave score 0 and weight exp(0)).
"""

import numpy as np

from _tiled import TiledPlanted


class TiledLastBlockUnmasked(TiledPlanted):
    """Last partial key tile unmasked: padded keys (zeros) take part in the softmax."""

    def _tile_allowed(self, i0, i1, j0, j1, lq, lk, causal, window, mask):
        keep = super()._tile_allowed(i0, i1, j0, min(j1, lk), lq, lk, causal, window, mask)
        return np.concatenate(
            [np.broadcast_to(keep, keep.shape[:-1] + (keep.shape[-1],)),
             np.ones(keep.shape[:-1] + (j1 - min(j1, lk),), dtype=bool)], axis=-1)
