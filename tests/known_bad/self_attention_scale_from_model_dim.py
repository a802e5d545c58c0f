"""Known bug: self-attention scales by 1/sqrt(d_model), the input width, not 1/sqrt(d_k)."""

import numpy as np

from _plant import Planted


class SelfAttentionScaleFromModelDim(Planted):
    """Scale from the model width: 1/sqrt(x.shape[-1]) where 1/sqrt(w_k.shape[1]) is due."""

    def self_attention(self, x, w_q, w_k, w_v, *, mask=None, causal=None):
        compute = np.float64 if x.dtype == np.float64 else np.float32
        q, k, v = (np.asarray(x, compute) @ np.asarray(w, compute) for w in (w_q, w_k, w_v))
        out = self.sdpa(q, k, v, mask=mask, causal=causal, scale=1 / np.sqrt(x.shape[-1]))
        return out.astype(x.dtype)
