"""Known bug: split-KV decode merges the chunks with lse = row max, log(row sum) dropped.

Upstream: flashinfer-ai/flashinfer PR 58 ("Fix the lse computation for batch decode
kernel": the lse was wrong when the paged KV is split, and the merge weights with it).
"""

import numpy as np

from _tiled import TiledPlanted


class TiledSplitKvLseWithoutSum(TiledPlanted):
    """Split-KV chunk lse taken as the chunk's row max: the merge weights ignore the row sums."""

    def _finish_chunk(self, m, l, acc):
        out, _ = self._finish(m, l, acc)
        return out, np.where(l == 0, -np.inf, self._safe(m))
