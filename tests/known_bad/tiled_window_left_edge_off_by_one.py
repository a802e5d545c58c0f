"""Known bug: window tile skipping is off by one at the left edge.

A key tile whose last column is exactly the left window edge of the query tile's first
query is skipped, so that query loses that key. Upstream: zml/zml PR 763 ("fix sliding
window off-by-one error": window_size_left is inclusive of the edge).
"""

from _tiled import TiledPlanted


class TiledWindowLeftEdgeOffByOne(TiledPlanted):
    """Window tile skipping off by one: a tile ending on the left window edge is skipped."""

    def _tile_live(self, i0, i1, j0, j1, lq, lk, causal, window):
        off = self._offset(lq, lk, causal)
        left, right = self._window_sides(causal, window)
        lo, hi = i0 + off, i1 - 1 + off
        if right is not None:
            lo = max(lo, j0 - right)
        if left is not None:
            hi = min(hi, j1 - 2 + left)     # p - left < j1 - 1: the edge column is lost
        return lo <= hi
