"""The plain NumPy backend: attention composed from NumPy primitives.

Every op is built from matmul, exp, tanh and ``np.where`` following the score pipeline
of docs/interface.md, and the backward pass of sdpa is derived by hand (no autodiff).
float64 and float32 are computed in their own precision; float16 and bfloat16 are
upcast to float32 and the result is rounded back to the input dtype once, at the end.

Declared policies, and why they hold:
- ``fully_masked_rows: zeros``: a row with no allowed key (mask, causal, window) gets
  weights, output and gradients of exactly 0;
- ``neg_inf_bias_rows: nan``: a row emptied only by -inf biases is left to the plain
  softmax, which gives NaN (-inf minus -inf);
- ``masked_key_nan: ignored``: disallowed scores are replaced by -inf with ``np.where``,
  so a NaN computed from a masked-out key never reaches the softmax;
- ``masked_value_nan: propagates``: the output is ``P @ V`` and ``0 * NaN`` is NaN.

Large calls: sdpa, sdpa_lse and sdpa_vjp (without a sink) whose scores pass
``BLOCKED_ABOVE`` elements go block by block over the queries, each block reading only
the keys that causal and a window let it see (``rules.key_range``), so that they need
the inputs, the outputs (and the gradients) and one block's scores (``BLOCK_ELEMENTS``,
~16 MiB in float32, a few of them at once) rather than the whole score matrix; the
other ops refuse scores that the machine cannot hold (``rules.check_size``: the test
is unsupported, by size).

``sdpa_lse`` returns ``m + log(l)`` of the same max-subtracted softmax (-inf for a row
without allowed keys, the lse of the ``zeros`` choice). A ``sink`` is one more score
column (a key of value 0) in the softmax; its gradient is ``-sum_i p_sink,i D_i`` with
``D_i = rowsum(dO * O)``.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy)
import numpy as np

from . import rules

_OPS = ("softmax", "scores", "attention_weights", "sdpa", "sdpa_lse", "self_attention",
        "multi_head_attention", "sdpa_vjp", "paged_sdpa", "merge_states")

#: score elements (batch x heads x Lq x Lk) past which sdpa and sdpa_lse go block by block
BLOCKED_ABOVE = 1 << 25
#: score elements of one block at most (a block has one row at least)
BLOCK_ELEMENTS = 1 << 22

#: input dtype name -> dtype the arithmetic is done in
_COMPUTE = {"float64": np.float64, "float32": np.float32,
            "float16": np.float32, "bfloat16": np.float32}


# --------------------------------------------------------------------------- helpers

def _dtypes(x):
    """(input dtype, compute dtype) of a floating input; unsupported dtypes raise."""
    dt = np.dtype(x.dtype)
    return dt, _compute_dtype(dt)


@functools.lru_cache(maxsize=64)
def _compute_dtype(dt):                 # once per dtype (dtype.name is slow)
    if dt.name not in _COMPUTE:
        raise NotImplementedError(f"numpy backend: dtype {dt.name} is not supported")
    return np.dtype(_COMPUTE[dt.name])


def _cast(x, ct):
    """A fresh copy of x in the compute dtype (None stays None)."""
    return None if x is None else np.asarray(x).astype(ct)


def _mask(mask):
    if mask is None:
        return None
    mask = np.asarray(mask)
    if mask.dtype != np.bool_:
        raise TypeError(f"mask must be boolean (True = may attend), got {mask.dtype}")
    return mask


def _swap(x):
    return np.swapaxes(x, -1, -2)


def _softmax(s, axis=-1):
    """Max-subtracted softmax; a row of all -inf gives NaN, as a plain softmax does."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = np.max(s, axis=axis, keepdims=True, initial=-np.inf)
        e = np.exp(s - m)
        return e / np.sum(e, axis=axis, keepdims=True)


def _expand_kv(x, q):
    """Repeat kv heads so that query head h reads kv head h // (Hq // Hkv)."""
    if q.ndim < 3 or x.ndim < 3:
        return x
    hq, hkv = q.shape[-3], x.shape[-3]
    if hkv in (1, hq) or hq % hkv:
        return x  # plain broadcasting (or a shape error later)
    return np.repeat(x, hq // hkv, axis=-3)


def _unbroadcast(g, shape):
    """Sum a gradient over the dims along which its input was broadcast."""
    lead = g.ndim - len(shape)
    if lead > 0:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def _group_sum(g, shape):
    """Gradient of a head-expanded kv tensor summed back over each query group."""
    if g.shape == tuple(shape):
        return g
    hkv = shape[-3]
    g = g.reshape(*g.shape[:-3], hkv, g.shape[-3] // hkv, *g.shape[-2:])
    return g.sum(axis=-3)


def _allowed(lq, lk, mask, causal, window, offset=None):
    """Boolean array (broadcastable to the scores) of allowed positions, or None;
    offset: where query 0 sits among the keys (a block's, in _blocked)."""
    return rules.and_masks(_mask(mask), rules.allowed(lq, lk, causal, window, offset=offset))


def _with_sink(s, sink):
    """Scores with the sink appended as a last column (a key of value 0), or s itself."""
    if sink is None:
        return s
    column = np.broadcast_to(np.asarray(sink, dtype=s.dtype)[..., None, None],
                             s.shape[:-1] + (1,))
    return np.concatenate([s, column], axis=-1)


def _lse(s):
    """Natural log of each row's softmax denominator, m + log(sum(exp(s - m))); an all
    -inf row gives NaN (-inf minus -inf), as its softmax does."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = np.max(s, axis=-1, keepdims=True, initial=-np.inf)
        return (m + np.log(np.sum(np.exp(s - m), axis=-1, keepdims=True)))[..., 0]


def _probs(q, k, *, mask, bias, causal, scale, softcap, window, sink=None, parts=False,
           offset=None):
    """The score pipeline and its softmax: (P, tanh term of the softcap or None, scale);
    with parts, (P, tanh term, scale, the sink's weight or None, lse)."""
    ct = q.dtype.type
    scale = ct(1.0 / np.sqrt(q.shape[-1]) if scale is None else scale)
    s = (q @ _swap(k)) * scale
    t = None
    if softcap is not None:
        c = ct(softcap)
        t = np.tanh(s / c)
        s = c * t
    if bias is not None:
        s = s + bias
    allowed = _allowed(q.shape[-2], k.shape[-2], mask, causal, window, offset)
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)  # NaN or inf at a disallowed key never survives
    lk = s.shape[-1]
    s = _with_sink(s, sink)
    p = _softmax(s)
    live = None if allowed is None or sink is not None else allowed.any(axis=-1, keepdims=True)
    if live is not None:
        p = np.where(live, p, 0)  # empty rows -> 0
    p = p.astype(q.dtype, copy=False)
    if not parts:
        return p[..., :lk], t, scale
    lse = _lse(s) if live is None else np.where(live[..., 0], _lse(s), -np.inf)
    return p[..., :lk], t, scale, (None if sink is None else p[..., lk:]), lse


def _sdpa(q, k, v, **kw):
    if _score_elements(q, k) > BLOCKED_ABOVE:
        return _blocked(q, k, v, **kw)[0]
    p, _, _ = _probs(q, _expand_kv(k, q), **kw)
    return p @ _expand_kv(v, q)


def _sdpa_lse(q, k, v, **kw):
    if _score_elements(q, k) > BLOCKED_ABOVE:
        return _blocked(q, k, v, **kw)
    p, _, _, _, lse = _probs(q, _expand_kv(k, q), parts=True, **kw)
    return p @ _expand_kv(v, q), lse


def _score_elements(q, k) -> int:
    return math.prod(rules.score_shape(q.shape, k.shape))


def _block_of(x, first, end, lo, hi):
    """Rows first:end and keys lo:hi of a mask or bias broadcastable to the scores."""
    if x is None:
        return None
    x = np.asarray(x)
    if x.ndim >= 2 and x.shape[-2] != 1:
        x = x[..., first:end, :]
    return x[..., lo:hi] if x.ndim and x.shape[-1] != 1 else x


def _row_blocks(lq, lk, causal, window, heads, with_sink):
    """(first, end, lo, hi) of each block: rows first:end over keys lo:hi (hi <= lo: none)."""
    found, first = [], 0
    while first < lq:
        lo, hi = rules.key_range(first, first + 1, lq, lk, causal, window)
        rows = BLOCK_ELEMENTS // (heads * (max(hi - lo, 0) + 512))
        end = min(lq, first + max(1, min(512, rows)))
        lo, hi = rules.key_range(first, end, lq, lk, causal, window)
        found.append((first, end) + ((0, lk) if hi <= lo and with_sink else (lo, hi)))
        first = end
    return found


def _blocked(q, k, v, *, mask, bias, causal, scale, softcap, window, sink=None):
    """(out, lse) of sdpa over blocks of query rows, each over the keys it may see (with
    a sink, a row without any sees the sink alone), on every core: a row without keys
    is 0 (fully_masked_rows: zeros), its lse -inf."""
    lq, lk = q.shape[-2], k.shape[-2]
    k, v = _expand_kv(k, q), _expand_kv(v, q)
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    out = np.zeros(lead + (lq, v.shape[-1]), dtype=q.dtype)
    lse = np.full(lead + (lq,), -np.inf, dtype=q.dtype)
    offset = rules.causal_offset(lq, lk, causal)

    def block(first, end, lo, hi):
        if hi > lo:
            p, _, _, _, block_lse = _probs(
                q[..., first:end, :], k[..., lo:hi, :], mask=_block_of(mask, first, end, lo, hi),
                bias=_block_of(bias, first, end, lo, hi), causal=causal, scale=scale,
                softcap=softcap, window=window, sink=sink, parts=True, offset=first + offset - lo)
            out[..., first:end, :] = p @ v[..., lo:hi, :]
            lse[..., first:end] = block_lse

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:   # NumPy frees the GIL in them
        list(pool.map(lambda b: block(*b), _row_blocks(lq, lk, causal, window,
                                                        math.prod(lead), sink is not None)))
    return out, lse


def _sdpa_vjp(q, k, v, d_out, **kw):
    """Backward pass of sdpa, by hand: O = P V, P = softmax(S), S = pipeline(Q Kᵀ); past
    BLOCKED_ABOVE score elements (without a sink), block by block (_blocked_vjp)."""
    k_e, v_e = _expand_kv(k, q), _expand_kv(v, q)
    if _score_elements(q, k) > BLOCKED_ABOVE and kw.get("sink") is None:
        dq, dk_e, dv_e = _blocked_vjp(q, k_e, v_e, d_out, **kw)
        p_sink = None
    else:
        dq, dk_e, dv_e, p_sink, row = _vjp_parts(q, k_e, v_e, d_out, **kw)
    dk = _group_sum(_unbroadcast(dk_e, k_e.shape), k.shape)
    dv = _group_sum(_unbroadcast(dv_e, v_e.shape), v.shape)
    if p_sink is None:
        return _unbroadcast(dq, q.shape), dk, dv
    d_sink = -np.sum(p_sink * row, axis=(-1, -2))       # the sink's value is 0: dP = 0
    return _unbroadcast(dq, q.shape), dk, dv, _unbroadcast(d_sink, np.shape(kw["sink"]))


def _vjp_parts(q, k_e, v_e, d_out, offset=None, **kw):
    """(dq, dk, dv of the expanded heads, the sink's weight, rowsum(dP P)) of the query rows
    of q over the keys of k_e (a block's, placed by offset as in _probs)."""
    p, t, scale, p_sink, _ = _probs(q, k_e, parts=True, offset=offset, **kw)
    dv_e = _swap(p) @ d_out
    dp = d_out @ _swap(v_e)
    row = np.sum(dp * p, axis=-1, keepdims=True)
    ds = p * (dp - row)  # softmax backward
    if t is not None:
        ds = ds * (1 - t * t)  # d/ds of c*tanh(s/c)
    ds = ds * scale  # bias and -inf masking pass ds through (0 where P is 0)
    return ds @ k_e, _swap(ds) @ q, dv_e, p_sink, row


def _blocked_vjp(q, k_e, v_e, d_out, *, mask, bias, causal, scale, softcap, window, sink=None):
    """(dq, dk, dv of the expanded heads) over _row_blocks of query rows, each over the
    keys it may see (its softmax whole), on every core: dq written by its block, dk and
    dv summed over the blocks (under a lock); a row without keys has gradients 0."""
    lq, lk = q.shape[-2], k_e.shape[-2]
    lead = np.broadcast_shapes(q.shape[:-2], k_e.shape[:-2], v_e.shape[:-2], d_out.shape[:-2])
    dq = np.zeros(lead + (lq, q.shape[-1]), dtype=q.dtype)
    dk = np.zeros(lead + (lk, k_e.shape[-1]), dtype=q.dtype)
    dv = np.zeros(lead + (lk, v_e.shape[-1]), dtype=q.dtype)
    offset, lock = rules.causal_offset(lq, lk, causal), threading.Lock()

    def block(first, end, lo, hi):
        if hi > lo:
            dq_b, dk_b, dv_b, _, _ = _vjp_parts(
                q[..., first:end, :], k_e[..., lo:hi, :], v_e[..., lo:hi, :],
                d_out[..., first:end, :], mask=_block_of(mask, first, end, lo, hi),
                bias=_block_of(bias, first, end, lo, hi), causal=causal, scale=scale,
                softcap=softcap, window=window, offset=first + offset - lo)
            dq[..., first:end, :] = dq_b
            with lock:
                dk[..., lo:hi, :] += dk_b
                dv[..., lo:hi, :] += dv_b

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(lambda b: block(*b), _row_blocks(lq, lk, causal, window,
                                                        math.prod(lead), False)))
    return dq, dk, dv


def _split_heads(x, h):
    """(*b, L, h*d) -> (*b, h, L, d); head i takes columns [i*d, (i+1)*d)."""
    if x.shape[-1] % h:
        raise ValueError(f"last dim {x.shape[-1]} is not divisible by {h} heads")
    return np.moveaxis(x.reshape(*x.shape[:-1], h, x.shape[-1] // h), -2, -3)


def _merge_heads(x):
    """(*b, h, L, d) -> (*b, L, h*d), heads concatenated in order."""
    x = np.moveaxis(x, -3, -2)
    return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])


def _score_kind(q, k, kind, scale, w, u, v):
    if kind == "dot":
        return q @ _swap(k)
    if kind == "scaled_dot":
        scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
        return (q @ _swap(k)) * q.dtype.type(scale)
    if kind == "bilinear":
        return q @ w @ _swap(k)
    if kind == "additive":
        h = np.tanh((q @ u)[..., :, None, :] + (k @ w)[..., None, :, :])
        return h @ v
    raise ValueError(f"unknown score kind {kind!r}")


# --------------------------------------------------------------------------- backend

class NumpyBackend:
    """The attention interface in plain NumPy (every op composed from primitives)."""

    name = "numpy"
    # fp8 (sdpa, paged_sdpa): dequantized to float32 times the descales (rules.descaled)
    dtypes = frozenset({"float64", "float32", "float16", "bfloat16", "float8_e4m3fn",
                        "float8_e5m2"})
    # checked bit for bit by the invariance cases (docs/interface.md, "Declared invariants")
    invariants = ("deterministic", "batch_invariant", "split_invariant")

    def __init__(self):
        self.versions = {"numpy": np.__version__}
        self.paths = {op: "composed: plain NumPy" for op in _OPS}
        self.policy = {
            "fully_masked_rows": "zeros",
            "neg_inf_bias_rows": "nan",
            "masked_key_nan": "ignored",
            "masked_value_nan": "propagates",
            "accumulation": "float32",
            # a padded query (past q_lengths) gets output, weight and dq rows of 0
            "padded_query_rows": "zeros",
            # every lse it returns or takes is a natural log
            "lse_base": "e",
        }

    def softmax(self, x, axis=-1):
        x = np.asarray(x)
        dt, ct = _dtypes(x)
        return _softmax(_cast(x, ct), axis).astype(dt)

    def scores(self, q, k, *, kind, scale=None, w=None, u=None, v=None):
        dt, ct = _dtypes(np.asarray(q))
        q, k, w, u, v = (_cast(a, ct) for a in (q, k, w, u, v))
        return _score_kind(q, _expand_kv(k, q), kind, scale, w, u, v).astype(dt)

    @rules.lengths_as_mask
    def attention_weights(self, q, k, *, mask=None, bias=None, sink=None, causal=None,
                          scale=None, softcap=None, window=None):
        dt, ct = _dtypes(np.asarray(q))
        rules.check_size("numpy attention_weights", np.shape(q), np.shape(k), copies=4)
        q, k, bias, sink = (_cast(a, ct) for a in (q, k, bias, sink))
        p, _, _ = _probs(q, _expand_kv(k, q), mask=mask, bias=bias, causal=causal,
                         scale=scale, softcap=softcap, window=window, sink=sink)
        return p.astype(dt)

    @rules.descaled()
    @rules.lengths_as_mask
    def sdpa(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
             softcap=None, window=None):
        dt, ct = _dtypes(np.asarray(q))
        q, k, v, bias, sink = (_cast(a, ct) for a in (q, k, v, bias, sink))
        out = _sdpa(q, k, v, mask=mask, bias=bias, causal=causal, scale=scale,
                    softcap=softcap, window=window, sink=sink)
        return out.astype(dt)

    def sdpa_lse(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None,
                 scale=None, softcap=None, window=None):
        dt, ct = _dtypes(np.asarray(q))
        q, k, v, bias, sink = (_cast(a, ct) for a in (q, k, v, bias, sink))
        out, lse = _sdpa_lse(q, k, v, mask=mask, bias=bias, causal=causal, scale=scale,
                             softcap=softcap, window=window, sink=sink)
        return out.astype(dt), lse.astype(rules.lse_dtype(dt))

    @rules.lengths_as_mask
    def sdpa_vjp(self, q, k, v, d_out, *, mask=None, bias=None, sink=None, causal=None,
                 scale=None, softcap=None, window=None):
        dt, ct = _dtypes(np.asarray(q))
        if sink is not None or math.prod(rules.score_shape(np.shape(q), np.shape(k))) \
                <= BLOCKED_ABOVE:
            rules.check_size("numpy sdpa_vjp", np.shape(q), np.shape(k), copies=6)
        q, k, v, d_out, bias, sink = (_cast(a, ct) for a in (q, k, v, d_out, bias, sink))
        grads = _sdpa_vjp(q, k, v, d_out, mask=mask, bias=bias, causal=causal,
                          scale=scale, softcap=softcap, window=window, sink=sink)
        return tuple(g.astype(dt) for g in grads)

    def self_attention(self, x, w_q, w_k, w_v, *, mask=None, causal=None):
        dt, ct = _dtypes(np.asarray(x))
        x, w_q, w_k, w_v = (_cast(a, ct) for a in (x, w_q, w_k, w_v))
        out = _sdpa(x @ w_q, x @ w_k, x @ w_v, mask=mask, bias=None, causal=causal,
                    scale=None, softcap=None, window=None)
        return out.astype(dt)

    def multi_head_attention(self, query, key, value, *, w_q, w_k, w_v, w_o, num_heads,
                             num_kv_heads=None, mask=None, causal=None):
        dt, ct = _dtypes(np.asarray(query))
        query, key, value, w_q, w_k, w_v, w_o = (
            _cast(a, ct) for a in (query, key, value, w_q, w_k, w_v, w_o))
        h, hkv = num_heads, num_kv_heads or num_heads
        if h % hkv:
            raise ValueError(f"num_heads {h} is not a multiple of num_kv_heads {hkv}")
        q = _split_heads(query @ w_q, h)
        k = _split_heads(key @ w_k, hkv)
        v = _split_heads(value @ w_v, hkv)
        if q.shape[-1] != k.shape[-1]:
            raise ValueError(f"query head dim {q.shape[-1]} != key head dim {k.shape[-1]}")
        out = _sdpa(q, k, v, mask=mask, bias=None, causal=causal, scale=None,
                    softcap=None, window=None)
        return (_merge_heads(out) @ w_o).astype(dt)

    def paged_sdpa(self, q, k_pages, v_pages, *, block_table, kv_lengths, sink=None,
                   q_descale=None, k_descale=None, v_descale=None, page_layout="NHD",
                   causal=None, scale=None, softcap=None, window=None, q_lengths=None, qv=None,
                   o_scale=None):
        """The pages read back (rules.gather_pages), then sdpa with the lengths."""
        k, v = rules.gather_pages(k_pages, v_pages, block_table, kv_lengths, page_layout)
        return self.sdpa(q, k, v, sink=sink, q_descale=q_descale, k_descale=k_descale,
                         v_descale=v_descale, causal=causal, scale=scale, softcap=softcap,
                         window=window, q_lengths=q_lengths, kv_lengths=kv_lengths, qv=qv,
                         o_scale=o_scale)

    def merge_states(self, outs, lses):
        dt, _ = _dtypes(np.asarray(outs))
        out, lse = rules.merge_states(outs, lses, self.policy["lse_base"])
        return out.astype(dt), lse.astype(rules.lse_dtype(dt))
