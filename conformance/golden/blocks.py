"""The float64 reference of sdpa and sdpa_lse, block by block: the live golden data of
the long and scale profiles.

The arithmetic is reference.py's own (its score pipeline, softmax parts and rounding
model under ``rounded_to``), over groups of query rows. Each group reads only the keys
that causal and a window let its rows see: a key block they hide is never computed (the
plain reference computes every score and masks it). The groups run on every core, in
threads: NumPy releases the GIL in matmul and in its large elementwise loops, and each
thread runs in a copy of the caller's context, so that ``rounded_to`` holds in all of
them. ``rows`` computes only those query rows (golden/sampled.py): the output of a row
needs that row's scores alone.

STATS counts what was computed (score elements, the FLOPs of the matrix products, wall
seconds), apart for the float64 reference (`exact`) and the plain same-dtype pass under
``rounded_to`` (`plain`), for benchmarks/scale.py's rates.
"""

from __future__ import annotations

import contextvars
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import reference
from .structure import STRUCTURE_PARAMS

#: score elements (batch x heads x rows x keys) of one group at most: its temporaries
#: stay within 128 MiB each, and a group of rows over a million keys still holds 16 rows
#: (each group reads its keys once: a group of one row would be bound by memory, not
#: by its arithmetic)
GROUP_ELEMENTS = 1 << 24
#: rows of one group at most (a group of more rows reads each key block for more rows)
GROUP_ROWS = 256

#: what was computed since the last reset (reset_stats), per pass
STATS = {"exact": {"scores": 0, "flops": 0, "seconds": 0.0},
         "plain": {"scores": 0, "flops": 0, "seconds": 0.0}}


def reset_stats() -> dict:
    """STATS as they were, and zeroed."""
    before = {part: dict(counts) for part, counts in STATS.items()}
    for counts in STATS.values():
        counts.update(scores=0, flops=0, seconds=0.0)
    return before


def workers() -> int:
    """Threads for the groups: every core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:          # not Linux
        return max(1, os.cpu_count() or 1)


def key_range(rows, lq: int, lk: int, causal=None, window=None) -> tuple[int, int]:
    """[lo, hi): the keys that query rows `rows` (ascending) may see under causal and
    window; hi <= lo when they see none."""
    offset = lk - lq if causal == "bottom_right" else 0
    first, last = int(rows[0]) + offset, int(rows[-1]) + offset
    lo, hi = 0, lk
    left, right = window if window is not None else (None, None)
    if left is not None and left >= 0:
        lo = max(lo, first - left)
    if causal is not None:
        hi = min(hi, last + 1)
    if right is not None and right >= 0:
        hi = min(hi, last + right + 1)
    return lo, hi


def row_groups(rows, lq, lk, causal, window, heads: int = 1) -> list[tuple[np.ndarray, int, int]]:
    """(row indices, lo, hi) of each group: ascending rows, at most GROUP_ROWS and about
    GROUP_ELEMENTS scores (x heads) a group, and no group whose key range is more than
    twice the widest of its rows' own (sampled rows far apart go in groups of their own)."""
    rows = np.asarray(rows, dtype=np.int64)
    groups, start = [], 0
    while start < len(rows):
        end = start + 1
        lo, hi = key_range(rows[start:end], lq, lk, causal, window)
        widest = max(hi - lo, 1)
        while end < len(rows) and end - start < GROUP_ROWS:
            own_lo, own_hi = key_range(rows[end:end + 1], lq, lk, causal, window)
            new_lo, new_hi = key_range(rows[start:end + 1], lq, lk, causal, window)
            widest_then = max(widest, own_hi - own_lo, 1)
            if (new_hi - new_lo) > 2 * widest_then + 64 or \
                    (end + 1 - start) * max(new_hi - new_lo, 1) * heads > GROUP_ELEMENTS:
                break
            lo, hi, widest, end = new_lo, new_hi, widest_then, end + 1
        groups.append((rows[start:end], lo, hi))
        start = end
    return groups


def _rows_of(x, index):
    """Rows `index` of an array broadcastable to the scores (a row dim of 1 stays)."""
    if x is None:
        return None
    return x[..., index, :] if x.ndim >= 2 and x.shape[-2] != 1 else x


def _keys_of(x, lo, hi):
    if x is None:
        return None
    return x[..., lo:hi] if x.shape[-1] != 1 else x


def _group(q, k, v, mask, bias, sink, index, lo, hi, params, policy):
    """(out, lse) of query rows `index` over keys [lo, hi), as reference._sdpa does it
    over every key (a row that sees no key in the range sees none at all)."""
    lq, lk = q.shape[-2], k.shape[-2]
    causal, window = params.get("causal"), params.get("window")
    offset = lk - lq if causal == "bottom_right" else 0
    keep = reference._causal_and_window(np.arange(lo, hi)[None, :], (index + offset)[:, None],
                                        causal, window)
    if mask is not None:
        keep = keep & _keys_of(_rows_of(mask, index), lo, hi)
    if _float32_plain(sink, bias, params):
        k32, v32 = params["float32"]
        found = _plain_float32(q[..., index, :], k32[..., lo:hi, :], v32[..., lo:hi, :], keep,
                               params["scale"])
        if found is not None:
            return found
    s = reference._logits(q[..., index, :], k[..., lo:hi, :], scale=params["scale"],
                          softcap=params.get("softcap"),
                          bias=_keys_of(_rows_of(bias, index), lo, hi))
    keep = np.broadcast_to(keep, s.shape)
    if sink is None and params["finite"] and reference._ROUNDING.get() is None:
        direct = _direct(s, keep, v[..., lo:hi, :])
        if direct is not None:
            return direct
    p, _, lse = reference._softmax_parts(s, keep, policy, reference._sink_column(sink))
    return reference._weighted_values(p, keep, v[..., lo:hi, :], policy), lse


def _float32_plain(sink, bias, params) -> bool:
    """Is this the plain float32 pass (rounded_to("float32")) of a call _plain_float32
    computes: finite inputs, no sink, bias or softcap?"""
    return (reference._ROUNDING.get() == "float32" and sink is None and bias is None
            and params.get("softcap") is None and params["finite"])


def _plain_float32(q, k, v, keep, scale):
    """reference.py's plain computation under rounded_to("float32"), in float32 arithmetic
    itself: a float64 product, sum or quotient rounded to float32 is float32's own
    (exp, log and the scale's product within an ulp), so the steps are the reference's:
    the float32 products q k^T and p v, each logit moved by one ulp of |s| + |q| |k|^T
    with the signs of reference._one_rounding_off, the max, exp, float32 sum and
    division, the lse. k and v come in float32 (converted once a call). None where a row
    has no allowed key (the reference's own path)."""
    q = q.astype(np.float32)
    kt = np.swapaxes(k, -1, -2)
    s = q @ kt
    s *= np.float32(scale)
    bound = np.abs(q) @ np.abs(kt)
    bound *= np.float32(abs(scale))
    bound += np.abs(s)
    signs = np.random.RandomState(0).randint(0, 2, size=s.shape) * 2.0 - 1.0
    bound *= signs.astype(np.float32)
    s += np.float32(2.0 * reference.UNIT_ROUNDOFF["float32"]) * bound
    s = np.where(keep, s, np.float32(-np.inf))
    top = np.max(s, axis=-1, keepdims=True)
    if not np.all(np.isfinite(top)):
        return None
    s -= top
    np.exp(s, out=s)
    total = np.sum(s, axis=-1, keepdims=True, dtype=np.float32)
    s /= total
    lse = top + np.log(total)
    return (s @ v).astype(np.float64), lse[..., 0].astype(np.float64)


def _direct(s, keep, v):
    """(out, lse) in float64 by the shortest route, for finite inputs (no NaN score, no
    +inf bias) where every row has an allowed key with a finite score (else None:
    reference._softmax_parts, whose policies decide such rows): the max of each row, exp
    of the scores less it in place, their sum, one product with v divided by that sum.
    It differs from the reference's own order, (e / sum) v, by float64 roundings
    (~1e-16 of the output) alone."""
    s = np.where(keep, s, -np.inf)
    top = np.max(s, axis=-1, keepdims=True)
    if not np.all(np.isfinite(top)):
        return None
    s -= top
    np.exp(s, out=s)
    total = np.sum(s, axis=-1, keepdims=True)
    return (s @ v) / total, (top + np.log(total))[..., 0]


def sdpa_rows(q, k, v, *, rows=None, mask=None, bias=None, sink=None, causal=None,
              scale=None, softcap=None, window=None, policies=None):
    """(out, lse) of reference.sdpa_lse, for the query rows `rows` (ascending indices;
    None: every row): out (..., len(rows), Dv), lse (..., len(rows)). None of
    UNBLOCKED_PARAMS (reference.sdpa takes those)."""
    started = time.perf_counter()
    reference._prepare(q[..., :1, :], k[..., :1, :], v[..., :1, :], None, None, scale)  # shapes
    q, k, v, bias = (reference._f64(x) for x in (q, k, v, bias))
    scale = reference.default_scale(q.shape[-1]) if scale is None else scale
    mask = None if mask is None else np.asarray(mask, dtype=bool)
    policy = reference._policies(policies)
    lq, lk = q.shape[-2], k.shape[-2]
    q, k, v, mask, bias, sink, query_heads = _grouped(q, k, v, mask, bias, sink)
    rows = np.arange(lq) if rows is None else np.asarray(rows, dtype=np.int64)
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    out = np.zeros(lead + (len(rows), v.shape[-1]))
    lse = np.full(lead + (len(rows),), -np.inf)
    params = {"causal": causal, "window": window, "scale": scale, "softcap": softcap,
              "finite": _finite(q, k, v, bias)}
    if _float32_plain(sink, bias, params):
        params["float32"] = (k.astype(np.float32), v.astype(np.float32))
    heads = int(np.prod(lead, dtype=np.int64))
    groups = row_groups(rows, lq, lk, causal, window, heads)
    starts = np.cumsum([0] + [len(g[0]) for g in groups])     # groups partition rows, in order

    def run(number):
        index, lo, hi = groups[number]
        if hi <= lo or (policy["fully_masked_rows"] == "uniform" and _some_row_empty(
                index, lo, hi, lq, lk, causal, window)):
            lo, hi = 0, lk          # empty rows: their policy's lse and weights need every key
        part_out, part_lse = _group(q, k, v, mask, bias, sink, index, lo, hi, params, policy)
        at = slice(starts[number], starts[number + 1])
        out[..., at, :] = part_out
        lse[..., at] = part_lse
        return heads * len(index) * (hi - lo)

    with ThreadPoolExecutor(workers()) as pool:
        contexts = [contextvars.copy_context() for _ in groups]
        scores = sum(pool.map(lambda n: contexts[n].run(run, n), range(len(groups))))
    # the matrix products: q k^T and p v; rounded, also |q| |k|^T (reference._logits)
    rounded = reference._ROUNDING.get() is not None
    counts = STATS["plain" if rounded else "exact"]
    counts["scores"] += int(scores)
    counts["flops"] += int(scores) * 2 * (q.shape[-1] * (2 if rounded else 1) + v.shape[-1])
    counts["seconds"] += time.perf_counter() - started
    if query_heads is None:
        return out, lse
    heads = lead[:-2] + (query_heads,)
    return out.reshape(heads + out.shape[-2:]), lse.reshape(heads + lse.shape[-1:])


def _grouped(q, k, v, mask, bias, sink):
    """Grouped-query heads folded without copying a key (reference.py repeats them): q as
    (..., Hkv, G, Lq, D), k and v as (..., Hkv, 1, Lk, D), a mask or bias with Hq heads as
    (..., Hkv, G, ., .) and one with a head of 1 as (..., 1, 1, ., .), a sink as
    (..., Hkv, G); and Hq, to unfold the outputs (None where nothing is grouped)."""
    if q.ndim < 3 or k.ndim < 3 or q.shape[-3] == k.shape[-3] or k.shape[-3] == 1:
        return q, k, v, mask, bias, sink, None
    hq, hkv = q.shape[-3], k.shape[-3]
    group = hq // hkv

    def heads(x):
        if x is None or x.ndim < 3:
            return x
        if x.shape[-3] == hq:
            return x.reshape(x.shape[:-3] + (hkv, group) + x.shape[-2:])
        return x[..., None, :, :]
    if sink is not None:
        sink = reference._f64(sink)
        sink = sink.reshape(sink.shape[:-1] + (hkv, group)) if sink.shape[-1] == hq \
            else sink[..., None]
    return (q.reshape(q.shape[:-3] + (hkv, group) + q.shape[-2:]), k[..., None, :, :],
            v[..., None, :, :], heads(mask), heads(bias), sink, hq)


def _finite(q, k, v, bias) -> bool:
    """Are q, k and v finite, and the bias free of NaN and +inf (-inf masks a key)?"""
    return all(np.all(np.isfinite(x)) for x in (q, k, v)) and (
        bias is None or not np.any(np.isnan(bias) | (bias == np.inf)))


def _some_row_empty(index, lo, hi, lq, lk, causal, window) -> bool:
    """Does causal or the window leave a row of `index` no key at all?"""
    return any(key_range(index[i:i + 1], lq, lk, causal, window)[1]
               <= key_range(index[i:i + 1], lq, lk, causal, window)[0]
               for i in range(len(index)))


def sdpa(q, k, v, **params):
    """reference.sdpa, block by block (every row)."""
    return sdpa_rows(q, k, v, **params)[0]


def sdpa_lse(q, k, v, **params):
    """reference.sdpa_lse, block by block (every row)."""
    return sdpa_rows(q, k, v, **params)


#: the ops computed here (others go to reference.run), and whether each returns lse
BLOCKED = {"sdpa": False, "sdpa_lse": True}


#: the params this module leaves to reference.py (per-batch lengths, structured masks)
UNBLOCKED_PARAMS = ("q_lengths", "kv_lengths") + STRUCTURE_PARAMS


def blocked(op: str, params: dict) -> bool:
    """Does this module compute the op with these params (none of UNBLOCKED_PARAMS)?"""
    return op in BLOCKED and all(params.get(name) is None for name in UNBLOCKED_PARAMS)


def run(op: str, arrays: dict, params: dict, policies=None, rows=None) -> tuple:
    """reference.run for the ops of BLOCKED, block by block; `rows`: only those query rows."""
    out, lse = sdpa_rows(**arrays, **params, policies=policies, rows=rows)
    return (out, lse) if BLOCKED[op] else (out,)
