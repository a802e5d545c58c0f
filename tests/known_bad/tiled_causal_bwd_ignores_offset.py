"""Known bug: the backward pass aligns causal top-left (q >= k) while the forward is bottom-right.

Upstream: xlite-dev/ffpa-attn PR 300 ("Fix causal cross-attention alignment in Triton
backward": the dK/dV and dQ loop bounds and masks ignored seqlen_k - seqlen_q).
"""

from _tiled import TiledPlanted


class TiledCausalBwdIgnoresOffset(TiledPlanted):
    """Backward causal tile range and mask ignore Lk - Lq: bottom-right gradients taken top-left."""

    def _backward(self, st, out, lse, d_out):
        if st["causal"] == "bottom_right":
            st = {**st, "causal": "top_left"}
        return super()._backward(st, out, lse, d_out)
