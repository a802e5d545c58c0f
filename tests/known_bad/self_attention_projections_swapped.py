"""Known bug: self-attention uses W_k for the queries and W_q for the keys."""

from _plant import Planted


class SelfAttentionProjectionsSwapped(Planted):
    """Projections swapped: Q = x W_k and K = x W_q, so the scores come out transposed."""

    def self_attention(self, x, w_q, w_k, w_v, **kw):
        return super().self_attention(x, w_k, w_q, w_v, **kw)
