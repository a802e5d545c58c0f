"""The sampled golden of sdpa_vjp: dq at the sampled query rows, dk and dv at sampled
key columns, given every row's lse and output computed once.

With P = exp(S - lse) and D_i = rowsum(dO_i * O_i) (= rowsum(dP_i * P_i)), a row's dq
needs that row's scores alone, dq_i = scale sum_j P_ij (dP_ij - D_i) k_j, and a column's
dk and dv that column's scores over every query row, dv_j = sum_i P_ij dO_i and dk_j =
scale sum_i P_ij (dP_ij - D_i) q_i: what is not checked is dk and dv at the other keys
and dq at the other rows. The lse and the output of every row come from the blocked
float64 forward reference (blocks.py, one pass over the keys that causal and a window
let each row see), computed once for both passes; the rest costs (rows + columns) x
the other side's length. Under ``rounded_to`` the later steps are rounded as
reference.sdpa_vjp rounds them (_weights_and_ds says what is left out), so that the
tolerance is the same rule as every golden's, its plain error taken over the sampled
positions and no larger than the reference's plain backward's.

Taken: causal, a window, a scale, a softcap and a boolean mask; not bias, sink or
per-batch lengths (validation refuses them), under the default policies.
"""

from __future__ import annotations

import numpy as np

from . import blocks, reference
from .rounding import _mm, _r, _sum

#: query rows of one chunk of the column pass (reference.BLOCK's rows)
CHUNK_ROWS = reference.BLOCK


def sdpa_vjp(q, k, v, d_out, *, rows, columns, mask=None, causal=None, scale=None,
             softcap=None, window=None, policies=None):
    """(dq at query rows `rows`, dk and dv at key columns `columns`), both ascending:
    dq (..., len(rows), Dk), dk (..., len(columns), Dk), dv (..., len(columns), Dv), in the
    shapes of q, k and v otherwise."""
    q_shape, k_shape, v_shape = np.shape(q), np.shape(k), np.shape(v)
    out, lse = forward(q, k, v, mask, {"causal": causal, "scale": scale, "softcap": softcap,
                                       "window": window, "policies": policies})
    q, k, v, d_out = (reference._f64(x) for x in (q, k, v, d_out))
    scale = reference.default_scale(q.shape[-1]) if scale is None else scale
    mask = None if mask is None else np.asarray(mask, dtype=bool)
    q, k, v, mask, _, _, hq = blocks._grouped(q, k, v, mask, None, None)
    out, lse, d_out = (_folded(x, q.shape, hq) for x in (out, lse[..., None], d_out))
    row_sums = _sum(_r(d_out * out), -1)                   # D_i, (..., Lq, 1)
    parts = {"scale": scale, "softcap": softcap, "causal": causal, "window": window,
             "lengths": (q.shape[-2], k.shape[-2])}
    rows, columns = np.asarray(rows, dtype=np.int64), np.asarray(columns, dtype=np.int64)
    dq = _dq_rows(q, k, v, d_out, lse, row_sums, mask, rows, parts)
    dk, dv = _dk_dv_columns(q, k, v, d_out, lse, row_sums, mask, columns, parts)
    if hq is not None:                                   # grouped-query heads unfolded
        dq = dq.reshape(dq.shape[:-4] + (hq,) + dq.shape[-2:])
        dk, dv = dk.sum(axis=-3), dv.sum(axis=-3)
    return (reference._unbroadcast(dq, q_shape[:-2] + dq.shape[-2:]),
            reference._unbroadcast(dk, k_shape[:-2] + dk.shape[-2:]),
            reference._unbroadcast(dv, v_shape[:-2] + dv.shape[-2:]))


_LAST: list = []


def forward(q, k, v, mask, params: dict) -> tuple:
    """(out, lse) of every row in float64 (blocks.sdpa_rows, never rounded): computed once
    for the exact and the plain pass over the same inputs (the last call's kept)."""
    if _LAST and all(a is b for a, b in zip(_LAST[0], (q, k, v, mask))) \
            and _LAST[1] == params:
        return _LAST[2]
    with reference.rounded_to(None):
        found = blocks.sdpa_rows(q, k, v, mask=mask, **params)
    _LAST[:] = [(q, k, v, mask), dict(params), found]
    return found


def _folded(x, q_shape, query_heads):
    """An array of query heads (out, lse, d_out) folded as blocks._grouped folds q (Hq
    heads as Hkv x G), where it folded them (query_heads not None)."""
    if query_heads is None:
        return x
    return x.reshape(x.shape[:-3] + q_shape[-4:-2] + x.shape[-2:])


def _weights_and_ds(s, keep, lse, row_sums, g, values, parts):
    """(P, dS) of scores s (rows x keys) whose rows have lse and D_i: P = exp(s - lse),
    dP = dO V^T, dS = P (dP - D), times the softcap's derivative; 0 at a key the row does
    not see. Under rounded_to, rounded step by step as reference.sdpa_vjp rounds them,
    less its one-ulp moves of the logits and of dP, which its softmax and its row sum
    (of the same rounded P and dP) largely cancel and these, from the float64 lse and
    D_i, would not: the plain error stays within the reference's own (tests/spec/
    test_scale.py), never wider."""
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.where(keep, _r(np.exp(s - lse)), 0.0)
    dp = reference._matmul_t(g, values)
    ds = _r(p * _r(dp - row_sums))
    if reference.rounding_dtype() is not None:
        ds = reference._one_rounding_off(ds, p * (np.abs(dp) + np.abs(row_sums)))
    return p, np.where(keep, _softcapped(ds, s, parts), 0.0)


def _logits(q, k, parts):
    """The logits in float64 in either pass (reference._logits without a bias; see
    _weights_and_ds)."""
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * parts["scale"]
    softcap = parts["softcap"]
    return s if softcap is None else softcap * np.tanh(s / softcap)


def _softcapped(ds, s, parts):
    """dS times d/dx of c tanh(x / c) at the raw logits (recovered from the capped ones)."""
    softcap = parts["softcap"]
    if softcap is None:
        return ds
    with np.errstate(invalid="ignore"):
        return _r(ds * _r(1.0 - np.clip(s / softcap, -1.0, 1.0) ** 2))


def _keep(query, keys, mask, parts):
    """Which of keys `keys` each query row `query` sees (causal, the window, the mask)."""
    lq, lk = parts["lengths"]
    offset = lk - lq if parts["causal"] == "bottom_right" else 0
    keep = reference._causal_and_window(keys[None, :], (query + offset)[:, None],
                                        parts["causal"], parts["window"])
    if mask is not None:
        rows = blocks._rows_of(mask, query)
        keep = keep & (rows[..., keys] if rows.shape[-1] != 1 else rows)
    return keep


def _dq_rows(q, k, v, d_out, lse, row_sums, mask, rows, parts):
    """dq at `rows`, in groups of rows over the keys they may see (blocks.row_groups)."""
    lq, lk = parts["lengths"]
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], d_out.shape[:-2])
    dq = np.zeros(lead + (len(rows), q.shape[-1]))
    at = 0
    heads = int(np.prod(lead, dtype=np.int64))
    for index, lo, hi in blocks.row_groups(rows, lq, lk, parts["causal"], parts["window"],
                                           heads):
        if hi > lo:
            s = _logits(q[..., index, :], k[..., lo:hi, :], parts)
            keep = _keep(index, np.arange(lo, hi), mask, parts)
            _, ds = _weights_and_ds(s, keep, lse[..., index, :], row_sums[..., index, :],
                                    d_out[..., index, :], v[..., lo:hi, :], parts)
            dq[..., at:at + len(index), :] = _r(_r(_mm(ds, k[..., lo:hi, :])) * parts["scale"])
        at += len(index)
    return dq


def _dk_dv_columns(q, k, v, d_out, lse, row_sums, mask, columns, parts):
    """dk and dv at `columns`, summed over chunks of CHUNK_ROWS query rows (the chunks
    whose rows see none of the columns skipped)."""
    lq, lk = parts["lengths"]
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], d_out.shape[:-2])
    dk = np.zeros(lead + (len(columns), k.shape[-1]))
    dv = np.zeros(lead + (len(columns), v.shape[-1]))
    keys, values = k[..., columns, :], v[..., columns, :]
    for first in range(0, lq, CHUNK_ROWS):
        index = np.arange(first, min(first + CHUNK_ROWS, lq))
        lo, hi = blocks.key_range(index, lq, lk, parts["causal"], parts["window"])
        if not np.any((columns >= lo) & (columns < hi)):
            continue
        s = _logits(q[..., index, :], keys, parts)
        keep = _keep(index, columns, mask, parts)
        g = d_out[..., index, :]
        p, ds = _weights_and_ds(s, keep, lse[..., index, :], row_sums[..., index, :], g,
                                values, parts)
        dv += _r(_mm(np.swapaxes(p, -1, -2), g))
        dk += _r(_r(_mm(np.swapaxes(ds, -1, -2), q[..., index, :])) * parts["scale"])
    return dk, dv


def run(op: str, arrays: dict, params: dict, policies=None, rows=None, columns=None) -> tuple:
    """reference.run of sdpa_vjp at `rows` (dq) and `columns` (dk, dv)."""
    if op != "sdpa_vjp":
        raise ValueError(f"the sampled backward is of sdpa_vjp, not {op}")
    return sdpa_vjp(**arrays, **params, rows=rows, columns=columns, policies=policies)
