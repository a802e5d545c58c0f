"""Known bug: the scores Q K^T accumulated in the input dtype (float16 / bfloat16).

Upstream: PaddlePaddle/Paddle PR 71919 (block_multihead_attention accumulated Q K^T in
fp16 by default and overflowed; FLAGS_use_fp32_qk_sum=1 accumulates in fp32) and
Dao-AILab/flash-attention issue 543 (fp16 accumulation gets inf or loses precision once
Q @ K^T entries are large: the kernels accumulate in fp32).
"""

import numpy as np
from _tiled import TiledPlanted


class TiledQkAccumulatedInHalf(TiledPlanted):
    """Q K^T accumulated in float16 / bfloat16: each score summed over the head dim in the input dtype."""

    def _logits(self, st, q_t, k_t, i0, i1, j0, j1):
        self._input_dtype = st["dt"]
        return super()._logits(st, q_t, k_t, i0, i1, j0, j1)

    def _tile_scores(self, q_t, k_t, scale, softcap):
        dt = getattr(self, "_input_dtype", q_t.dtype)
        if dt == q_t.dtype:
            return super()._tile_scores(q_t, k_t, scale, softcap)
        q, k = q_t.astype(dt), k_t.astype(dt)
        s = np.zeros(q.shape[:-1] + (k.shape[-2],), dtype=dt)
        for d in range(q.shape[-1]):                 # one head-dim element at a time
            s = (s + q[..., :, d, None] * k[..., None, :, d]).astype(dt)
        s = s.astype(q_t.dtype) * scale
        if softcap is None:
            return s, None
        c = s.dtype.type(softcap)
        t = np.tanh(s / c)
        return c * t, t
