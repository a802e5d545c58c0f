"""Known bug: an empty split-KV chunk is normalised as 0 / 0, and its NaN survives the merge.

Upstream: flashinfer-ai/flashinfer PR 4401 (an empty split-KV chunk merged in
state_t::merge / normalize gives NaN: (-inf) - (-inf) and NaN * 0).
"""

import numpy as np

from _tiled import TiledPlanted


class TiledSplitKvEmptyChunkNan(TiledPlanted):
    """Empty split-KV chunk normalised as 0/0: a decode window that empties a chunk gives NaN."""

    def _finish_chunk(self, m, l, acc):
        _, lse = self._finish(m, l, acc)
        return acc / l[..., None], np.where(l == 0, np.nan, lse)
