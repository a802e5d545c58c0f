"""JAX backend: certifies ``jax.nn.dot_product_attention`` against the specification.

The adapter is thin: NumPy in, the framework's own public op, NumPy out. Paths per op:

- ``sdpa``: native ``jax.nn.dot_product_attention(implementation="xla")`` with
  ``mask=``, ``bias=``, ``scale=``, ``is_causal=`` (top-left; also bottom-right when
  Lq == Lk) and ``local_window_size=`` (when the window's offset is 0). Bottom-right
  causal with Lq != Lk and its windows go in as an explicit boolean ``mask=``.
  Grouped-query is native (N_q a multiple of N_kv). The native op wants value and
  key of one head width, so Dv != Dk is zero-padded to a common width (exact: the
  padding adds 0·0 terms to q·k and zero columns to the output, which are dropped).
  With ``softcap`` (no native parameter) it is composed from jax.numpy.
- ``sdpa_vjp``: ``jax.vjp`` of exactly the ``sdpa`` path.
- ``sdpa_lse``: native, the same call with ``return_residual=True`` (its logsumexp, in
  float32); with ``softcap``, ``jax.nn.logsumexp`` of the composed scores.
- ``sink`` (attention_weights, sdpa, sdpa_lse, sdpa_vjp): JAX has none; composed around
  the native lse, ``lse' = logaddexp(lse, sink)``, ``out' = out exp(lse - lse')``. For
  ``sdpa_vjp`` with a sink the whole forward is composed (jax.numpy scores,
  ``jax.nn.logsumexp``) and ``jax.vjp`` runs through it: the native op's residual
  carries no gradient (``jax.grad`` of its logsumexp is 0, a finding), so ``d_sink``
  and the sink's share of dq, dk cannot come through it.
- ``attention_weights``: composed (JAX exposes no probability matrix), masking the
  way the native op does (a large negative fill, not -inf), so that its policies are
  the native op's.
- ``softmax``: native ``jax.nn.softmax``.
- ``scores``: composed from jax.numpy (JAX has no score-function API).
- ``self_attention``: ``x @ w`` projections, then the ``sdpa`` path.
- ``multi_head_attention``: JAX itself has no MHA layer (it lives in flax), so
  projections, head split and ``w_o`` are composed around the native
  ``dot_product_attention`` (which takes (B, T, N, H) heads directly and does GQA).

Layout: the interface is ``(*batch, heads, L, D)``; the native op is ``(B, T, N, H)``
(tokens before heads). Leading dims are broadcast and flattened into B, dim -3 is N.

Constructing the backend turns on ``jax_enable_x64`` (a process-wide JAX setting),
without which JAX silently computes float64 inputs in float32.

Composed ops compute float16/bfloat16 in float32 (as the native op does for its
logits) and round once to the input dtype. Jitted functions are module-level with
static parameters, so repeated calls with the same shapes and dtypes do not retrace.

Known differences of the native op from the specification (jax 0.10.2, CPU):
- its softmax always runs in float32, so float64 sdpa/sdpa_vjp/self_attention/MHA
  are only float32-accurate (relative error ~1e-7);
- it masks with a finite -0.7*max, not -inf: when a row's allowed keys all carry a
  -inf bias, the masked-out keys get the weight (1/number masked), not 0;
- under jax.jit it fails for float16 on CPU (see the comment above the jitted entries);
- it rejects Dv != Dk (worked around here by exact zero-padding).
"""

from __future__ import annotations

import contextlib
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from . import _lengths

DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})
CAUSAL = (None, "top_left", "bottom_right")


# --------------------------------------------------------------------------- helpers


def _compute_dtype(dtype):
    """float32 for half types, else the dtype itself (the native op's logits dtype)."""
    return jnp.promote_types(dtype, jnp.float32)


def _fill(dtype):
    """The native op's stand-in for -inf at disallowed positions (-0.7 * max, capped
    at float32's range); mirrored here so composed ops share its policies."""
    big = min(float(jnp.finfo(dtype).max), float(jnp.finfo(jnp.float32).max))
    return jnp.asarray(-0.7 * big, dtype=dtype)


def _open(side):
    return side is None or side < 0


def _structural_mask(lq, lk, causal, window):
    """Boolean (lq, lk): keys that causal and window allow, or None if neither is set."""
    if causal is None and window is None:
        return None
    offset = lk - lq if causal == "bottom_right" else 0
    i = np.arange(lq)[:, None] + offset
    j = np.arange(lk)[None, :]
    allowed = np.ones((lq, lk), dtype=bool)
    if causal is not None:
        allowed &= j <= i
    if window is not None:
        left, right = window
        if not _open(left):
            allowed &= j >= i - left
        if not _open(right):
            allowed &= j <= i + right
    return allowed


def _native_flags(lq, lk, causal, window):
    """(is_causal, local_window_size, extra_mask) for the native op.

    The native flags align top-left (query i at position i): ``is_causal`` allows
    j <= i and ``local_window_size=(l, r)`` allows i - l <= j <= i + r, which is our
    definition when the offset is 0. Otherwise an explicit mask says the same.
    """
    offset = lk - lq if causal == "bottom_right" else 0
    if offset != 0:
        return False, None, _structural_mask(lq, lk, causal, window)
    size = None
    if window is not None:
        size = tuple(lq + lk if _open(w) else int(w) for w in window)
    return causal is not None, size, None


def _lift(x, rank):
    return None if x is None else x.reshape((1,) * (rank - x.ndim) + x.shape)


def _pad_last(x, width):
    extra = width - x.shape[-1]
    if extra == 0:
        return x
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)])




class _Layout:
    """Moves (*batch, heads, L, D) inputs to the native (B, T, N, H) layout and back."""

    def __init__(self, q, k, v, mask, bias):
        extras = [x for x in (mask, bias) if x is not None]
        self.rank_out = max(2, q.ndim, k.ndim, v.ndim, *(x.ndim for x in extras))
        rank = max(3, self.rank_out)
        q, k, v, mask, bias = (_lift(x, rank) for x in (q, k, v, mask, bias))
        extras = [x for x in (mask, bias) if x is not None]
        hq = np.broadcast_shapes(*((x.shape[-3],) for x in (q, *extras)))[0]
        hkv = np.broadcast_shapes((k.shape[-3],), (v.shape[-3],))[0]
        if hq == 1:
            hq = hkv
        if hq % hkv:
            raise ValueError(f"{hq} query heads cannot share {hkv} key/value heads")
        self.batch = np.broadcast_shapes(*(x.shape[:-3] for x in (q, k, v, *extras)))
        self.b = math.prod(self.batch)
        self.hq, self.lq, self.lk = hq, q.shape[-2], k.shape[-2]
        self.q = self._tokens_first(q, hq)
        self.k = self._tokens_first(k, hkv)
        self.v = self._tokens_first(v, hkv)
        self.mask, self.bias = self._scores_shape(mask), self._scores_shape(bias)

    def _tokens_first(self, x, heads):
        x = jnp.broadcast_to(x, self.batch + (heads,) + x.shape[-2:])
        return x.reshape((self.b, heads) + x.shape[-2:]).transpose(0, 2, 1, 3)

    def _scores_shape(self, x):
        """(B, 1 or N, T, S), as the native op takes mask and bias."""
        if x is None:
            return None
        heads = 1 if x.shape[-3] == 1 else self.hq
        return jnp.broadcast_to(x, self.batch + (heads, self.lq, self.lk)).reshape(
            (self.b, heads, self.lq, self.lk))

    def restore(self, x):
        """(B, N, T, X) -> (*batch, N, T, X) at the rank the inputs broadcast to."""
        full = self.batch + x.shape[1:]
        return x.reshape(full[len(full) - self.rank_out:])


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
    allowed = _structural_mask(q.shape[1], k.shape[1], causal, window)
    if mask is not None:
        allowed = mask if allowed is None else jnp.logical_and(mask, allowed)
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
    lay = _Layout(q, k, v, mask, bias)
    args = (lay.q, lay.k, lay.v, lay.mask, lay.bias)
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
    lay = _Layout(q, k, v, mask, bias)
    if softcap is None and not composed:
        out, lse = _native_core(lay.q, lay.k, lay.v, lay.mask, lay.bias, causal=causal,
                                scale=scale, window=window, implementation=implementation,
                                residual=True)
        lse = lse.transpose(0, 2, 1)
    else:
        p, lse = _composed_weights(lay.q, lay.k, lay.mask, lay.bias, causal=causal,
                                   scale=scale, softcap=softcap, window=window, lse=True)
        values = jnp.repeat(lay.v, lay.q.shape[2] // lay.v.shape[2], axis=2).astype(p.dtype)
        out = jnp.einsum("bnts,bsnh->btnh", p, values).astype(q.dtype)
    out = lay.restore(out.transpose(0, 2, 1, 3))
    lse = lay.restore(lse[..., None])[..., 0]
    out, lse = _with_sink(out, lse, sink)
    return out, lse.astype(q.dtype)


# ----------------------------------------------------------------- jitted entries

# Under jax.jit the native op fails for float16 on CPU: it asks dot_general for
# precision F16_F16_F32, which the CPU lowering rejects ("The precision 'F16_F16_F32'
# is not supported by dot_general on CPU"), and its try/except fallback to the default
# precision only catches that error when ops run eagerly. Those tests fail, quickly (the
# error comes at lowering, before XLA compiles), and are expected failures with that
# message (backends/expected_failures/jax.yaml), not strict: a platform whose lowering
# accepts F16_F16_F32 (GPUs, by the error text; not run here) passes them.

_STATIC = ("causal", "scale", "softcap", "window", "implementation")

_sdpa = jax.jit(_sdpa_fn, static_argnames=_STATIC)


@partial(jax.jit, static_argnames=_STATIC)
def _sdpa_vjp(q, k, v, d_out, mask, bias, q_len=None, kv_len=None, *, causal, scale, softcap,
              window, implementation):
    params = dict(causal=causal, scale=scale, softcap=softcap, window=window,
                  implementation=implementation)
    out, pullback = jax.vjp(lambda q, k, v: _sdpa_fn(q, k, v, mask, bias, q_len, kv_len,
                                                     **params),
                            q, k, v)
    return pullback(d_out.astype(out.dtype))


_sdpa_lse = jax.jit(_sdpa_lse_fn, static_argnames=_STATIC)


@partial(jax.jit, static_argnames=_STATIC)
def _sdpa_sink_vjp(q, k, v, d_out, mask, bias, sink, *, causal, scale, softcap, window,
                   implementation):
    params = dict(causal=causal, scale=scale, softcap=softcap, window=window,
                  implementation=implementation, composed=True)
    out, pullback = jax.vjp(
        lambda q, k, v, sink: _sdpa_lse_fn(q, k, v, mask, bias, sink, **params)[0],
        q, k, v, sink)
    return pullback(d_out.astype(out.dtype))


@partial(jax.jit, static_argnames=_STATIC)
def _sink_weights(q, k, mask, bias, sink, *, causal, scale, softcap, window, implementation):
    lay = _Layout(q, k, k[..., :1], mask, bias)
    p, lse = _composed_weights(lay.q, lay.k, lay.mask, lay.bias, causal=causal, scale=scale,
                               softcap=softcap, window=window, lse=True)
    p = lay.restore(p)
    p, _ = _with_sink(p, lay.restore(lse[..., None])[..., 0], sink)
    return p.astype(q.dtype)


@partial(jax.jit, static_argnames=_STATIC)
def _weights(q, k, mask, bias, *, causal, scale, softcap, window, implementation):
    lay = _Layout(q, k, k[..., :1], mask, bias)
    p = _composed_weights(lay.q, lay.k, lay.mask, lay.bias, causal=causal, scale=scale,
                          softcap=softcap, window=window)
    return lay.restore(p.astype(q.dtype))


@partial(jax.jit, static_argnames=("axis",))
def _softmax(x, *, axis):
    return jax.nn.softmax(x, axis=axis)


@partial(jax.jit, static_argnames=("kind", "scale"))
def _scores(q, k, w, u, v, *, kind, scale):
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
def _self_attention(x, w_q, w_k, w_v, mask, *, causal, implementation):
    scale = 1.0 / math.sqrt(w_k.shape[1])
    return _sdpa_fn(x @ w_q, x @ w_k, x @ w_v, mask, None, causal=causal, scale=scale,
                    softcap=None, window=None, implementation=implementation)


@partial(jax.jit, static_argnames=("num_heads", "num_kv_heads", "causal", "implementation"))
def _mha(query, key, value, w_q, w_k, w_v, w_o, mask, *, num_heads, num_kv_heads,
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


# -------------------------------------------------------------------- validation


def _arrays(*xs):
    """NumPy views of the inputs (never copies, never modified); None passes."""
    return tuple(None if x is None else np.asarray(x) for x in xs)


def _check_dtype(x):
    if x.dtype.name not in DTYPES:
        raise NotImplementedError(f"jax backend: dtype {x.dtype} is not supported")


def _check_causal(causal):
    if causal not in CAUSAL:
        raise ValueError(f"causal must be one of {CAUSAL}, got {causal!r}")


def _window(window):
    if window is None:
        return None
    left, right = window
    return tuple(None if w is None else int(w) for w in (left, right))


def _mask(mask):
    return None if mask is None else np.asarray(mask, dtype=bool)


def _result(x):
    """A fresh NumPy array (never a JAX array, never a view of a buffer)."""
    return np.array(x, copy=True)


def _sdpa_params(q, causal, scale, softcap, window, implementation):
    _check_dtype(q)
    _check_causal(causal)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    softcap = None if softcap is None else float(softcap)
    return dict(causal=causal, scale=scale, softcap=softcap, window=_window(window),
                implementation=implementation)


def _native_lengths(q, k, mask, causal, window, q_lengths, kv_lengths, softcap):
    """(mask, causal, window, q_len, kv_len) for jax.nn.dot_product_attention's
    query_seq_lengths / key_value_seq_lengths (int32 per element of the flattened batch).

    Its is_causal and local_window_size count from the top left of the padded T x S, as
    top_left does; a bottom_right offset differs per batch element (kv_lengths[b] -
    q_lengths[b]), so that causal and window go into the boolean mask instead."""
    if q_lengths is None and kv_lengths is None:
        return mask, causal, window, None, None
    if softcap is not None:
        raise NotImplementedError("jax backend: softcap with q_lengths/kv_lengths is not "
                                  "composed")
    if causal == "bottom_right":
        mask, _ = _lengths.compose(q.shape, k.shape, mask, causal, window, q_lengths,
                                   kv_lengths)
        causal, window = None, None
    per = math.prod(q.shape[1:-3])       # batch dims after dim 0, flattened by _Layout
    lengths = [None if n is None else np.repeat(np.asarray(n, dtype=np.int32), per)
               for n in (q_lengths, kv_lengths)]
    return (mask, causal, window, *lengths)


def _no_sink_with_lengths(q_lengths, kv_lengths):
    if q_lengths is not None or kv_lengths is not None:
        raise NotImplementedError("jax backend: a sink with q_lengths/kv_lengths is not "
                                  "composed")


def _with_heads(method):
    """Run sdpa or sdpa_vjp with lengths on (B, L, D) inputs as (B, 1, L, D): the native
    op's lengths index B, and _Layout reads a rank-3 input's dim 0 as heads."""
    def wrapper(self, q, k, v, *rest, mask=None, bias=None, **params):
        lengths = params.get("q_lengths") is not None or params.get("kv_lengths") is not None
        if not lengths or np.ndim(q) != 3:
            return method(self, q, k, v, *rest, mask=mask, bias=bias, **params)
        lift = [None if x is None else (np.expand_dims(x, -3) if np.ndim(x) == 3 else x)
                for x in (q, k, v, *rest, mask, bias)]
        *arrays, mask, bias = lift
        result = method(self, *arrays, mask=mask, bias=bias, **params)
        if isinstance(result, tuple):
            return tuple(np.squeeze(r, axis=-3) for r in result)
        return np.squeeze(result, axis=-3)
    wrapper.__name__, wrapper.__doc__ = method.__name__, method.__doc__
    return wrapper


# ----------------------------------------------------------------------- backend


def _device(name, device, gpu_only=False):
    """The JAX device a backend runs on; a device this machine lacks is refused here,
    at construction (so at load), never silently replaced by the CPU."""
    if device is None:
        device = "gpu" if gpu_only else "cpu"
    platform, _, index = str(device).partition(":")
    if platform not in ("cpu", "gpu") or (index and not index.isdigit()):
        raise ValueError(f"{name}: unknown device {device!r}; jax backends take cpu, gpu "
                         "or gpu:N")
    if gpu_only and platform == "cpu":
        raise RuntimeError(f"{name} is cuDNN's attention, a GPU kernel: it cannot run on "
                           f"device {device!r}")
    try:
        devices = jax.devices(platform)
    except RuntimeError as exc:
        raise RuntimeError(f"{name} needs a GPU ({device!r}); jax.devices('gpu') finds "
                           f"none: {exc}") from None
    if int(index or 0) >= len(devices):
        raise RuntimeError(f"{name}: no device {device!r}; JAX sees {len(devices)} "
                           f"{platform} device(s)")
    return devices[int(index or 0)]


class JaxBackend:
    """The attention interface on JAX (see the module docstring for each op's path).

    ``device``: ``"cpu"`` (the default), ``"gpu"`` or ``"gpu:N"``; every op runs under
    ``jax.default_device`` of it. ``implementation`` is what the native op is asked for.
    """

    name = "jax"
    dtypes = DTYPES
    # Determined empirically on jax 0.10.2 (XLA implementation): the native op masks
    # with a large finite negative, so a fully masked row gets equal logits (uniform
    # weights, the mean of V) and a NaN key at a masked position is overwritten; an
    # all -inf bias row is softmax(-inf, ..., -inf) = NaN; a masked NaN value still
    # meets a weight of 0 in P @ V, and 0 * NaN = NaN.
    policy = {
        "fully_masked_rows": "uniform",
        "neg_inf_bias_rows": "nan",
        "masked_key_nan": "ignored",
        "masked_value_nan": "propagates",
        "accumulation": "float32",
        # a padded query (past q_lengths) gets output, weight and dq rows of 0
        "padded_query_rows": "zeros",
    }
    paths = {
        "softmax": "native: jax.nn.softmax",
        "scores": "composed: jax.numpy matmul/tanh (no score-function API in JAX)",
        "attention_weights": "composed: jax.numpy pipeline with the native op's "
                             "masking (JAX exposes no attention weights)",
        "sdpa": "native: jax.nn.dot_product_attention(implementation='xla'); "
                "composed from jax.numpy only with softcap (no such parameter); "
                "q_lengths/kv_lengths as its query_seq_lengths/key_value_seq_lengths, "
                "a bottom_right causal or window with them as a mask (no native "
                "per-batch offset)",
        "self_attention": "native: x @ w projections, then "
                          "jax.nn.dot_product_attention",
        "multi_head_attention": "native: composed projections/heads/w_o around "
                                "jax.nn.dot_product_attention (MHA layers live in "
                                "flax, not jax)",
        "sdpa_vjp": "native: jax.vjp of the sdpa path (lengths as in sdpa); composed "
                    "(jax.numpy, jax.vjp) with a sink, since the native residual carries no "
                    "gradient",
        "sdpa_lse": "native: jax.nn.dot_product_attention(return_residual=True); composed "
                    "with softcap; a sink composed around the native lse (JAX has none)",
    }

    implementation = "xla"
    gpu_only = False

    def __init__(self, device=None):
        # Without x64, JAX silently demotes float64 inputs to float32.
        jax.config.update("jax_enable_x64", True)
        import jaxlib
        self.device = _device(self.name, device, self.gpu_only)
        self.versions = {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
                         "device": f"{self.device.platform}:{self.device.id} "
                                   f"({self.device.device_kind})"}

    def _running(self):
        """The context every op runs in: JAX's arrays and programs on the device."""
        return jax.default_device(self.device)

    def softmax(self, x, axis=-1):
        with self._running():
            (x,) = _arrays(x)
            _check_dtype(x)
            return _result(_softmax(x, axis=int(axis)))

    def scores(self, q, k, *, kind, scale=None, w=None, u=None, v=None):
        with self._running():
            q, k, w, u, v = _arrays(q, k, w, u, v)
            _check_dtype(q)
            needed = {"dot": (), "scaled_dot": (), "bilinear": ("w",),
                      "additive": ("w", "u", "v")}
            if kind not in needed:
                raise ValueError(f"unknown score kind {kind!r}")
            given = {"w": w, "u": u, "v": v}
            missing = [n for n in needed[kind] if given[n] is None]
            if missing:
                raise ValueError(f"score kind {kind!r} needs {', '.join(missing)}")
            scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
            return _result(_scores(q, k, w, u, v, kind=kind, scale=scale))

    @_lengths.as_mask
    def attention_weights(self, q, k, *, mask=None, bias=None, sink=None, causal=None,
                          scale=None, softcap=None, window=None):
        with self._running():
            q, k, bias, sink = _arrays(q, k, bias, sink)
            params = _sdpa_params(q, causal, scale, softcap, window, self.implementation)
            if sink is not None:
                return _result(_sink_weights(q, k, _mask(mask), bias, sink, **params))
            return _result(_weights(q, k, _mask(mask), bias, **params))

    @_with_heads
    def sdpa(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
             softcap=None, window=None, q_lengths=None, kv_lengths=None):
        if sink is not None:
            _no_sink_with_lengths(q_lengths, kv_lengths)
            return self.sdpa_lse(q, k, v, mask=mask, bias=bias, sink=sink, causal=causal,
                                 scale=scale, softcap=softcap, window=window)[0]
        with self._running():
            q, k, v, bias = _arrays(q, k, v, bias)
            mask, causal, window, *lengths = _native_lengths(
                q, k, mask, causal, window, q_lengths, kv_lengths, softcap)
            params = _sdpa_params(q, causal, scale, softcap, window, self.implementation)
            return _result(_sdpa(q, k, v, _mask(mask), bias, *lengths, **params))

    def sdpa_lse(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
                 softcap=None, window=None):
        with self._running():
            q, k, v, bias, sink = _arrays(q, k, v, bias, sink)
            params = _sdpa_params(q, causal, scale, softcap, window, self.implementation)
            return tuple(_result(x) for x in _sdpa_lse(q, k, v, _mask(mask), bias, sink,
                                                       **params))

    @_with_heads
    def sdpa_vjp(self, q, k, v, d_out, *, mask=None, bias=None, sink=None, causal=None,
                 scale=None, softcap=None, window=None, q_lengths=None, kv_lengths=None):
        if sink is not None:
            _no_sink_with_lengths(q_lengths, kv_lengths)
        with self._running():
            q, k, v, d_out, bias, sink = _arrays(q, k, v, d_out, bias, sink)
            mask, causal, window, *lengths = _native_lengths(
                q, k, mask, causal, window, q_lengths, kv_lengths, softcap)
            params = _sdpa_params(q, causal, scale, softcap, window, self.implementation)
            if sink is not None:
                grads = _sdpa_sink_vjp(q, k, v, d_out, _mask(mask), bias, sink, **params)
            else:
                grads = _sdpa_vjp(q, k, v, d_out, _mask(mask), bias, *lengths, **params)
            return tuple(_result(g) for g in grads)

    def self_attention(self, x, w_q, w_k, w_v, *, mask=None, causal=None):
        with self._running():
            x, w_q, w_k, w_v = _arrays(x, w_q, w_k, w_v)
            _check_dtype(x)
            _check_causal(causal)
            return _result(_self_attention(x, w_q, w_k, w_v, _mask(mask), causal=causal,
                                           implementation=self.implementation))

    def multi_head_attention(self, query, key, value, *, w_q, w_k, w_v, w_o, num_heads,
                             num_kv_heads=None, mask=None, causal=None):
        with self._running():
            query, key, value, w_q, w_k, w_v, w_o = _arrays(
                query, key, value, w_q, w_k, w_v, w_o)
            _check_dtype(query)
            _check_causal(causal)
            num_heads = int(num_heads)
            num_kv_heads = num_heads if num_kv_heads is None else int(num_kv_heads)
            if num_heads % num_kv_heads:
                raise ValueError(f"{num_heads} heads cannot share {num_kv_heads} kv heads")
            for w, n, what in ((w_q, num_heads, "w_q"), (w_k, num_kv_heads, "w_k"),
                               (w_v, num_kv_heads, "w_v")):
                if w.shape[1] % n:
                    raise ValueError(f"{what} width {w.shape[1]} is not a multiple of {n}")
            return _result(_mha(query, key, value, w_q, w_k, w_v, w_o, _mask(mask),
                                num_heads=num_heads, num_kv_heads=num_kv_heads,
                                causal=causal, implementation=self.implementation))


# ------------------------------------------------------------------- jax-cudnn


def _from_cudnn(exc) -> bool:
    """Was exc raised by the cuDNN implementation's own checks (jax/_src/cudnn/...)?"""
    tb = exc.__traceback__
    while tb is not None:
        if "cudnn" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return "cuDNN" in str(exc)


class JaxCudnnBackend(JaxBackend):
    """``jax.nn.dot_product_attention(implementation="cudnn")``: cuDNN's fused attention,
    on a GPU only (the default device is ``gpu``; there is no CPU cuDNN).

    The ops that reach the native op (sdpa, sdpa_vjp, self_attention,
    multi_head_attention) ask it for ``implementation="cudnn"``; what cuDNN refuses
    (dtypes other than float16/bfloat16, head sizes, masks, windows...) raises
    ``NotImplementedError`` with cuDNN's reason, so those tests are unsupported, never
    run by XLA instead. The composed ops (softmax, scores, attention_weights, softcap)
    call no cuDNN and are the jax backend's to certify: unsupported here too.
    """

    name = "jax-cudnn"
    implementation = "cudnn"
    gpu_only = True
    paths = {
        "softmax": "not run: calls no cuDNN kernel (the jax backend certifies it)",
        "scores": "not run: calls no cuDNN kernel (the jax backend certifies it)",
        "attention_weights": "not run: composed in JAX, calls no cuDNN kernel",
        "sdpa": "native: jax.nn.dot_product_attention(implementation='cudnn'); "
                "softcap not run (no such parameter)",
        "self_attention": "native: x @ w projections, then "
                          "jax.nn.dot_product_attention(implementation='cudnn')",
        "multi_head_attention": "native: composed projections/heads/w_o around "
                                "jax.nn.dot_product_attention(implementation='cudnn')",
        "sdpa_vjp": "native: jax.vjp of the sdpa path (cuDNN's backward)",
    }

    @contextlib.contextmanager
    def _running(self):
        try:
            with super()._running():
                yield
        except (ValueError, NotImplementedError, RuntimeError) as exc:
            if not _from_cudnn(exc):
                raise
            raise NotImplementedError(f"jax-cudnn: cuDNN refused this input: "
                                      f"{type(exc).__name__}: {exc}") from None

    def _composed(self, op):
        raise NotImplementedError(f"jax-cudnn: {op} calls no cuDNN kernel (composed in JAX; "
                                  "certified by the jax backend)")

    def softmax(self, x, axis=-1):
        self._composed("softmax")

    def scores(self, q, k, **params):
        self._composed("scores")

    def attention_weights(self, q, k, **params):
        self._composed("attention_weights")

    def sdpa(self, q, k, v, *, softcap=None, **params):
        if softcap is not None:
            self._composed("softcap")
        return super().sdpa(q, k, v, **params)

    def sdpa_vjp(self, q, k, v, d_out, *, softcap=None, **params):
        if softcap is not None:
            self._composed("softcap")
        return super().sdpa_vjp(q, k, v, d_out, **params)
