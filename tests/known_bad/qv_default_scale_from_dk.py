"""Known bug: the absorbed MLA form's default softmax scale taken from q's width alone,
1/sqrt(Dk), where the scores q kᵀ + qv vᵀ run over Dk + Dv columns (FlashAttention 3
defaults to (q.shape[-1] + qv.shape[-1]) ** -0.5; a wrapper that computes the scale
from `q.shape[-1]` before passing qv on scores 576-wide rows as if they were 64 wide)."""

import math

from _plant import Planted


class QvDefaultScaleFromDk(Planted):
    """qv's default scale from Dk alone: 1/sqrt(Dk), not 1/sqrt(Dk + Dv)."""

    def sdpa(self, q, k, v, *, qv=None, scale=None, **params):
        if qv is not None and scale is None:
            scale = 1.0 / math.sqrt(q.shape[-1])
        return super().sdpa(q, k, v, qv=qv, scale=scale, **params)
