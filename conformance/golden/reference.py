"""The float64 reference of every operation in the attention interface.

Written from the definitions in docs/interface.md, independently of
every backend. Golden data come from here. Two extras over the interface:

- ``policies``: the reference computes every declared choice of every policy, so that
  a case can say what each choice must produce;
- :func:`rounded_to`: every intermediate result passes through :func:`_r`, which is the
  identity in float64 and, inside ``with rounded_to("float16")``, rounds to that dtype.
  That is the "plain same-dtype computation" whose error sets the tolerances
  (spec/tolerances.yaml).

sdpa and sdpa_vjp work block by block over queries (:data:`BLOCK`), so long sequences
need memory proportional to BLOCK * Lk rather than Lq * Lk.
"""

from __future__ import annotations

import math

import numpy as np

from ..model.dtypes import UNIT_ROUNDOFF
from ..model.ops import OPS
from ..model.policies import DEFAULT_POLICIES
from .rounding import (_mm, _r, _rw, _sum, output_format, rounded_to,  # noqa: F401 (the API)
                       rounding_dtype)
from .serving import (dequantized, merge_states, read_pages,  # noqa: F401 (merge_states: an op)
                      scaled_output)
from .structure import structured

#: query rows processed at once by sdpa and sdpa_vjp
BLOCK = 256


def _f64(x):
    return None if x is None else np.asarray(x, dtype=np.float64)


def _policies(policies):
    merged = dict(DEFAULT_POLICIES)
    merged.update(policies or {})
    return merged


# --- softmax and scores ---------------------------------------------------------------

def softmax(x, axis=-1):
    x = _one_rounding_off(_f64(x))
    with np.errstate(invalid="ignore", over="ignore"):
        e = _r(np.exp(_r(x - np.max(x, axis=axis, keepdims=True))))
        return _r(e / _sum(e, axis))


def _matmul_t(a, b):
    """a @ b^T over the last two axes."""
    return _r(_mm(a, np.swapaxes(b, -1, -2)))


def default_scale(d_k: int) -> float:
    return 1.0 / math.sqrt(d_k)


def scores(q, k, *, kind, scale=None, w=None, u=None, v=None):
    q, k = _f64(q), _f64(k)
    if kind == "dot":
        return _matmul_t(q, k)
    if kind == "scaled_dot":
        scale = default_scale(q.shape[-1]) if scale is None else scale
        return _r(_matmul_t(q, k) * scale)
    if kind == "bilinear":
        return _matmul_t(_r(_mm(q, _f64(w))), k)
    if kind == "additive":
        keys = _r(_mm(k, _f64(w)))[..., None, :, :]        # (*, 1, Lk, Da)
        queries = _r(_mm(q, _f64(u)))[..., :, None, :]     # (*, Lq, 1, Da)
        return _r(_mm(np.tanh(_r(keys + queries)), _f64(v)))
    raise ValueError(f"unknown score kind {kind!r}")


# --- which keys each query may see ----------------------------------------------------

def allowed_keys(lq, lk, *, causal=None, window=None, rows=None):
    """Boolean (len(rows), Lk): key j allowed for query i by causal and window."""
    i = np.arange(lq)[:, None] if rows is None else np.asarray(rows)[:, None]
    position = i + (lk - lq if causal == "bottom_right" else 0)
    return _causal_and_window(np.arange(lk)[None, :], position, causal, window)


def _causal_and_window(j, position, causal, window):
    """Boolean, j and position broadcast: key j allowed by causal and window for a query at
    `position` (its row plus the bottom-right offset, when there is one)."""
    keep = np.ones(np.broadcast_shapes(j.shape, position.shape), dtype=bool)
    if causal in ("top_left", "bottom_right"):
        keep &= j <= position
    elif causal is not None:
        raise ValueError(f"unknown causal alignment {causal!r}")
    if window is not None:
        left, right = window
        if left is not None and left >= 0:
            keep &= j >= position - left
        if right is not None and right >= 0:
            keep &= j <= position + right
    return keep


def _lengths(lengths, batch, full):
    """Per-batch lengths as an int array (B,); None means every element is full length."""
    if lengths is None:
        return np.full(batch, full, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.shape != (batch,) or np.any(lengths < 0) or np.any(lengths > full):
        raise ValueError(f"lengths {lengths.tolist()} do not fit batch {batch} of length {full}")
    return lengths


def _batch_lead(x, rank):
    """(B, a, b) -> (B, 1, ..., 1, a, b) of `rank` dims (broadcastable to the scores)."""
    return x.reshape((x.shape[0],) + (1,) * (rank - 3) + x.shape[1:])


def length_keys(score_shape, *, causal=None, window=None, q_lengths=None, kv_lengths=None,
                rows=None):
    """Boolean (B, 1.., len(rows), Lk) broadcastable to the scores: key j allowed for
    query i of batch element b (dim 0 of the score shape) by its lengths, causal and window.

    Valid tokens are the first q_lengths[b] queries and kv_lengths[b] keys (padding at the
    end); keys at or past kv_lengths[b] are disallowed; under bottom_right the offset of
    b is kv_lengths[b] - q_lengths[b] (causal and window alike). Padded queries are
    handled by :func:`padded_queries`.
    """
    if len(score_shape) < 3:
        raise ValueError("q_lengths and kv_lengths need a batch dim (dim 0 of the scores)")
    batch, lq, lk = score_shape[0], score_shape[-2], score_shape[-1]
    q_len = _lengths(q_lengths, batch, lq)[:, None, None]
    kv_len = _lengths(kv_lengths, batch, lk)[:, None, None]
    i = (np.arange(lq) if rows is None else np.asarray(rows))[None, :, None]
    j = np.arange(lk)[None, None, :]
    position = i + (kv_len - q_len if causal == "bottom_right" else 0)
    keep = (j < kv_len) & _causal_and_window(j, np.broadcast_to(position, (batch,) +
                                                                position.shape[1:]),
                                             causal, window)
    return _batch_lead(keep, len(score_shape))


def padded_queries(score_shape, q_lengths, rows=None):
    """Boolean (B, 1.., len(rows), 1): query i of batch element b is padding
    (i >= q_lengths[b]); all False without q_lengths."""
    lq = score_shape[-2]
    i = (np.arange(lq) if rows is None else np.asarray(rows))[None, :, None]
    q_len = _lengths(q_lengths, score_shape[0], lq)[:, None, None]
    return _batch_lead(i >= q_len, len(score_shape))


def _keys_for(shape, causal, window, q_lengths, kv_lengths, rows=None):
    """allowed_keys, or length_keys when the case gives per-batch lengths."""
    if q_lengths is None and kv_lengths is None:
        return allowed_keys(shape[-2], shape[-1], causal=causal, window=window, rows=rows)
    return length_keys(shape, causal=causal, window=window, q_lengths=q_lengths,
                       kv_lengths=kv_lengths, rows=rows)


def _padded_rows(shape, q_lengths, rows=None):
    """padded_queries, or None (no padded query) without q_lengths."""
    return None if q_lengths is None else padded_queries(shape, q_lengths, rows)


def _zero_rows(x, padded):
    """x with the padded query rows set to 0 (padded_query_rows: zeros; `unspecified`
    is computed the same and its rows are not checked)."""
    return x if padded is None else np.where(padded, 0.0, x)


def _expand_kv(q, x):
    """Repeat kv heads (dim -3) so that query head h reads kv head h // group."""
    if q.ndim < 3 or x.ndim < 3:
        return x
    hq, hkv = q.shape[-3], x.shape[-3]
    if hq == hkv or hkv == 1:
        return x
    if hq % hkv:
        raise ValueError(f"{hq} query heads are not a multiple of {hkv} kv heads")
    return np.repeat(x, hq // hkv, axis=-3)


# --- the score pipeline ---------------------------------------------------------------

def _logits(q, k, *, scale, softcap, bias):
    s = _r(_matmul_t(q, k) * scale)
    if softcap is not None:
        s = _r(softcap * _r(np.tanh(_r(s / softcap))))
    if bias is not None:
        s = _r(s + bias)
    if rounding_dtype() is None:
        return s
    magnitude = np.matmul(np.abs(q), np.swapaxes(np.abs(k), -1, -2)) * abs(scale)
    return _one_rounding_off(s, magnitude)


def _one_rounding_off(s, magnitude=0.0):
    """Under rounded_to, move each logit by one unit in the last place of its error bound.

    A logit q.k is a sum of products: an implementation that scales q and k first, sums
    in another order or caps it rounds at sum |q_i k_i| and at |s|, even where the plain
    computation happens to be exact (integer inputs). Each logit moves by one ulp of
    |s| + magnitude, with fixed random signs.
    """
    dtype = rounding_dtype()
    if dtype is None or s.size == 0:
        return s
    signs = np.random.RandomState(0).randint(0, 2, size=s.shape) * 2.0 - 1.0
    with np.errstate(invalid="ignore"):
        bound = np.where(np.isfinite(s), np.abs(s) + magnitude, 0.0)
        return _r(s + 2.0 * UNIT_ROUNDOFF[dtype] * signs * bound)


def _weights(s, keep, policy, sink=None):
    """Softmax over keys of the scores s, with disallowed keys (keep False) at zero.

    sink (a logit per row, shaped like a score column, or None): a virtual key with
    zero value that joins the denominator; a row with a sink is never empty."""
    return _softmax_parts(s, keep, policy, sink)[0]


def _softmax_parts(s, keep, policy, sink=None):
    """(weights, the sink's weight or None, lse): the softmax of _weights and the natural
    log of its denominator, sum over allowed keys of exp(s) (+ exp(sink)); an empty row
    gets the lse of its policy's choice (zeros: -inf, uniform: log Lk, nan: NaN)."""
    lk = s.shape[-1]
    if sink is not None:
        column = np.broadcast_to(sink, s.shape[:-1] + (1,))
        s = np.concatenate([s, column], axis=-1)
        keep = np.concatenate([keep, np.ones(column.shape, dtype=bool)], axis=-1)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if policy["masked_key_nan"] in ("ignored", "per_row"):    # per_row may ignore it
            masked = np.where(keep, s, -np.inf)
        else:
            masked = s + np.where(keep, 0.0, -np.inf)
        top = np.max(masked, axis=-1, keepdims=True)
        finite_top = np.where(np.isfinite(top), top, 0.0)
        e = _r(np.exp(_r(masked - finite_top)))
        total = _sum(e, -1)
        p = _r(e / total)
        lse = _r(finite_top + _r(np.log(total)))
    no_key = ~np.any(keep, axis=-1, keepdims=True)
    only_neg_inf = ~no_key & np.all(np.where(keep, s == -np.inf, True), axis=-1, keepdims=True)
    p_sink = None
    if sink is not None:
        p, p_sink = p[..., :lk], p[..., lk:]
    for rows, name in ((no_key, "fully_masked_rows"), (only_neg_inf, "neg_inf_bias_rows")):
        p = _empty_rows(p, rows, policy[name])
        if p_sink is not None:
            p_sink = _empty_rows(p_sink, rows, policy[name], 0.0)
        lse = _empty_lse(lse, rows, policy[name], lk)
    return p, p_sink, lse[..., 0]


def _nan_rows(s, keep, policy):
    """Rows emptied by mask, causal, window or a -inf bias whose policy choice is nan.

    Their weights are NaN, and IEEE arithmetic carries that through the backward pass of
    a plain implementation: dS = P (dP - rowsum(dP P)) is NaN on the whole row, so dq of
    the row and dk = dS^T Q of every key are NaN, as dV = P^T dO is (docs/interface.md).
    """
    no_key = ~np.any(keep, axis=-1, keepdims=True)
    only_neg_inf = ~no_key & np.all(np.where(keep, s == -np.inf, True), axis=-1, keepdims=True)
    return ((no_key & (policy["fully_masked_rows"] == "nan"))
            | (only_neg_inf & (policy["neg_inf_bias_rows"] == "nan")))


def _empty_lse(lse, rows, choice, lk):
    if not np.any(rows):
        return lse
    fill = {"zeros": -np.inf, "uniform": math.log(lk), "nan": np.nan}[choice]
    return np.where(rows, fill, lse)


def _empty_rows(p, rows, choice, uniform=None):
    if not np.any(rows):
        return p
    uniform = 1.0 / p.shape[-1] if uniform is None else uniform
    fill = {"zeros": 0.0, "uniform": uniform, "nan": np.nan}[choice]
    return np.where(rows, fill, p)


def _prepare(q, k, v, mask, bias, scale):
    q, k, v, bias = _f64(q), _f64(k), _f64(v), _f64(bias)
    k, v = _expand_kv(q, k), (None if v is None else _expand_kv(q, v))
    scale = default_scale(q.shape[-1]) if scale is None else scale
    lq, lk = q.shape[-2], k.shape[-2]
    score_shape = np.broadcast_shapes(q.shape[:-2], k.shape[:-2]) + (lq, lk)
    if mask is not None:
        np.broadcast_shapes(np.shape(mask), score_shape)
    if bias is not None:
        np.broadcast_shapes(bias.shape, score_shape)
    return q, k, v, bias, scale, score_shape


def _row_block(x, rows, score_shape):
    """Rows `rows` (a slice over Lq) of an array broadcastable to score_shape."""
    if x is None:
        return None
    x = np.asarray(x)
    if x.ndim >= 2 and x.shape[-2] != 1:
        return x[..., rows, :]
    return x


def _block_weights(q, k, mask, bias, rows, keep_rows, score_shape, scale, softcap, policy,
                   sink=None):
    s, keep, (p, _, _) = _block_parts(q, k, mask, bias, rows, keep_rows, score_shape, scale,
                                      softcap, policy, sink)
    return s, keep, p


def _block_parts(q, k, mask, bias, rows, keep_rows, score_shape, scale, softcap, policy,
                 sink=None):
    """Scores, allowed keys and _softmax_parts of the query rows `rows`."""
    s = _logits(q[..., rows, :], k, scale=scale, softcap=softcap,
                bias=_row_block(bias, rows, score_shape))
    keep = keep_rows
    if mask is not None:
        keep = keep & _row_block(np.asarray(mask, dtype=bool), rows, score_shape)
    keep = np.broadcast_to(keep, s.shape)
    return s, keep, _softmax_parts(s, keep, policy, _sink_column(sink))


def _sink_column(sink):
    """A sink of shape broadcasting to (*batch, Hq) as a score column (*batch, Hq, 1, 1)."""
    return None if sink is None else _f64(sink)[..., None, None]


def _row_slices(lq):
    return [slice(start, min(start + BLOCK, lq)) for start in range(0, lq, BLOCK)]


@structured
def attention_weights(q, k, *, mask=None, bias=None, sink=None, causal=None, scale=None,
                      softcap=None, window=None, q_lengths=None, kv_lengths=None,
                      policies=None):
    q, k, _, bias, scale, shape = _prepare(q, k, None, mask, bias, scale)
    q, policy = _zero_rows(q, _padded_rows(shape, q_lengths)), _policies(policies)
    keep = _keys_for(shape, causal, window, q_lengths, kv_lengths)
    _, _, p = _block_weights(q, k, mask, bias, slice(None), keep, shape, scale, softcap,
                             policy, sink)
    return _zero_rows(p, _padded_rows(shape, q_lengths))


def _weighted_values(p, keep, v, policy):
    """P V; a masked-out non-finite value is kept out unless its policy propagates it."""
    p = _rw(p)
    if policy["masked_value_nan"] == "propagates" or np.all(np.isfinite(v)):
        return _r(_mm(p, v))
    values = np.where(keep[..., None], v[..., None, :, :], 0.0)   # (*, Lq, Lk, Dv)
    return _r(np.sum(p[..., None] * values, axis=-2))


@structured
def sdpa(q, k, v, *, mask=None, bias=None, sink=None, q_descale=None, k_descale=None,
         v_descale=None, causal=None, scale=None, softcap=None, window=None, q_lengths=None,
         kv_lengths=None, qv=None, o_scale=None, policies=None):
    """With descales (fp8), attention over q, k, v each times its descale factor; with an
    o_scale, the fp8 output that stands for it (serving.scaled_output: out / o_scale)."""
    q, k, v = dequantized(q, q_descale), dequantized(k, k_descale), dequantized(v, v_descale)
    if qv is not None:
        q, k, scale = _absorbed(q, k, v, qv, scale)
    return scaled_output(_sdpa(q, k, v, mask, bias, sink, causal, scale, softcap, window,
                               policies, q_lengths, kv_lengths)[0], o_scale)


def _absorbed(q, k, v, qv, scale):
    """The absorbed MLA form (FlashAttention 3's qv): the scores (q kᵀ + qv vᵀ) · scale
    are those of q and qv side by side against k and v side by side, and the scale
    defaults to 1/sqrt(Dk + Dv): (that q, that k, the scale)."""
    q, k, v, qv = _f64(q), _f64(k), _f64(v), _f64(qv)
    keys = np.broadcast_shapes(k.shape[:-1], v.shape[:-1])
    k = np.concatenate([np.broadcast_to(k, keys + k.shape[-1:]),
                        np.broadcast_to(v, keys + v.shape[-1:])], axis=-1)
    scale = default_scale(q.shape[-1] + qv.shape[-1]) if scale is None else scale
    return np.concatenate([q, qv], axis=-1), k, scale


def sdpa_lse(q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
             softcap=None, window=None, policies=None):
    """(sdpa, lse): lse[..., i] = log(sum over allowed keys j of exp(s_ij)) (+ exp(sink)),
    the natural log of the softmax's denominator; softmax(s)_ij = exp(s_ij - lse_i).
    Under lse_base 2 the lse is log2 of it (FlashInfer's), lse / ln 2."""
    out, lse = _sdpa(q, k, v, mask, bias, sink, causal, scale, softcap, window, policies)
    if _policies(policies)["lse_base"] == "2":
        lse = _r(lse / math.log(2.0))
    return out, lse


def paged_sdpa(q, k_pages, v_pages, *, block_table, kv_lengths, sink=None, q_descale=None,
               k_descale=None, v_descale=None, page_layout="NHD", causal=None, scale=None,
               softcap=None, window=None, q_lengths=None, qv=None, o_scale=None, policies=None):
    """sdpa of q over each sequence's keys and values read from the page pools
    (serving.read_pages): sequence b has kv_lengths[b] keys, and under bottom_right its
    query i sits at kv_lengths[b] - q_lengths[b] + i, as sdpa with lengths has it."""
    k = read_pages(k_pages, block_table, kv_lengths, page_layout)
    v = read_pages(v_pages, block_table, kv_lengths, page_layout)
    return sdpa(q, k, v, sink=sink, q_descale=q_descale, k_descale=k_descale,
                v_descale=v_descale, causal=causal, scale=scale, softcap=softcap,
                window=window, q_lengths=q_lengths, kv_lengths=kv_lengths, qv=qv,
                o_scale=o_scale, policies=policies)


def _sdpa(q, k, v, mask, bias, sink, causal, scale, softcap, window, policies,
          q_lengths=None, kv_lengths=None):
    q, k, v, bias, scale, shape = _prepare(q, k, v, mask, bias, scale)
    q, policy = _zero_rows(q, _padded_rows(shape, q_lengths)), _policies(policies)
    out_shape = np.broadcast_shapes(shape[:-1] + (1,), v.shape[:-2] + (1, 1))[:-1]
    out = np.empty(out_shape + (v.shape[-1],))
    lse = np.empty(out_shape)
    for rows in _row_slices(shape[-2]):
        index = np.arange(shape[-2])[rows]
        keep_rows = _keys_for(shape, causal, window, q_lengths, kv_lengths, index)
        _, keep, (p, _, row_lse) = _block_parts(q, k, mask, bias, rows, keep_rows, shape,
                                                scale, softcap, policy, sink)
        out[..., rows, :] = _zero_rows(_weighted_values(p, keep, v, policy),
                                       _padded_rows(shape, q_lengths, index))
        lse[..., rows] = row_lse
    return out, lse


# --- gradients ------------------------------------------------------------------------

def _unbroadcast(grad, shape):
    """Sum grad down to shape (undoing broadcasting and grouped-query expansion)."""
    while grad.ndim > len(shape):
        grad = grad.sum(axis=0)
    for axis, size in enumerate(shape):
        if size == 1 and grad.shape[axis] != 1:
            grad = grad.sum(axis=axis, keepdims=True)
    if grad.ndim >= 3 and grad.shape[-3] != shape[-3]:
        group = grad.shape[-3] // shape[-3]
        grad = grad.reshape(grad.shape[:-3] + (shape[-3], group) + grad.shape[-2:]).sum(-3)
    return grad


@structured
def sdpa_vjp(q, k, v, d_out, *, mask=None, bias=None, sink=None, causal=None, scale=None,
             softcap=None, window=None, q_lengths=None, kv_lengths=None, policies=None):
    """(dq, dk, dv), and d_sink with a sink: the sink is a key of value 0 whose weight
    p_sink gives d_sink = -sum over rows of p_sink * rowsum(d_out * out)."""
    q_shape, k_shape, v_shape = np.shape(q), np.shape(k), np.shape(v)
    q, k, v, bias, scale, shape = _prepare(q, k, v, mask, bias, scale)
    q = _zero_rows(q, _padded_rows(shape, q_lengths))     # a padded query is never read
    d_out, policy = _f64(d_out), _policies(policies)
    batch = np.broadcast_shapes(shape[:-2], v.shape[:-2], d_out.shape[:-2])
    dq = np.zeros(batch + q.shape[-2:])
    dk = np.zeros(batch + k.shape[-2:])
    dv = np.zeros(batch + v.shape[-2:])
    d_sink = np.zeros(batch + shape[-2:-1])      # per query row, summed below
    for rows in _row_slices(shape[-2]):
        index = np.arange(shape[-2])[rows]
        keep_rows = _keys_for(shape, causal, window, q_lengths, kv_lengths, index)
        s, keep, (p, p_sink, _) = _block_parts(q, k, mask, bias, rows, keep_rows, shape,
                                               scale, softcap, policy, sink)
        padded = _padded_rows(shape, q_lengths, index)
        # a padded query is never read: weight 0, its d_out ignored, its dq 0
        p, g = _zero_rows(p, padded), _zero_rows(d_out[..., rows, :], padded)
        dv += _r(_mm(np.swapaxes(p, -1, -2), g))
        dp = _matmul_t(g, v)
        if rounding_dtype() is not None:
            dp = _one_rounding_off(dp, np.matmul(np.abs(g), np.swapaxes(np.abs(v), -1, -2)))
        row = _sum(_r(dp * p), -1)
        if p_sink is not None:
            d_sink[..., rows] = -_r(p_sink * row)[..., 0]
        ds = _r(p * _r(dp - row))
        if rounding_dtype() is not None:
            ds = _one_rounding_off(ds, p * (np.abs(dp) + np.abs(row)))
        if softcap is not None:
            with np.errstate(invalid="ignore"):
                raw = _logits(q[..., rows, :], k, scale=scale, softcap=None, bias=None)
                ds = _r(ds * _r(1.0 - np.tanh(raw / softcap) ** 2))
        ds = _zero_rows(np.where(keep | _nan_rows(s, keep, policy), ds, 0.0), padded)
        dq[..., rows, :] += _r(_r(_dq_keys(ds, k, keep, policy)) * scale)
        dk += _r(_r(_mm(np.swapaxes(ds, -1, -2), q[..., rows, :])) * scale)
    grads = (_unbroadcast(dq, q_shape), _unbroadcast(dk, k_shape), _unbroadcast(dv, v_shape))
    if sink is None:
        return grads
    return grads + (_unbroadcast_sink(_sum(d_sink, -1)[..., 0], np.shape(sink)),)


def _dq_keys(ds, k, keep, policy):
    """dS K. Under masked_key_nan `ignored` (and `per_row`) a key disallowed for a row is
    not read by that row: a non-finite entry of it reaches no element of the row's dq,
    as in a kernel that never loads a masked key (docs/interface.md). The plain product,
    which multiplies it by the exact zero of dS (0 * NaN), is what key_nan_columns accepts."""
    bad = ~np.isfinite(k)
    if policy["masked_key_nan"] == "propagates" or not np.any(bad):
        return _mm(ds, k)
    out = _mm(ds, np.where(bad, 0.0, k))
    with np.errstate(invalid="ignore"):
        for j in np.flatnonzero(np.any(bad, axis=tuple(range(bad.ndim - 2)) + (-1,))):
            term = ds[..., :, j:j + 1] * np.where(bad[..., j:j + 1, :], k[..., j:j + 1, :], 0.0)
            out = out + np.where(keep[..., :, j:j + 1], term, 0.0)
    return out


def key_nan_columns(q, k, *, mask=None, causal=None, window=None, q_lengths=None,
                    kv_lengths=None, **_):
    """Boolean of dq's shape (q's): where a plain kernel's dq = dS K meets a non-finite
    entry of a key that row does not read (0 * NaN): element (i, c) when some key j
    disallowed for query i (or any key, for a padded query) holds a NaN or inf in column
    c. Under masked_key_nan `ignored` such an element may be NaN (docs/interface.md)."""
    q, k = _f64(q), _expand_kv(_f64(q), _f64(k))
    shape = np.broadcast_shapes(q.shape[:-2], k.shape[:-2]) + (q.shape[-2], k.shape[-2])
    keep = np.broadcast_to(_keys_for(shape, causal, window, q_lengths, kv_lengths), shape)
    if mask is not None:
        keep = keep & np.asarray(mask, dtype=bool)
    padded = _padded_rows(shape, q_lengths)
    if padded is not None:
        keep = keep & ~padded
    bad = (~np.isfinite(k)).astype(np.float64)
    hits = np.matmul((~keep).astype(np.float64), bad) > 0     # (*batch, Lq, Dk)
    while hits.ndim > q.ndim:
        hits = hits.any(axis=0)
    for axis, size in enumerate(q.shape):
        if size == 1 and hits.shape[axis] != 1:
            hits = hits.any(axis=axis, keepdims=True)
    return np.broadcast_to(hits, q.shape)


def _unbroadcast_sink(grad, shape):
    """Sum a (*batch, Hq) gradient down to the sink's shape."""
    while grad.ndim > len(shape):
        grad = grad.sum(axis=0)
    for axis, size in enumerate(shape):
        if size == 1 and grad.shape[axis] != 1:
            grad = grad.sum(axis=axis, keepdims=True)
    return grad


# --- learned projections --------------------------------------------------------------

def self_attention(x, w_q, w_k, w_v, *, mask=None, causal=None, policies=None):
    x = _f64(x)
    q, k, v = (_r(_mm(x, _f64(w))) for w in (w_q, w_k, w_v))
    return sdpa(q, k, v, mask=mask, causal=causal, policies=policies)


def _split_heads(x, heads):
    """(*, L, H*D) -> (*, H, L, D): head h takes columns [h*D, (h+1)*D)."""
    x = x.reshape(x.shape[:-1] + (heads, x.shape[-1] // heads))
    return np.swapaxes(x, -2, -3)


def multi_head_attention(query, key, value, *, w_q, w_k, w_v, w_o, num_heads,
                         num_kv_heads=None, mask=None, causal=None, policies=None):
    kv_heads = num_kv_heads or num_heads
    q = _split_heads(_r(_mm(_f64(query), _f64(w_q))), num_heads)
    k = _split_heads(_r(_mm(_f64(key), _f64(w_k))), kv_heads)
    v = _split_heads(_r(_mm(_f64(value), _f64(w_v))), kv_heads)
    heads = sdpa(q, k, v, mask=mask, causal=causal, policies=policies)
    merged = np.swapaxes(heads, -2, -3)
    merged = merged.reshape(merged.shape[:-2] + (-1,))
    return _r(_mm(merged, _f64(w_o)))


# --- column-vector form (the NNDL and lecture notation) -------------------------------

def sdpa_columns(q_cols, k_cols, v_cols):
    """V softmax(Kᵀ Q / sqrt(d)) with tokens as columns: the lecture's matrix form."""
    q_cols, k_cols, v_cols = _f64(q_cols), _f64(k_cols), _f64(v_cols)
    a = np.swapaxes(k_cols, -1, -2) @ q_cols / math.sqrt(q_cols.shape[-2])
    return v_cols @ softmax(a, axis=-2)


def run(op: str, arrays: dict, params: dict, policies=None):
    """Call reference operation ``op`` with the case's arrays and params."""
    func = globals()[OPS[op].name]      # each op of the table is a function of this module
    extra = {"policies": policies} if OPS[op].policy_aware else {}
    # `sharding` says how a distributed backend splits the work, not what it computes
    result = func(**arrays, **{k: v for k, v in params.items() if k != "sharding"}, **extra)
    return result if isinstance(result, tuple) else (result,)
