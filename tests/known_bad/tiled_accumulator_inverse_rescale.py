"""Known bug: the accumulator is rescaled by exp(m_new - m_old), the inverse of the correction.

Upstream: Dao-AILab/flash-attention issue 991 (Algorithm 1 of the FlashAttention-2 paper
printed diag(exp(m_old - m_new))^-1 O; fixed in the paper) and issue 1303 (the same in
FlashAttention-3's); implementations written from the paper shipped it.
"""

import numpy as np

from _tiled import TiledPlanted


class TiledAccumulatorInverseRescale(TiledPlanted):
    """Accumulator rescaled by the inverse factor exp(m_new - m_old) when the row max grows."""

    def _online_update(self, m, l, acc, s, v_t, st):
        m_new = np.maximum(m, np.max(s, axis=-1))
        m_safe = self._safe(m_new)
        alpha = np.exp(m - m_safe)
        inverse = np.where(np.isneginf(m), 1, np.exp(m_safe - self._safe(m)))
        p = np.exp(s - m_safe[..., None])
        l = alpha * l + np.sum(p, axis=-1)
        acc = inverse[..., None] * acc + self._pv(p, v_t, st)
        return m_new, l, acc
