"""The declared bitwise invariants (model/invariants.py), checked exactly: each calls the
backend again and compares bits (NaN with NaN, the sign of zero included). A backend that
does not declare the invariant is not checked for it: Unsupported, with that reason.
properties.py registers these as properties that call the backend."""

from __future__ import annotations

import numpy as np

from ..golden import reference
from ..model.case import memo
from ..model.errors import CheckFailure, Unsupported
from ..model.invariants import INVARIANTS

#: params that hold one entry per batch element when they are lists of that many
_PER_ELEMENT = ("q_lengths", "kv_lengths")
_PER_ELEMENT_IDS = ("q_segment_ids", "kv_segment_ids")


def undeclared(case, declaration) -> str | None:
    """Why a case that checks invariants is unsupported before any call (one it names
    that the backend does not declare), or None."""
    missing = [n for n in memo(case, "invariants", lambda: named_invariants(case))
               if n not in declaration.invariants]
    return undeclared_reason(missing[0]) if missing else None


def named_invariants(case) -> tuple[str, ...]:
    """The invariants among the properties of the case's expect, in its order."""
    names = [e if isinstance(e, str) else next(iter(e)) for e in
             case.expect.get("properties") or ()]
    return tuple(n for n in names if n in INVARIANTS)


def undeclared_reason(name) -> str:
    return (f"the backend does not declare {name} ({INVARIANTS[name]}); declared "
            "invariants are checked, never demanded")


def _declared(ctx, name):
    if name not in ctx.declaration.invariants:
        raise Unsupported(undeclared_reason(name))


def _same_bits(got, want, what):
    """CheckFailure unless got and want are the same bits (float64 copies of one dtype)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        raise CheckFailure(f"{what}: shape {got.shape}, expected {want.shape}")
    same = (got == want) & (np.signbit(got) == np.signbit(want)) | np.isnan(got) & np.isnan(want)
    if not np.all(same):
        where = tuple(int(i) for i in np.argwhere(~same)[0])
        raise CheckFailure(f"{what}: {float(got[where])!r} at {list(where)}, not the same bits "
                           f"as {float(want[where])!r} ({int(np.sum(~same))} of {same.size} "
                           "elements differ)")


def deterministic(ctx):
    """The same call again gives the same bits in every output."""
    _declared(ctx, "deterministic")
    again = ctx.call()
    for (name, first), second in zip(ctx.outputs.items(), again):
        _same_bits(second, first, f"{name} of the same call again")


def _batch(ctx):
    """(B, rank): the batch of the case's inputs; CheckFailure unless every input of the
    full rank has dim 0 = B >= 2 (a broadcast batch element is shared, not its own)."""
    rank = max(a.ndim for a in ctx.arrays.values())
    sizes = {a.shape[0] for a in ctx.arrays.values() if a.ndim == rank}
    if rank < 3 or len(sizes) != 1 or min(sizes) < 2:
        raise CheckFailure(f"batch_invariant needs inputs of one batch of 2 or more (dim 0 of "
                           f"rank-{rank} inputs: {sorted(sizes)})")
    return sizes.pop(), rank


def _elements(ctx, order, batch, rank):
    """The case's arrays and per-element params for the batch elements `order`."""
    arrays = {n: np.ascontiguousarray(a[order]) if a.ndim == rank else a
              for n, a in ctx.arrays.items()}
    params = {}
    for name, value in ctx.params.items():
        if name in _PER_ELEMENT or name in _PER_ELEMENT_IDS and isinstance(value[0], list) \
                or name == "block_mask" and np.ndim(value) == rank:
            params[name] = [value[i] for i in order]
    return arrays, params


def batch_invariant(ctx):
    """Each batch element alone, and the batch reversed, give the same bits as the case's
    call for that element, in every output (a vjp's dk, dv included: no input is shared
    across the batch)."""
    _declared(ctx, "batch_invariant")
    batch, rank = _batch(ctx)
    alone = []
    for b in range(batch):
        arrays, params = _elements(ctx, [b], batch, rank)
        alone.append(ctx.call(arrays, **params))
    backwards = list(range(batch))[::-1]
    arrays, params = _elements(ctx, backwards, batch, rank)
    reversed_ = ctx.call(arrays, **params)
    for i, (name, full) in enumerate(ctx.outputs.items()):
        for b in range(batch):
            _same_bits(alone[b][i][0], full[b], f"{name} of batch element {b} run alone")
            _same_bits(reversed_[i][batch - 1 - b], full[b],
                       f"{name} of batch element {b} at position {batch - 1 - b}")


def split_invariant(ctx, split: int | None = None):
    """sdpa or attention_weights over the queries [0, m) and [m, Lq) in two calls give the
    same bits as over all queries in one; causal and window are given to all three calls
    as one mask (a query's keys then do not depend on its position in the call)."""
    _declared(ctx, "split_invariant")
    q = ctx.arrays["q"]
    lq, lk = q.shape[-2], ctx.arrays["k"].shape[-2]
    m = lq // 2 if split is None else split
    if ctx.case.op not in ("sdpa", "attention_weights") or not 0 < m < lq \
            or ctx.params.get("q_lengths") is not None:
        raise CheckFailure(f"split_invariant cuts the queries of sdpa or attention_weights "
                           f"without q_lengths in two non-empty parts ({m} of {lq})")
    keep = reference.allowed_keys(lq, lk, causal=ctx.params.get("causal"),
                                  window=ctx.params.get("window"))
    mask = keep & ctx.arrays.get("mask", True)
    mask = np.broadcast_to(mask, np.broadcast_shapes(np.shape(mask), (lq, lk)))
    params = {"causal": None, "window": None}
    parts = [ctx.call(_rows(ctx, mask, rows), **params)
             for rows in (slice(None), slice(0, m), slice(m, lq))]
    whole, first, second = (p[0] for p in parts)
    _same_bits(np.concatenate([first, second], axis=-2), whole,
               f"out of the queries [0, {m}) and [{m}, {lq}) in two calls")


def _rows(ctx, mask, rows):
    """The case's arrays for the query rows `rows`, the mask given as `mask`."""
    out = {}
    for name, a in dict(ctx.arrays, mask=mask).items():
        query_side = name in ("q", "qv", "mask", "bias") and a.ndim >= 2 and a.shape[-2] != 1
        out[name] = np.ascontiguousarray(a[..., rows, :]) if query_side else a
    return out
