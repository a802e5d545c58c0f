"""Known bug: a row without allowed keys returns lse 0 (the "safe" max 0 plus log 1)
instead of -inf, so a merge of partial results gives it the weight of one key.

Upstream: pytorch/pytorch PR 134650 ("Changed masked out rows logsumexp to be -inf and
not zero", flex decoding: the global max of a masked row was replaced by 0 before
log(L) + M, so its logsumexp came out 0).
"""

import numpy as np

from _tiled import TiledPlanted


class TiledLseZeroForEmptyRows(TiledPlanted):
    """The kernel's final lse of a row without keys is 0 (its output stays 0)."""

    def _forward(self, st):
        out, lse = super()._forward(st)
        return out, np.where(np.isneginf(lse), 0, lse)
