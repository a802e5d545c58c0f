"""Known bug: the log-sum-exp returned in the outputs' half precision, where FlashAttention
and FlashInfer return it in float32 (docs/interface.md, "Log-sum-exps beside half
outputs"); a merge that reads it back weighs each state wrong."""

from _plant import Planted


class LseReturnedInHalf(Planted):
    """Lse returned in half: sdpa_lse casts its lse to the dtype of q, k and v."""

    def sdpa_lse(self, q, k, v, **params):
        out, lse = super().sdpa_lse(q, k, v, **params)
        return out, lse.astype(q.dtype)
