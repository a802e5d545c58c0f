"""The attention cores of the tensorflow backend (backends/tensorflow.py), on tf tensors:
keras.ops.dot_product_attention in its (B, T, N, H) layout, and the composed paths
(softcap, which Keras supports on JAX/TPU only; the lse and sinks, which it has none of).

Not a backend itself; imported by backends/tensorflow.py, after it has set Keras on its
TensorFlow backend.
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf

from . import rules

# The value keras.ops.dot_product_attention (TF backend) writes into masked logits;
# the composed paths use the same, so they follow the same declared policy.
_LARGE_NEGATIVE = -0.7 * 3.38953e38


def composed_lse(q, k, v, *, mask, bias, sink, causal, scale, softcap, window):
    """(softmax(s) v, lse(s)) of the score pipeline s with tf ops, in the interface layout.

    Keras has no op returning the lse, and none with a sink; the sink is one more score
    column (a key of value 0). Disallowed logits are replaced (tf.where) by the value
    keras.ops.dot_product_attention writes, so the declared policies hold: a row without
    keys is uniform (its lse is log(Lk), that of Lk equal scores), an all -inf bias row
    NaN, a NaN at a masked key ignored. float16 / bfloat16 compute in float32.
    """
    dtype = q.dtype
    work = tf.float64 if dtype == tf.float64 else tf.float32
    q, k, v = (tf.cast(x, work) for x in (q, k, v))
    lq, lk = q.shape[-2], k.shape[-2]
    if q.shape.rank >= 3 and k.shape.rank >= 3 and v.shape.rank >= 3:
        hq, hk = q.shape[-3], k.shape[-3]
        if hk > 1 and hq != hk and hq % hk == 0:  # grouped-query: kv head h // group
            k, v = (tf.repeat(x, hq // hk, axis=-3) for x in (k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    s = tf.matmul(q, k, transpose_b=True) * tf.constant(scale, work)
    if softcap is not None:
        if softcap <= 0:
            raise ValueError(f"softcap must be positive, got {softcap}")
        s = softcap * tf.tanh(s / softcap)
    if bias is not None:
        s = s + tf.cast(bias, work)
    allowed = rules.and_masks(mask, rules.allowed(lq, lk, causal, window))
    empty = None
    if allowed is not None:
        full = np.broadcast_to(allowed, np.broadcast_shapes(allowed.shape, tuple(s.shape)))
        s = tf.where(tf.constant(full), s, tf.constant(_LARGE_NEGATIVE, work))
        empty = tf.constant(~full.any(axis=-1))
    if sink is not None:
        col = tf.cast(sink, work)[..., None, None]
        shape = tf.broadcast_dynamic_shape(tf.shape(s)[:-1], tf.shape(col)[:-1])
        s = tf.concat([tf.broadcast_to(s, tf.concat([shape, [lk]], 0)),
                       tf.broadcast_to(col, tf.concat([shape, [1]], 0))], axis=-1)
        empty = None  # the sink is always allowed: no row is empty
    m = tf.stop_gradient(tf.reduce_max(s, axis=-1, keepdims=True))
    e = tf.exp(s - m)
    total = tf.reduce_sum(e, axis=-1, keepdims=True)
    p = e / total
    lse = tf.math.log(total[..., 0])
    shifted = lse + m[..., 0]
    lse = shifted if empty is None else tf.where(empty, lse, shifted)
    out = tf.matmul(p[..., :lk], v)
    return tf.cast(out, dtype), tf.cast(lse, dtype), tf.cast(p[..., :lk], dtype)


# ---------------------------------------------------------------- masks and shapes


def structural_mask(lq: int, lk: int, causal, window, native: bool = True):
    """(mask, native_causal): Keras' own is_causal where it says the same (top-left
    causal, or bottom-right with Lq == Lk) and native allows it; the rest of causal and
    the window as a boolean (Lq, Lk) mask (rules.allowed), or None."""
    native_causal = native and (causal == "top_left" or (causal == "bottom_right" and lq == lk))
    return rules.allowed(lq, lk, None if native_causal else causal, window), native_causal


def to_4d(arr, batch: tuple, heads: int, lq: int, lk: int):
    """(*b, h, Lq, Lk)-broadcastable array -> (B or 1, heads or 1, Lq, Lk)."""
    if arr is None:
        return None
    arr = np.asarray(arr)
    rank = len(batch) + 3
    arr = arr.reshape((1,) * (rank - arr.ndim) + arr.shape)
    b = batch if any(d != 1 for d in arr.shape[:-3]) else (1,) * len(batch)
    h = heads if arr.shape[-3] != 1 else 1
    arr = np.broadcast_to(arr, b + (h, lq, lk))
    return np.ascontiguousarray(arr).reshape(math.prod(b), h, lq, lk)


class _Plan:
    """Shapes of one sdpa call: broadcast batch dims, heads, grouped-query."""

    def __init__(self, q, k, v, mask, bias):
        self.lq, self.dk = q.shape[-2:]
        self.lk, self.dv = k.shape[-2], v.shape[-1]
        hq = q.shape[-3] if q.ndim >= 3 else 1
        hk = k.shape[-3] if k.ndim >= 3 else 1
        self.gqa = q.ndim >= 3 and k.ndim >= 3 and v.ndim >= 3 and hk > 1 \
            and hq != hk and hq % hk == 0
        kv_lead = [k.shape[:-2], v.shape[:-2]]
        if self.gqa:  # kv heads count as q's heads for broadcasting
            kv_lead = [s[:-1] + (hq,) for s in kv_lead]
        extra = [np.shape(a)[:-2] for a in (mask, bias) if a is not None]
        self.lead = tuple(np.broadcast_shapes(q.shape[:-2], *kv_lead, *extra))
        self.batch = self.lead[:-1] if self.lead else ()
        self.heads = self.lead[-1] if self.lead else 1
        self.kv_heads = hk if self.gqa else self.heads
        self.b = math.prod(self.batch)

    def full(self, heads: int, length: int, dim: int):
        return self.batch + (heads, length, dim)


def to_bthd(x, full: tuple, b: int):
    """Broadcast to (*batch, H, L, D), flatten batch, move tokens before heads."""
    x = tf.reshape(tf.broadcast_to(x, full), (b,) + full[-3:])
    return tf.transpose(x, (0, 2, 1, 3))


def _from_bthd(x, plan: _Plan):
    x = tf.transpose(x, (0, 2, 1, 3))  # (B, H, Lq, D)
    return tf.reshape(x, plan.lead + (plan.lq, x.shape[-1]))


# ---------------------------------------------------------------- attention cores


def composed_probs(q, k, bias, mask, scale, softcap):
    """The score pipeline built from keras.ops, mirroring keras' precision choices.

    Used only for softcap, which keras.ops.dot_product_attention supports on JAX/TPU
    only. ``q, k``: (B, T, N, H); returns P: (B, N, T, S) in the input dtype.
    """
    n, nk = q.shape[2], k.shape[2]
    if nk != n:
        k = keras.ops.repeat(k, n // nk, axis=2)
    logits = keras.ops.einsum("BTNH,BSNH->BNTS", q, k)
    work = "float64" if q.dtype == tf.float64 else "float32"
    logits = keras.ops.cast(logits, work) * scale
    logits = softcap * keras.ops.tanh(logits / softcap)
    if bias is not None:
        logits = logits + keras.ops.cast(bias, work)
    if mask is not None:
        logits = keras.ops.where(mask, logits, keras.ops.cast(_LARGE_NEGATIVE, work))
    return keras.ops.cast(keras.ops.softmax(logits, axis=-1), q.dtype)


def scale_tensor(scale, dk: int, dtype):
    """The scale as a tensor of the logits' dtype.

    keras.ops.dot_product_attention computes its default 1/sqrt(Dk) in float32 and
    converts a Python-float scale through float32 (tf.cast), which costs float64
    inputs ~1e-8 relative error; a float64 tensor keeps the scale exact.
    """
    value = 1.0 / math.sqrt(dk) if scale is None else float(scale)
    return tf.constant(value, dtype=tf.float64 if dtype == tf.float64 else tf.float32)


def attend(q, k, v, mask, bias, *, plan: _Plan, scale, native_causal, softcap):
    """sdpa on tensors of the caller's shapes; returns (*lead, Lq, Dv)."""
    qh = to_bthd(q, plan.full(plan.heads, plan.lq, plan.dk), plan.b)
    kh = to_bthd(k, plan.full(plan.kv_heads, plan.lk, plan.dk), plan.b)
    vh = to_bthd(v, plan.full(plan.kv_heads, plan.lk, plan.dv), plan.b)
    scale = scale_tensor(scale, plan.dk, qh.dtype)
    if softcap is None:
        out = keras.ops.dot_product_attention(
            qh, kh, vh, bias=bias, mask=mask, scale=scale,
            is_causal=native_causal, flash_attention=None)
    else:
        probs = composed_probs(qh, kh, bias, mask, scale, softcap)
        if plan.kv_heads != plan.heads:
            vh = keras.ops.repeat(vh, plan.heads // plan.kv_heads, axis=2)
        out = keras.ops.einsum("BNTS,BSNH->BTNH", probs, vh)
    return _from_bthd(out, plan)


def prepare(q, k, v, mask, bias, causal, window, softcap):
    """Plan, 4-D mask and bias, and whether Keras' is_causal can be used."""
    plan = _Plan(q, k, v, mask, bias)
    # the composed softcap path has no is_causal
    structural, native_causal = structural_mask(plan.lq, plan.lk, causal, window,
                                                native=softcap is None)
    combined = rules.and_masks(None if mask is None else np.asarray(mask, dtype=bool),
                               structural)
    mask4 = to_4d(combined, plan.batch, plan.heads, plan.lq, plan.lk)
    bias4 = to_4d(bias, plan.batch, plan.heads, plan.lq, plan.lk)
    return plan, mask4, bias4, native_causal

