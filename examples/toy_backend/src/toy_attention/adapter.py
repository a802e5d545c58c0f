"""The attention-conformance adapter of toy_attention.

It imports nothing from attention-conformance: the interface is structural (see the
suite's docs/interface.md). What the library lacks raises NotImplementedError, which
the suite reports as *unsupported*, never as a failure.
"""

import numpy as np

import toy_attention


class ToyBackend:
    name = "toy"
    dtypes = {"float64", "float32"}
    policy = {
        "fully_masked_rows": "nan",        # a row of -inf scores: 0/0 in the softmax
        "neg_inf_bias_rows": "nan",
        "masked_key_nan": "ignored",       # np.where replaces the masked score itself
        "masked_value_nan": "propagates",  # P @ V, and 0 * NaN is NaN
    }
    paths = {"sdpa": "native: toy_attention.attention",
             "attention_weights": "composed: identity values through toy_attention.attention",
             "softmax": "composed: NumPy", "scores": "composed: NumPy"}

    def __init__(self):
        self.versions = {"toy-attention": "0.1.0", "numpy": np.__version__}

    # --- helpers ----------------------------------------------------------------------
    @staticmethod
    def _check(q, k, softcap=None, window=None, bias=None):
        if np.dtype(q.dtype).name not in ToyBackend.dtypes:
            raise NotImplementedError(f"toy: dtype {q.dtype} is not supported")
        if softcap is not None or window is not None:
            raise NotImplementedError("toy: no softcap or sliding window")
        if q.ndim >= 3 and k.ndim >= 3 and k.shape[-3] not in (1, q.shape[-3]):
            raise NotImplementedError("toy: no grouped-query attention")

    @staticmethod
    def _mask(q, k, mask, causal):
        lq, lk = q.shape[-2], k.shape[-2]
        if causal is not None:
            offset = lk - lq if causal == "bottom_right" else 0
            tri = np.arange(lk)[None, :] <= np.arange(lq)[:, None] + offset
            mask = tri if mask is None else (mask & tri)
        return mask

    # --- the interface ------------------------------------------------------------------
    def softmax(self, x, axis=-1):
        self._check(x, x)
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)

    def scores(self, q, k, *, kind, scale=None, w=None, u=None, v=None):
        self._check(q, k)
        if kind not in ("dot", "scaled_dot"):
            raise NotImplementedError(f"toy: no {kind} scores")
        s = q @ np.swapaxes(k, -1, -2)
        if kind == "scaled_dot":
            scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
            s = s * q.dtype.type(scale)
        return s

    def sdpa(self, q, k, v, *, mask=None, bias=None, causal=None, scale=None,
             softcap=None, window=None):
        self._check(q, k, softcap, window)
        if bias is not None:
            raise NotImplementedError("toy: no additive bias")
        out = toy_attention.attention(q, k, v, self._mask(q, k, mask, causal), scale)
        return out.astype(q.dtype)

    def attention_weights(self, q, k, *, mask=None, bias=None, causal=None, scale=None,
                          softcap=None, window=None):
        # the weights are what attention gives for identity values
        lk = k.shape[-2]
        eye = np.broadcast_to(np.eye(lk, dtype=q.dtype), k.shape[:-2] + (lk, lk))
        return self.sdpa(q, k, eye, mask=mask, bias=bias, causal=causal, scale=scale,
                         softcap=softcap, window=window)
