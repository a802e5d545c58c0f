"""toy_attention: a small attention implementation (the library being certified)."""

import numpy as np


def attention(q, k, v, mask=None, scale=None):
    """softmax(q k^T * scale, masked) v, in the dtype of q."""
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ np.swapaxes(k, -1, -2)) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p = p / p.sum(axis=-1, keepdims=True)
    return p @ v
