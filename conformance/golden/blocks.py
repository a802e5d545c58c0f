"""The float64 reference of sdpa and sdpa_lse, block by block: the live golden data of
the long and scale profiles.

The arithmetic is reference.py's own (its score pipeline, softmax parts and rounding
model under ``rounded_to``), over groups of query rows. Each group reads only the keys
that causal and a window let its rows see: a key block they hide is never computed (the
plain reference computes every score and masks it). The groups run on every core, in
threads: NumPy releases the GIL in matmul and in its large elementwise loops, and each
thread runs in a copy of the caller's context, so that ``rounded_to`` holds in all of
them. ``rows`` computes only those query rows (golden/sampled.py): the output of a row
needs that row's scores alone. A group's scores live in a buffer kept for the next
(workspace), are scaled, masked and exponentiated in place, and only the columns that
some of its rows may not see are compared with causal and the window; grouped-query
heads go to BLAS as one product per kv head.

STATS counts what was computed (score elements, the FLOPs of the matrix products, wall
and CPU seconds), apart for the float64 reference (`exact`) and the plain same-dtype pass under
``rounded_to`` (`plain`), for benchmarks/scale.py's rates.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import reference
from .structure import STRUCTURE_PARAMS

#: score elements (batch x heads x rows x keys) of one group, once it holds GROUP_MIN_ROWS
#: rows: 16 MiB in float64, so that the passes over a group's scores (scale, mask, max,
#: exp, sum) run in cache, not in memory
GROUP_ELEMENTS = 1 << 21
#: rows a group holds before GROUP_ELEMENTS stops it: each group reads its keys once, and
#: a group of one row over a million keys would be bound by reading them, not by its
#: arithmetic
GROUP_MIN_ROWS = 16
#: score elements of one group at most, whatever its rows: its buffers stay within
#: 128 MiB each
GROUP_ELEMENTS_MAX = 1 << 24
#: rows of one group at most (a group of more rows reads each key block for more rows)
GROUP_ROWS = 256

#: what was computed since the last reset (reset_stats), per pass: score elements, FLOPs
#: of the matrix products, wall seconds and CPU seconds (of every thread of the groups)
STATS = {"exact": {"scores": 0, "flops": 0, "seconds": 0.0, "cpu_seconds": 0.0},
         "plain": {"scores": 0, "flops": 0, "seconds": 0.0, "cpu_seconds": 0.0}}


def reset_stats() -> dict:
    """STATS as they were, and zeroed."""
    before = {part: dict(counts) for part, counts in STATS.items()}
    for counts in STATS.values():
        counts.update(scores=0, flops=0, seconds=0.0, cpu_seconds=0.0)
    return before


_FREE: list = []
_FREE_LOCK = threading.Lock()


@contextlib.contextmanager
def workspace(nbytes: int):
    """A byte buffer of at least nbytes for one group's score matrices, kept for the
    next group and the next call (one per thread at most, the largest kept): a fresh
    array of 128 MiB costs the kernel a page fault per 4 KiB page each time."""
    with _FREE_LOCK:
        fits = [n for n, b in enumerate(_FREE) if b.nbytes >= nbytes]
        buffer = _FREE.pop(min(fits, key=lambda n: _FREE[n].nbytes)) if fits else None
    if buffer is None:
        buffer = np.empty(nbytes, dtype=np.uint8)
    try:
        yield buffer
    finally:
        with _FREE_LOCK:
            _FREE.append(buffer)
            _FREE.sort(key=lambda b: -b.nbytes)
            del _FREE[workers():]


def _views(buffer, shape, *dtypes) -> list:
    """Arrays of `shape`, one per dtype, laid one after another in buffer."""
    count, found, at = int(np.prod(shape, dtype=np.int64)), [], 0
    for dtype in dtypes:
        size = count * np.dtype(dtype).itemsize
        found.append(buffer[at:at + size].view(dtype).reshape(shape))
        at += size
    return found


def _bytes(shape, *dtypes) -> int:
    return int(np.prod(shape, dtype=np.int64)) * sum(np.dtype(d).itemsize for d in dtypes)


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
    GROUP_ELEMENTS scores (x heads) a group (more, up to GROUP_ELEMENTS_MAX, until it
    holds GROUP_MIN_ROWS rows), and no group whose key range is more than
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
            elements = (end + 1 - start) * max(new_hi - new_lo, 1) * heads
            if (new_hi - new_lo) > 2 * widest_then + 64 or elements > GROUP_ELEMENTS_MAX or \
                    (elements > GROUP_ELEMENTS and end - start >= GROUP_MIN_ROWS):
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
    over every key (a row that sees no key in the range sees none at all). Finite inputs
    without a sink take the short routes, _exact in float64 and _plain_float32 under
    rounded_to("float32"); the rest, and a row with no allowed key, reference.py's own."""
    if sink is None and params["finite"]:
        rounding = reference.rounding_dtype()
        found = None
        if rounding is None:
            found = _exact(q, k, v, mask, bias, index, lo, hi, params)
        elif rounding == "float32" and bias is None and params.get("softcap") is None:
            found = _plain_float32(q, mask, index, lo, hi, params)
        if found is not None:
            return found
    lq, lk = q.shape[-2], k.shape[-2]
    causal, window = params.get("causal"), params.get("window")
    offset = lk - lq if causal == "bottom_right" else 0
    keep = reference._causal_and_window(np.arange(lo, hi)[None, :], (index + offset)[:, None],
                                        causal, window)
    if mask is not None:
        keep = keep & _keys_of(_rows_of(mask, index), lo, hi)
    s = reference._logits(q[..., index, :], k[..., lo:hi, :], scale=params["scale"],
                          softcap=params.get("softcap"),
                          bias=_keys_of(_rows_of(bias, index), lo, hi))
    keep = np.broadcast_to(keep, s.shape)
    p, _, lse = reference._softmax_parts(s, keep, policy, reference._sink_column(sink))
    return reference._weighted_values(p, keep, v[..., lo:hi, :], policy), lse


def _matmul(a, b, out):
    """a @ b into out over broadcast leading axes. Grouped-query heads (a (..., Hkv, G, R,
    X) against b (..., Hkv, 1, X, Y), _grouped's shapes) go as one product of G x R rows
    per kv head: numpy's broadcast matmul multiplies each of the G heads alone, several
    times slower."""
    if (a.ndim >= 3 and b.ndim == a.ndim and b.shape[-3] == 1 and a.shape[-3] > 1
            and a.shape[:-3] == b.shape[:-3] and a.flags.c_contiguous
            and out.flags.c_contiguous and out.shape[:-2] == a.shape[:-2]):
        np.matmul(a.reshape(a.shape[:-3] + (-1, a.shape[-1])), b[..., 0, :, :],
                  out=out.reshape(out.shape[:-3] + (-1, out.shape[-1])))
        return out
    return np.matmul(a, b, out=out)


def _scores_shape(rows, kt) -> tuple:
    return np.broadcast_shapes(rows.shape[:-2], kt.shape[:-2]) + (rows.shape[-2], kt.shape[-1])


def _hide(s, index, lo, hi, params, mask):
    """-inf where causal, the window or the mask hide key lo + j from row index[i]. Only
    the columns that some row of the group may not see are compared (key_range: every
    row sees the keys between the last row's first and the first row's last)."""
    lq, lk = params["lengths"]
    causal, window = params.get("causal"), params.get("window")
    seen_lo = min(max(key_range(index[-1:], lq, lk, causal, window)[0], lo), hi)
    seen_hi = min(max(key_range(index[:1], lq, lk, causal, window)[1], lo), hi)
    spans = [(lo, hi)] if seen_lo >= seen_hi else [(lo, seen_lo), (seen_hi, hi)]
    offset = lk - lq if causal == "bottom_right" else 0
    for first, end in spans:
        if end > first:
            keep = reference._causal_and_window(np.arange(first, end)[None, :],
                                                (index + offset)[:, None], causal, window)
            np.copyto(s[..., first - lo:end - lo], -np.inf, where=~keep)
    if mask is not None:
        np.copyto(s, -np.inf, where=~_keys_of(_rows_of(mask, index), lo, hi))


def _exact(q, k, v, mask, bias, index, lo, hi, params):
    """(out, lse) in float64 by the shortest route, for finite inputs (no NaN score, no
    +inf bias) where every row has an allowed key with a finite score (else None:
    reference._softmax_parts, whose policies decide such rows): the scores in a kept
    buffer (workspace), scaled, capped and biased in place as reference._logits does,
    the hidden keys at -inf, the max of each row, exp of the scores less it in place,
    their sum, one product with v divided by that sum. It differs from the reference's
    own order, (e / sum) v, by float64 roundings (~1e-16 of the output) alone."""
    rows, kt = q[..., index, :], np.swapaxes(k[..., lo:hi, :], -1, -2)
    shape = _scores_shape(rows, kt)
    with workspace(_bytes(shape, np.float64)) as buffer:
        [s] = _views(buffer, shape, np.float64)
        _matmul(rows, kt, s)
        s *= params["scale"]
        softcap = params.get("softcap")
        if softcap is not None:
            s /= softcap
            np.tanh(s, out=s)
            s *= softcap
        if bias is not None:
            s += _keys_of(_rows_of(bias, index), lo, hi)
        _hide(s, index, lo, hi, params, mask)
        found = _exponentiated(s)
        if found is None:
            return None
        top, total = found
        out = _times_values(s, v[..., lo:hi, :])
    return out / total, (top + np.log(total))[..., 0]


def _exponentiated(s):
    """exp(s - the row's max) in place, and (the max, the sum of the exponentials) of each
    row in s's dtype; None where a row's max is not finite (no allowed key, or -inf)."""
    top = np.max(s, axis=-1, keepdims=True)
    if not np.all(np.isfinite(top)):
        return None
    s -= top
    np.exp(s, out=s)
    return top, np.sum(s, axis=-1, keepdims=True, dtype=s.dtype)


def _times_values(p, values):
    """p @ values (_matmul), in p's dtype."""
    shape = np.broadcast_shapes(p.shape[:-2], values.shape[:-2]) + (p.shape[-2],
                                                                    values.shape[-1])
    return _matmul(p, values, np.empty(shape, dtype=p.dtype))


_SIGNS: list = []


def _signs(shape) -> np.ndarray:
    """Fixed random signs (+-1, float32) of `shape`: the first elements of one seeded
    table, made once (reference._one_rounding_off draws them for each shape anew)."""
    size = int(np.prod(shape, dtype=np.int64))
    with _FREE_LOCK:
        if not _SIGNS or _SIGNS[0].size < size:
            count = max(size, GROUP_ELEMENTS_MAX)
            bits = np.unpackbits(np.frombuffer(np.random.RandomState(0).bytes(-(-count // 8)),
                                               dtype=np.uint8))[:count]
            table = bits.astype(np.float32)
            table *= 2
            table -= 1
            _SIGNS[:] = [table]
        return _SIGNS[0][:size].reshape(shape)


def _plain_float32(q, mask, index, lo, hi, params):
    """reference.py's plain computation under rounded_to("float32"), in float32 arithmetic
    itself: a float64 product, sum or quotient rounded to float32 is float32's own
    (exp, log and the scale's product within an ulp), so the steps are the reference's:
    the float32 products q k^T and p v, each logit moved by one ulp of |s| + |q| |k|^T
    with fixed random signs (reference._one_rounding_off), the max, exp, float32 sum and
    division, the lse, in a kept buffer (workspace). k, |k| and v come in float32
    (converted once a call). None where a row has no allowed key (the reference's own
    path)."""
    k32, abs_k32, v32 = params["float32"]
    rows = q[..., index, :].astype(np.float32)
    kt = np.swapaxes(k32[..., lo:hi, :], -1, -2)
    shape = _scores_shape(rows, kt)
    scale = params["scale"]
    with workspace(_bytes(shape, np.float32, np.float32, np.float32)) as buffer:
        s, bound, size = _views(buffer, shape, np.float32, np.float32, np.float32)
        _matmul(rows, kt, s)
        s *= np.float32(scale)
        _matmul(np.abs(rows), np.swapaxes(abs_k32[..., lo:hi, :], -1, -2), bound)
        bound *= np.float32(abs(scale))
        bound += np.abs(s, out=size)
        bound *= _signs(shape)
        bound *= np.float32(2.0 * reference.UNIT_ROUNDOFF["float32"])
        s += bound
        _hide(s, index, lo, hi, params, mask)
        found = _exponentiated(s)
        if found is None:
            return None
        top, total = found
        s /= total
        out = _times_values(s, v32[..., lo:hi, :])
    return out.astype(np.float64), (top + np.log(total))[..., 0].astype(np.float64)


def sdpa_rows(q, k, v, *, rows=None, mask=None, bias=None, sink=None, causal=None,
              scale=None, softcap=None, window=None, policies=None):
    """(out, lse) of reference.sdpa_lse, for the query rows `rows` (ascending indices;
    None: every row): out (..., len(rows), Dv), lse (..., len(rows)). None of
    UNBLOCKED_PARAMS (reference.sdpa takes those)."""
    started, cpu = time.perf_counter(), time.process_time()
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
              "finite": _finite(q, k, v, bias), "lengths": (lq, lk)}
    if reference.rounding_dtype() == "float32" and params["finite"]:
        k32 = k.astype(np.float32)
        params["float32"] = (k32, np.abs(k32), v.astype(np.float32))
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
    rounded = reference.rounding_dtype() is not None
    counts = STATS["plain" if rounded else "exact"]
    counts["scores"] += int(scores)
    counts["flops"] += int(scores) * 2 * (q.shape[-1] * (2 if rounded else 1) + v.shape[-1])
    counts["seconds"] += time.perf_counter() - started
    counts["cpu_seconds"] += time.process_time() - cpu
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
    """Are q, k and v finite, and the bias free of NaN and +inf (-inf masks a key)? (A sum
    is finite only where every term is: NaN and inf carry through it, and one that
    overflows only sends the call down the reference's own path.)"""
    return all(np.isfinite(np.sum(x)) for x in (q, k, v)) and (
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
    if (policies or {}).get("lse_base") == "2":         # the lse_base convention
        lse = reference._r(lse / math.log(2.0))
    return (out, lse) if BLOCKED[op] else (out,)
