"""A NumPy attention that never reads a key its query may not see.

Each query row gathers its allowed keys (mask, causal, window, lengths) and computes its
softmax, output and gradients from those keys alone, as a kernel that skips masked tiles
(FlashAttention), crops the keys (transformers' sdpa path under ``is_causal``) or never
loads padding (varlen kernels) does: a NaN or inf stored in a key or value a query may
not see reaches no output and no gradient of that query. It is written as an outside
author would, with the public rules module (``attention_conformance.backends.rules``):
``Layout`` folds the batch and grouped heads, ``allowed`` gives causal and window,
``lengths_as_mask`` folds ``q_lengths`` / ``kv_lengths`` into the mask.

Policies, and why they hold:
- ``masked_key_nan: ignored`` and ``masked_value_nan: ignored``: a disallowed key or
  value is never read;
- ``fully_masked_rows: zeros``: a row without an allowed key gathers nothing, its output
  and weights stay 0;
- ``padded_query_rows: zeros``: lengths_as_mask zeroes the rows of padded queries;
- ``accumulation: float32``: float16 and bfloat16 are computed in float32.

A bias, sink or softcap is not taken (NotImplementedError: unsupported), nor are the ops
that need none of this (softmax, scores, sdpa_lse, self_attention).
"""

from __future__ import annotations

import numpy as np

from attention_conformance.backends.rules import Layout, allowed, and_masks, lengths_as_mask

_OPS = ("attention_weights", "sdpa", "sdpa_vjp", "multi_head_attention")


def _compute_dtype(x):
    return np.float64 if np.asarray(x).dtype == np.float64 else np.float32


def _sum_to(g, shape):
    """A gradient summed down to an input's shape (broadcast batch dims, shared heads)."""
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for axis, size in enumerate(shape):
        if size == 1 and g.shape[axis] != 1:
            g = g.sum(axis=axis, keepdims=True)
    return g


class NeverReadsMaskedKeys:
    name = "never-reads-masked-keys"
    dtypes = frozenset({"float64", "float32", "float16", "bfloat16"})

    def __init__(self):
        self.versions = {"numpy": np.__version__}
        self.paths = {op: "composed: NumPy, each query row over its allowed keys only"
                      for op in _OPS}
        self.policy = {"fully_masked_rows": "zeros", "neg_inf_bias_rows": "zeros",
                       "masked_key_nan": "ignored", "masked_value_nan": "ignored",
                       "accumulation": "float32", "padded_query_rows": "zeros"}

    # ---------------------------------------------------------------- one row at a time

    def _rows(self, q, k, v, mask, causal, window, scale, d_out=None, refuse=()):
        if any(x is not None for x in refuse):
            raise NotImplementedError("never-reads-masked-keys: bias, sink and softcap")
        layout = Layout(q, k, v, mask)
        ct = _compute_dtype(q)
        qf, kf, vf = (x.astype(ct) for x in layout.fold(np.asarray(q), np.asarray(k),
                                                         np.asarray(v), np.broadcast_to))
        keep = and_masks(allowed(layout.lq, layout.lk, causal, window),
                         None if mask is None else layout.scores(np.asarray(mask),
                                                                 np.broadcast_to))
        keep = np.broadcast_to(True if keep is None else keep,
                               (layout.b, layout.hq, layout.lq, layout.lk))
        scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
        group = layout.hq // layout.hkv
        weights = np.zeros(keep.shape, ct)
        out = np.zeros(qf.shape[:-1] + vf.shape[-1:], ct)
        grads = (np.zeros_like(qf), np.zeros_like(kf), np.zeros_like(vf))
        if d_out is not None:
            d_out = layout.fold(np.asarray(d_out), k, v, np.broadcast_to)[0].astype(ct)
        for b, h, i in np.ndindex(keep.shape[:3]):
            seen = np.flatnonzero(keep[b, h, i])
            if seen.size == 0:
                continue
            keys, values = kf[b, h // group, seen], vf[b, h // group, seen]
            s = keys @ qf[b, h, i] * ct(scale)
            p = np.exp(s - s.max())
            p /= p.sum()
            weights[b, h, i, seen], out[b, h, i] = p, p @ values
            if d_out is not None:
                self._row_grads(grads, (b, h, i, h // group), seen, p, keys, values, qf,
                                d_out, ct(scale))
        return layout, weights, out, grads

    @staticmethod
    def _row_grads(grads, at, seen, p, keys, values, qf, d_out, scale):
        dq, dk, dv = grads
        b, h, i, g = at
        dv[b, g, seen] += np.outer(p, d_out[b, h, i])
        dp = values @ d_out[b, h, i]
        ds = p * (dp - dp @ p)
        dq[b, h, i] = ds @ keys * scale
        dk[b, g, seen] += np.outer(ds, qf[b, h, i]) * scale

    # ---------------------------------------------------------------- the interface

    @lengths_as_mask
    def attention_weights(self, q, k, *, mask=None, bias=None, sink=None, causal=None,
                          scale=None, softcap=None, window=None):
        layout, weights, _, _ = self._rows(q, k, k[..., :1], mask, causal, window, scale,
                                           refuse=(bias, sink, softcap))
        return layout.restore(weights).astype(np.asarray(q).dtype)

    @lengths_as_mask
    def sdpa(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
             softcap=None, window=None):
        layout, _, out, _ = self._rows(q, k, v, mask, causal, window, scale,
                                       refuse=(bias, sink, softcap))
        return layout.restore(out).astype(np.asarray(q).dtype)

    @lengths_as_mask
    def sdpa_vjp(self, q, k, v, d_out, *, mask=None, bias=None, sink=None, causal=None,
                 scale=None, softcap=None, window=None):
        layout, _, _, grads = self._rows(q, k, v, mask, causal, window, scale, d_out,
                                         refuse=(bias, sink, softcap))
        return tuple(_sum_to(layout.restore(g), np.shape(x)).astype(np.asarray(q).dtype)
                     for g, x in zip(grads, (q, k, v)))

    def multi_head_attention(self, query, key, value, *, w_q, w_k, w_v, w_o, num_heads,
                             num_kv_heads=None, mask=None, causal=None):
        dt, ct = np.asarray(query).dtype, _compute_dtype(query)

        def heads(x, w, n):
            y = np.asarray(x).astype(ct) @ np.asarray(w).astype(ct)
            return np.swapaxes(y.reshape(y.shape[:-1] + (n, -1)), -2, -3)

        q = heads(query, w_q, num_heads)
        k, v = (heads(x, w, num_kv_heads or num_heads) for x, w in ((key, w_k), (value, w_v)))
        out = np.swapaxes(self.sdpa(q, k, v, mask=mask, causal=causal), -2, -3)
        return (out.reshape(out.shape[:-2] + (-1,)) @ np.asarray(w_o).astype(ct)).astype(dt)
