"""Known bug: split-KV decode adds the attention sink to every chunk's denominator, so
the merge counts it once per chunk instead of once.

Upstream: ROCm/rocm-libraries PR 12229 ("fix(ck_tile/fmha): correct attention sink
handling in the split-KV pipelines": the sink logit did not reach the split-KV softmax
denominator exactly once; it was counted twice when a mask hole spanned more than one
split, and not at all when the ordinary key range was empty).
"""

from _tiled import TiledPlanted


class TiledSplitKvSinkEveryChunk(TiledPlanted):
    """Each split-KV chunk folds the sink into its own (out, lse) before the merge."""

    def _split_part(self, st, start, stop):
        return self._forward_rows(st, 0, 1, start, stop, finish=self._finish_chunk, sink=True)
