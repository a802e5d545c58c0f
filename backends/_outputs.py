"""The dtypes of what an adapter returns (docs/interface.md, "Arrays and dtypes"), for
adapters whose framework computes them otherwise: a log-sum-exp in float32 beside
float16 and bfloat16 outputs. Public through backends/rules.py (``rules.lse_dtype``);
NumPy only, like it.
"""

from __future__ import annotations

import numpy as np

#: the dtypes beside which an lse is float32 (FlashAttention's softmax_lse is)
HALF = ("float16", "bfloat16")


def lse_dtype(dtype) -> np.dtype:
    """The dtype of an lse (sdpa_lse's, merge_states' in and out) beside outputs of
    ``dtype`` (a NumPy dtype or its name): float32 for float16 and bfloat16, else
    ``dtype`` itself (float64 stays float64)."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    return np.dtype(np.float32) if name in HALF else np.dtype(dtype)


def identity_values(q, k) -> np.ndarray:
    """V = identity(Lk) in q's dtype, broadcast over k's batch dims: sdpa(q, k, V) is then
    the attention weights (attention_weights for an API that has only sdpa)."""
    lk = np.shape(k)[-2]
    return np.broadcast_to(np.eye(lk, dtype=np.asarray(q).dtype), np.shape(k)[:-2] + (lk, lk))
