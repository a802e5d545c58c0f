"""Known bug: P V accumulated in the input dtype (float16 / bfloat16), not in float32.

Upstream: Dao-AILab/flash-attention issue 543 (a proposal to accumulate P @ V in fp16 for
speed; the maintainer: accumulation is done in fp32 for precision and stability) and
NVIDIA/cutlass issue 1188 (a CuTe GEMM example's fp16 accumulator: 2048 + 1 = 2048, small
terms silently dropped once the sum is large).
"""

import numpy as np
from _tiled import TiledPlanted


class TiledPvAccumulatedInHalf(TiledPlanted):
    """P V accumulated in float16 / bfloat16: each term added to the output in the input dtype."""

    def _online_update(self, m, l, acc, s, v_t, st):
        m_new = np.maximum(m, np.max(s, axis=-1))
        m_safe = self._safe(m_new)
        alpha = np.exp(m - m_safe)
        p = np.exp(s - m_safe[..., None])
        l = alpha * l + np.sum(p, axis=-1)
        dt = st["dt"]
        acc = (alpha[..., None] * acc).astype(dt)
        p, v = p.astype(dt), v_t.astype(dt)
        for j in range(p.shape[-1]):                 # one key at a time, in the dtype
            acc = (acc + p[..., j, None] * v[..., j:j + 1, :]).astype(dt)
        return m_new, l, acc.astype(st["ct"])
