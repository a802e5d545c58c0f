"""Known bug: the bias tile's column offset never advances past the first key tile.

Upstream: microsoft/onnxruntime PR 32302 (attention bias read at a cache-relative column
instead of the key's absolute column); Triton fused-attention-with-bias ports
(triton-lang/triton issue 2029) load the bias block at a pointer advanced with K and V.
"""

from _tiled import TiledPlanted


class TiledBiasColumnOffset(TiledPlanted):
    """Bias tile column offset never advances: every key tile adds bias columns 0..block_k-1."""

    def _bias_tile(self, bias, i0, i1, j0, j1):
        return bias[..., i0:i1, 0:j1 - j0]
