"""The attention cores of the jax backend (backends/jax.py): jitted programs on JAX arrays.

Not a backend itself; imported by backends/jax.py. The cores work in the native op's
layout, (B, T, N, H) for q, k, v and (B, 1 or N, T, S) for mask and bias (rules.Layout
folds the interface's arrays into it and back); the jitted entries take the interface's
arrays and static parameters, so that repeated calls with the same shapes and dtypes
do not retrace.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from . import rules

# --------------------------------------------------------------------------- helpers


def _compute_dtype(dtype):
    """float32 for half types, else the dtype itself (the native op's logits dtype)."""
    return jnp.promote_types(dtype, jnp.float32)


def _fill(dtype):
    """The native op's stand-in for -inf at disallowed positions (-0.7 * max, capped
    at float32's range); mirrored here so composed ops share its policies."""
    big = min(float(jnp.finfo(dtype).max), float(jnp.finfo(jnp.float32).max))
    return jnp.asarray(-0.7 * big, dtype=dtype)


def _native_flags(lq, lk, causal, window):
    """(is_causal, local_window_size, extra_mask) for the native op.

    The native flags align top-left (query i at position i): ``is_causal`` allows
    j <= i and ``local_window_size=(l, r)`` allows i - l <= j <= i + r, which is our
    definition when the offset is 0. Otherwise an explicit mask says the same.
    """
    if rules.causal_offset(lq, lk, causal) != 0:
        return False, None, rules.allowed(lq, lk, causal, window)
    size = None
    if window is not None:
        size = tuple(lq + lk if side is None else side for side in rules.window_sides(window))
    return causal is not None, size, None


def _lift(x, rank):
    return None if x is None else x.reshape((1,) * (rank - x.ndim) + x.shape)


def _pad_last(x, width):
    extra = width - x.shape[-1]
    if extra == 0:
        return x
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)])


def _native_layout(q, k, v, mask, bias):
    """(layout, (q, k, v, mask, bias)): the arrays as the native op takes them, q, k, v
    tokens first (B, T, N, H), mask and bias (B, 1 or N, T, S); layout.restore brings a
    (B, N, T, X) result back."""
    lay = rules.Layout(q, k, v, mask, bias)
    q, k, v = (x.transpose(0, 2, 1, 3) for x in lay.fold(q, k, v, jnp.broadcast_to))
    mask, bias = (lay.scores(x, jnp.broadcast_to, every_row=True) for x in (mask, bias))
    return lay, (q, k, v, mask, bias)


# --------------------------------------------------------------- cores (B, T, N, H)


def _native_core(q, k, v, mask, bias, q_len=None, kv_len=None, *, causal, scale, window,
                 implementation="xla", residual=False):
    """(B, T, N, Dv) from the native op; mask/bias are (B, 1 or N, T, S) or None. With
    residual, also its logsumexp (B, T, N) (return_residual=True)."""
    is_causal, size, extra = _native_flags(q.shape[1], k.shape[1], causal, window)
    if extra is not None:
        extra = jnp.asarray(extra)[None, None]
        mask = extra if mask is None else jnp.logical_and(mask, extra)
    dv = v.shape[-1]
    width = max(q.shape[-1], dv)  # the native op rejects Dv != Dk: pad both to one
    q, k, v = (_pad_last(x, width) for x in (q, k, v))
    out = jax.nn.dot_product_attention(
        q, k, v, bias=bias, mask=mask, scale=scale, is_causal=is_causal,
        local_window_size=size, implementation=implementation, return_residual=residual,
        query_seq_lengths=q_len, key_value_seq_lengths=kv_len)
    if residual:
        out, lse = out
        return out[..., :dv], lse
    return out[..., :dv]


def _composed_weights(q, k, mask, bias, *, causal, scale, softcap, window, lse=False):
    """P (B, N, T, S) by the spec pipeline, in the compute dtype (with lse, and the
    logsumexp (B, N, T) of the same masked scores)."""
    ct = _compute_dtype(q.dtype)
    k = jnp.repeat(k, q.shape[2] // k.shape[2], axis=2)  # head h reads kv h // G
    s = jnp.einsum("btnh,bsnh->bnts", q.astype(ct), k.astype(ct)) * scale
    if softcap is not None:
        s = softcap * jnp.tanh(s / softcap)
    if bias is not None:
        s = s + bias.astype(ct)
    allowed = rules.and_masks(mask, rules.allowed(q.shape[1], k.shape[1], causal, window))
    if allowed is not None:
        s = jnp.where(allowed, s, _fill(ct))
    if lse:
        return jax.nn.softmax(s, axis=-1), jax.nn.logsumexp(s, axis=-1)
    return jax.nn.softmax(s, axis=-1)


def _composed_core(q, k, v, mask, bias, **params):
    p = _composed_weights(q, k, mask, bias, **params)
    v = jnp.repeat(v, q.shape[2] // v.shape[2], axis=2).astype(p.dtype)
    return jnp.einsum("bnts,bsnh->btnh", p, v).astype(q.dtype)


def _sdpa_fn(q, k, v, mask, bias, q_len=None, kv_len=None, *, causal, scale, softcap, window,
             implementation="xla"):
    lay, args = _native_layout(q, k, v, mask, bias)
    if softcap is None:
        out = _native_core(*args, q_len, kv_len, causal=causal, scale=scale, window=window,
                           implementation=implementation)
    else:
        out = _composed_core(*args, causal=causal, scale=scale, softcap=softcap,
                             window=window)
    return lay.restore(out.transpose(0, 2, 1, 3))


def _with_sink(out, lse, sink):
    """A sink (no native form) folded in around the native lse: lse' = logaddexp(lse,
    sink), out' = out exp(lse - lse'), in the compute dtype."""
    ct = _compute_dtype(out.dtype)
    lse = lse.astype(ct)
    if sink is None:
        return out, lse
    total = jnp.logaddexp(lse, jnp.broadcast_to(sink[..., None].astype(ct), lse.shape))
    return (out.astype(ct) * jnp.exp(lse - total)[..., None]).astype(out.dtype), total


def _sdpa_lse_fn(q, k, v, mask, bias, sink, *, causal, scale, softcap, window,
                 implementation="xla", composed=False):
    """(out, lse) at the inputs' rank: the native op's residual, or composed (softcap; and
    composed=True, for gradients: the native residual carries no gradient)."""
    lay, (q4, k4, v4, mask4, bias4) = _native_layout(q, k, v, mask, bias)
    if softcap is None and not composed:
        out, lse = _native_core(q4, k4, v4, mask4, bias4, causal=causal, scale=scale,
                                window=window, implementation=implementation, residual=True)
        lse = lse.transpose(0, 2, 1)
    else:
        p, lse = _composed_weights(q4, k4, mask4, bias4, causal=causal, scale=scale,
                                   softcap=softcap, window=window, lse=True)
        values = jnp.repeat(v4, q4.shape[2] // v4.shape[2], axis=2).astype(p.dtype)
        out = jnp.einsum("bnts,bsnh->btnh", p, values).astype(q.dtype)
    out = lay.restore(out.transpose(0, 2, 1, 3))
    lse = lay.restore(lse[..., None])[..., 0]
    out, lse = _with_sink(out, lse, sink)
    return out, lse.astype(jnp.promote_types(q.dtype, jnp.float32))   # float32 beside half


# ----------------------------------------------------------------- jitted entries

# Under jax.jit the native op fails for float16 on CPU: it asks dot_general for
# precision F16_F16_F32, which the CPU lowering rejects ("The precision 'F16_F16_F32'
# is not supported by dot_general on CPU"), and its try/except fallback to the default
# precision only catches that error when ops run eagerly. Those tests fail, quickly (the
# error comes at lowering, before XLA compiles), and are expected failures with that
# message (backends/expected_failures/jax.yaml), not strict: a platform whose lowering
# accepts F16_F16_F32 (GPUs, by the error text; not run here) passes them.

_STATIC = ("causal", "scale", "softcap", "window", "implementation")

sdpa = jax.jit(_sdpa_fn, static_argnames=_STATIC)


@partial(jax.jit, static_argnames=_STATIC)
def sdpa_vjp(q, k, v, d_out, mask, bias, q_len=None, kv_len=None, *, causal, scale, softcap,
              window, implementation):
    params = dict(causal=causal, scale=scale, softcap=softcap, window=window,
                  implementation=implementation)
    out, pullback = jax.vjp(lambda q, k, v: _sdpa_fn(q, k, v, mask, bias, q_len, kv_len,
                                                     **params),
                            q, k, v)
    return pullback(d_out.astype(out.dtype))


sdpa_lse = jax.jit(_sdpa_lse_fn, static_argnames=_STATIC)


@partial(jax.jit, static_argnames=_STATIC)
def sdpa_sink_vjp(q, k, v, d_out, mask, bias, sink, *, causal, scale, softcap, window,
                   implementation):
    params = dict(causal=causal, scale=scale, softcap=softcap, window=window,
                  implementation=implementation, composed=True)
    out, pullback = jax.vjp(
        lambda q, k, v, sink: _sdpa_lse_fn(q, k, v, mask, bias, sink, **params)[0],
        q, k, v, sink)
    return pullback(d_out.astype(out.dtype))


@partial(jax.jit, static_argnames=_STATIC)
def sink_weights(q, k, mask, bias, sink, *, causal, scale, softcap, window, implementation):
    lay, (q4, k4, _, mask4, bias4) = _native_layout(q, k, k[..., :1], mask, bias)
    p, lse = _composed_weights(q4, k4, mask4, bias4, causal=causal, scale=scale,
                               softcap=softcap, window=window, lse=True)
    p = lay.restore(p)
    p, _ = _with_sink(p, lay.restore(lse[..., None])[..., 0], sink)
    return p.astype(q.dtype)


@partial(jax.jit, static_argnames=_STATIC)
def weights(q, k, mask, bias, *, causal, scale, softcap, window, implementation):
    lay, (q4, k4, _, mask4, bias4) = _native_layout(q, k, k[..., :1], mask, bias)
    p = _composed_weights(q4, k4, mask4, bias4, causal=causal, scale=scale, softcap=softcap,
                          window=window)
    return lay.restore(p.astype(q.dtype))


@partial(jax.jit, static_argnames=("axis",))
def softmax(x, *, axis):
    return jax.nn.softmax(x, axis=axis)


@partial(jax.jit, static_argnames=("kind", "scale"))
def scores(q, k, w, u, v, *, kind, scale):
    dtype, ct = q.dtype, _compute_dtype(q.dtype)
    q, k = q.astype(ct), k.astype(ct)
    kt = jnp.swapaxes(k, -1, -2)
    if kind == "dot":
        s = q @ kt
    elif kind == "scaled_dot":
        s = (q @ kt) * scale
    elif kind == "bilinear":
        s = (q @ w.astype(ct)) @ kt
    else:  # additive: s[i, j] = v . tanh(k_j W + q_i U)
        hidden = (k @ w.astype(ct))[..., None, :, :] + (q @ u.astype(ct))[..., :, None, :]
        s = jnp.tanh(hidden) @ v.astype(ct)
    return s.astype(dtype)


@partial(jax.jit, static_argnames=("causal", "implementation"))
def self_attention(x, w_q, w_k, w_v, mask, *, causal, implementation):
    scale = 1.0 / math.sqrt(w_k.shape[1])
    return _sdpa_fn(x @ w_q, x @ w_k, x @ w_v, mask, None, causal=causal, scale=scale,
                    softcap=None, window=None, implementation=implementation)


@partial(jax.jit, static_argnames=("num_heads", "num_kv_heads", "causal", "implementation"))
def mha(query, key, value, w_q, w_k, w_v, w_o, mask, *, num_heads, num_kv_heads,
         causal, implementation):
    mask_batch = () if mask is None else mask.shape[:-3]
    batch = np.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2],
                                mask_batch)
    b = math.prod(batch)

    def heads(x, w, n):  # (*batch, L, E) @ (E, n*d) -> (B, L, n, d): the native layout
        y = jnp.broadcast_to(x @ w, batch + (x.shape[-2], w.shape[1]))
        return y.reshape((b, x.shape[-2], n, w.shape[1] // n))

    q = heads(query, w_q, num_heads)
    k = heads(key, w_k, num_kv_heads)
    v = heads(value, w_v, num_kv_heads)
    lq, lk = q.shape[1], k.shape[1]
    if mask is not None:
        mask = _lift(mask, len(batch) + 3)
        h = 1 if mask.shape[-3] == 1 else num_heads
        mask = jnp.broadcast_to(mask, batch + (h, lq, lk)).reshape((b, h, lq, lk))
    out = _native_core(q, k, v, mask, None, causal=causal, window=None,
                       scale=1.0 / math.sqrt(q.shape[-1]), implementation=implementation)
    return out.reshape(batch + (lq, -1)) @ w_o


