"""Known bug: K and V zero-padded to a multiple of 128 and never masked, so the padded
keys score 0 and take weight.

Upstream: the flash-attn Triton wrapper certified in issue 37 (flash_attn_triton.py,
BLOCK 128, float16 and bfloat16 only) takes whole 128-row query tiles, pads the keys and
values to the next multiple of 128 with zeros and never masks them; jax-ml/jax issue
27224 (Pallas GPU FlashAttention, blocks of 128: right only when the sequence lengths
are multiples of the block size) is the same class of bug. Only a non-causal half-
precision case with Lq a multiple of 128 and Lk not shows it.
"""

import numpy as np

from _tiled import TiledPlanted


class TiledKeysPaddedTo128Unmasked(TiledPlanted):
    """K and V zero-padded to a multiple of 128 and never masked (the Triton wrapper).

    The padding (scores of 0) joins the softmax, in the half-precision, whole-query-tile
    calls it takes."""

    def _gate(self, q, kw):
        if np.asarray(q).dtype.name not in ("float16", "bfloat16") or np.shape(q)[-2] % 128 \
                or kw.get("causal") is not None or kw.get("q_lengths") is not None \
                or kw.get("kv_lengths") is not None:
            raise NotImplementedError("the Triton kernel takes float16 / bfloat16, Lq a "
                                      "multiple of 128, no causal, no lengths")

    @staticmethod
    def _pad(k, v, kw):
        k, v, lk = np.asarray(k), np.asarray(v), np.shape(k)[-2]
        extra = -lk % 128

        def padded(x, axis, fill):
            width = [(0, 0)] * x.ndim
            width[axis] = (0, extra)
            return np.pad(x, width, constant_values=fill)

        for name, fill in (("mask", True), ("bias", 0)):
            if kw.get(name) is not None and np.shape(kw[name])[-1] == lk:
                kw[name] = padded(np.asarray(kw[name]), -1, fill)
        return padded(k, -2, 0), padded(v, -2, 0), kw

    def attention_weights(self, q, k, **kw):
        raise NotImplementedError("the Triton kernel returns no weights")

    def sdpa(self, q, k, v, **kw):
        self._gate(q, kw)
        k, v, kw = self._pad(k, v, dict(kw))
        return super().sdpa(q, k, v, **kw)

    def sdpa_lse(self, q, k, v, **kw):
        self._gate(q, kw)
        k, v, kw = self._pad(k, v, dict(kw))
        return super().sdpa_lse(q, k, v, **kw)

    def sdpa_vjp(self, q, k, v, d_out, **kw):
        self._gate(q, kw)
        lk = np.shape(k)[-2]
        k, v, kw = self._pad(k, v, dict(kw))
        dq, dk, dv, *rest = super().sdpa_vjp(q, k, v, d_out, **kw)
        return (dq, dk[..., :lk, :], dv[..., :lk, :], *rest)
