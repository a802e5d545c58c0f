"""Rules every attention adapter needs, written once: which keys a query may see, the
per-batch lengths folded into one boolean mask, and the layout that folds the
interface's ``(*batch, heads, L, D)`` arrays into a framework's 4-D one.

Public and stable for adapter authors, inside this project or outside it (import
``attention_conformance.backends.rules``; NumPy only: no framework, nothing of the suite).

Which keys query i may see (docs/interface.md, step 4 of the score pipeline):

- query i sits at position ``p = i + offset``; the offset is ``Lk - Lq`` under
  ``causal="bottom_right"`` (``kv_lengths[b] - q_lengths[b]`` with lengths), else 0;
- ``causal`` allows the keys ``j <= p``;
- ``window=(left, right)`` allows ``p - left <= j <= p + right``; a side that is None or
  negative is open.

Functions and classes:

- ``allowed(lq, lk, causal, window)``: that rule as a boolean ``(Lq, Lk)`` array;
- ``causal_offset``, ``window_sides``, ``check_causal``: its parts, for an adapter that
  passes its framework's own flags (``is_causal``, a window size) instead of a mask;
- ``and_masks(*masks)``: the positions every given mask allows;
- ``compose_lengths``, ``zero_padded_rows``, ``lengths_as_mask``: ``q_lengths`` and
  ``kv_lengths`` for a framework that takes a boolean mask but no lengths;
- ``segment_mask``, ``block_mask_dense``, ``structure_mask``, ``structure_as_mask``:
  packed documents (``q_segment_ids``, ``kv_segment_ids``) and block-sparse masks
  (``block_mask``, ``block_size``) as one boolean mask, for a framework without them
  (``lengths_as_mask`` folds them in too);
- ``shard_allowed``: in a sharded call, which of a rank's queries may see which keys of
  another rank's block (causal, window, documents and block mask on global positions);
- ``Layout``: broadcast batch dims flattened into one, grouped-query heads, and back;
- ``key_range``: the keys a block of queries may see (a blocked kernel skips the rest);
- ``memory_bytes``, ``check_size``, ``sized``: refuse, with the reason, a call whose score
  matrices this machine cannot hold (NotImplementedError: the test is unsupported, by size);
- ``gather_pages``: a paged KV cache read back as contiguous keys and values;
- ``merge_states``: partial attention states (output, lse) merged, in base e or 2;
- ``dequantize``, ``descaled``, ``scaled_output`` (fp8), ``fold_qv`` (MLA's ``qv``), ``lse_dtype``.
"""

from __future__ import annotations

import functools
import math
import os

import numpy as np

from ._fp8 import FP8, dequantize, descaled, scaled_output  # noqa: F401 (fp8: the API)
from .absorbed import fold_qv, qv_folded as _qv_folded  # noqa: F401 (fold_qv: public)
from ._outputs import identity_values, lse_dtype  # noqa: F401 (public)
from ._signature import signed

#: the values of ``causal``
CAUSAL = (None, "top_left", "bottom_right")
#: the params that say which keys a query may see as structure (structure_mask)
STRUCTURE = ("q_segment_ids", "kv_segment_ids", "block_mask", "block_size")
_LENGTHS = ("q_lengths", "kv_lengths")


# ---------------------------------------------------------------- which keys a query sees


def check_causal(causal) -> None:
    """Raise ValueError unless causal is one of CAUSAL."""
    if causal not in CAUSAL:
        raise ValueError(f"causal must be one of {CAUSAL}, got {causal!r}")


def causal_offset(lq: int, lk: int, causal) -> int:
    """Where query 0 sits among the keys: Lk - Lq under bottom_right, else 0."""
    return lk - lq if causal == "bottom_right" else 0


def window_sides(window) -> tuple:
    """(left, right) of a window as ints, None for an open side (None or negative)."""
    return (None, None) if window is None else tuple(
        None if side is None or side < 0 else int(side) for side in window)


def allowed(lq: int, lk: int, causal=None, window=None, *, offset=None):
    """Bool (Lq, Lk): True where query i may see key j under causal and window; None when
    neither is given.

    ``offset`` (default ``causal_offset(lq, lk, causal)``) places query 0 among the keys;
    an integer array of shape (B, 1, 1) gives each batch element its own, and the result
    is then (B, Lq, Lk).
    """
    check_causal(causal)
    if causal is None and window is None:
        return None
    position = np.arange(lq)[:, None] + (causal_offset(lq, lk, causal) if offset is None
                                         else offset)
    key = np.arange(lk)
    left, right = window_sides(window)
    keep = [key <= position] if causal is not None else []    # each condition's own array:
    if left is not None:                                      # no np.ones, no &= (~6 us)
        keep.append(key >= position - left)
    if right is not None:
        keep.append(key <= position + right)
    return and_masks(*keep) if keep else np.ones(np.broadcast_shapes(position.shape, (lk,)), bool)


def key_range(first: int, end: int, lq: int, lk: int, causal=None, window=None) -> tuple:
    """[lo, hi): the keys that queries first .. end - 1 may see under causal and window
    (hi <= lo: none); a blocked kernel computes those keys' scores alone."""
    check_causal(causal)
    offset = causal_offset(lq, lk, causal)
    left, right = window_sides(window)
    lo = 0 if left is None else max(0, first + offset - left)
    hi = lk if causal is None else min(lk, end - 1 + offset + 1)
    if right is not None:
        hi = min(hi, end - 1 + offset + right + 1)
    return lo, hi


def and_masks(*masks):
    """The positions every given boolean mask allows (``&``, broadcast), None when none is
    given. Works on NumPy arrays and on a framework's boolean tensors alike."""
    present = [m for m in masks if m is not None]
    return functools.reduce(lambda a, b: a & b, present) if present else None


# ---------------------------------------------------------------- per-batch lengths


def _lengths(lengths, batch: int, size: int) -> np.ndarray:
    if lengths is None:
        return np.full(batch, size, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.shape != (batch,) or np.any(lengths < 0) or np.any(lengths > size):
        raise ValueError(f"lengths {lengths.tolist()} do not fit a batch of {batch} "
                         f"with {size} tokens")
    return lengths


def compose_lengths(q_shape, k_shape, mask, causal, window, q_lengths, kv_lengths):
    """(mask, padded): one boolean mask (B, 1.., Lq, Lk) that holds the given mask, the
    lengths, causal and window; padded (B, 1.., Lq, 1) marks the padded queries.

    Batch element b (dim 0) has its first q_lengths[b] queries and kv_lengths[b] keys; a
    key past its length is disallowed, and under bottom_right the offset is
    kv_lengths[b] - q_lengths[b]. A padded query's row allows the valid keys (every key
    when there is none), so that no row is emptied on its account: its output is set to
    0 afterwards (zero_padded_rows).
    """
    rank = max(len(q_shape), len(k_shape))
    if rank < 3:
        raise ValueError("q_lengths and kv_lengths need a batch dim")
    batch, lq, lk = q_shape[0], q_shape[-2], k_shape[-2]
    q_len = _lengths(q_lengths, batch, lq)[:, None, None]
    kv_len = _lengths(kv_lengths, batch, lk)[:, None, None]
    valid_keys = np.broadcast_to(np.arange(lk) < kv_len, (batch, lq, lk))
    offset = kv_len - q_len if causal == "bottom_right" else 0
    keep = and_masks(valid_keys, allowed(lq, lk, causal, window, offset=offset))
    lead = (batch,) + (1,) * (rank - 3)
    keep = keep.reshape(lead + (lq, lk))
    if mask is not None:
        keep = keep & np.asarray(mask, dtype=bool)
    padded = (np.arange(lq)[:, None] >= q_len).reshape(lead + (lq, 1))
    open_row = (valid_keys | (kv_len == 0)).reshape(lead + (lq, lk))
    return np.where(padded, open_row, keep), padded


def zero_padded_rows(x, padded):
    """x with the rows of padded queries set to 0, in x's own dtype."""
    x = np.asarray(x)
    return np.where(padded, np.zeros((), dtype=x.dtype), x)


def lengths_as_mask(method):
    """Wrap an adapter's attention_weights, sdpa or sdpa_vjp for a framework without
    lengths or structure: segment ids and a block mask are and-ed into the mask
    (structure_mask); with q_lengths or kv_lengths, call it with the composed mask
    (causal and window folded in) and zero the padded rows of what it returns; without,
    call it as it is."""
    vjp = method.__name__ == "sdpa_vjp"

    @functools.wraps(method)
    def wrapper(self, q, k, *arrays, mask=None, causal=None, window=None, q_lengths=None,
                kv_lengths=None, **params):
        q, k = _qv_folded(q, k, arrays, params)
        structure = {n: params.pop(n) for n in STRUCTURE if n in params}
        mask = structure_mask(mask, np.shape(q), np.shape(k), **structure)
        if q_lengths is None and kv_lengths is None:
            return method(self, q, k, *arrays, mask=mask, causal=causal, window=window,
                          **params)
        mask, padded = compose_lengths(np.shape(q), np.shape(k), mask, causal, window,
                                       q_lengths, kv_lengths)
        q = zero_padded_rows(q, padded)
        if vjp:
            v, d_out = arrays
            arrays = (v, zero_padded_rows(d_out, padded))
        result = method(self, q, k, *arrays, mask=mask, causal=None, window=None, **params)
        if vjp:                       # (dq, dk, dv), and d_sink with a sink
            return (zero_padded_rows(result[0], padded),) + tuple(result[1:])
        return zero_padded_rows(result, padded)

    return signed(wrapper, method, "mask", "causal", "window", *_LENGTHS, *STRUCTURE,
                  *(() if vjp else ("qv",)))


# ---------------------------------------------------------------- packed documents


def segment_mask(q_segment_ids, kv_segment_ids, rank: int):
    """Bool, broadcastable to scores of ``rank`` dims: query i may see key j only when
    both carry the same document id (``q_segment_ids[i] == kv_segment_ids[j]``; one
    list per element of dim 0, or one list for the whole batch). None when neither is
    given. Causal and window stay on the global positions: and them on as usual."""
    if q_segment_ids is None and kv_segment_ids is None:
        return None
    if q_segment_ids is None or kv_segment_ids is None:
        raise ValueError("q_segment_ids and kv_segment_ids are given together")

    def ids(x, axis):
        x = np.expand_dims(np.asarray(x, dtype=np.int64), axis)
        if x.ndim == 2:                # one list for the batch: (L, 1) or (1, L)
            return x
        return x.reshape((x.shape[0],) + (1,) * (rank - 3) + x.shape[1:])
    return ids(q_segment_ids, -1) == ids(kv_segment_ids, -2)


def block_mask_dense(block_mask, block_size, lq: int, lk: int):
    """A block-sparse mask made dense: bool (..., Lq, Lk), True where the block holding
    (i, j), ``(i // Bq, j // Bk)`` with ``block_size = (Bq, Bk)``, is nonzero; the
    last blocks may reach past Lq or Lk. None when no block mask is given."""
    if block_mask is None:
        return None
    size_q, size_k = block_size
    blocks = np.asarray(block_mask) != 0
    dense = np.repeat(np.repeat(blocks, size_q, axis=-2), size_k, axis=-1)
    return dense[..., :lq, :lk]


def shard_allowed(shard: dict, source: int, ndim: int, *, rank=None, causal=None,
                  window=None, q_segment_ids=None, kv_segment_ids=None, block_mask=None,
                  block_size=None):
    """In a sharded call (docs/interface.md, "Sharded cases"): bool (..., n_q, n_kv),
    broadcastable to scores of ``ndim`` dims, where query ``q_positions[rank][i]`` may see
    key ``kv_positions[source][j]``: causal and window on those global positions, the
    whole sequence's document ids and block mask read at them. None when nothing masks."""
    q_pos, kv_pos = (np.asarray(shard[n][r], dtype=np.int64) for n, r in
                     (("q_positions", shard["rank"] if rank is None else rank),
                      ("kv_positions", source)))
    keep = None
    if causal is not None or window is not None:
        lq, lk = (sum(len(p) for p in shard[n]) for n in ("q_positions", "kv_positions"))
        keep = allowed(lq, lk, causal, window)[np.ix_(q_pos, kv_pos)]
    documents = None if q_segment_ids is None and kv_segment_ids is None else segment_mask(
        *(None if ids is None else np.take(np.asarray(ids), pos, axis=-1)
          for ids, pos in ((q_segment_ids, q_pos), (kv_segment_ids, kv_pos))), ndim)
    blocks = None if block_mask is None else np.take(
        np.take(np.asarray(block_mask) != 0, q_pos // block_size[0], axis=-2),
        kv_pos // block_size[1], axis=-1)
    return and_masks(keep, documents, blocks)


def structure_mask(mask, q_shape, k_shape, *, q_segment_ids=None, kv_segment_ids=None,
                   block_mask=None, block_size=None):
    """The boolean mask (None or broadcastable to the scores of q and k, given by their
    shapes) and-ed with what the segment ids and the block mask allow; the mask itself
    without them."""
    if q_segment_ids is None and kv_segment_ids is None and block_mask is None:
        return mask
    rank = max(len(q_shape), len(k_shape), len(np.shape(mask)) if mask is not None else 0)
    return and_masks(mask, segment_mask(q_segment_ids, kv_segment_ids, rank),
                     block_mask_dense(block_mask, block_size, q_shape[-2], k_shape[-2]))


def structure_as_mask(method):
    """Wrap an adapter's attention_weights, sdpa or sdpa_vjp that takes lengths its own
    way but no segment ids or block mask: they are and-ed into its mask (structure_mask)."""

    @functools.wraps(method)
    def wrapper(self, q, k, *arrays, mask=None, **params):
        q, k = _qv_folded(q, k, arrays, params)
        structure = {n: params.pop(n) for n in STRUCTURE if n in params}
        mask = structure_mask(mask, np.shape(q), np.shape(k), **structure)
        return method(self, q, k, *arrays, mask=mask, **params)

    return signed(wrapper, method, "mask", *STRUCTURE,
                  *(() if method.__name__ == "sdpa_vjp" else ("qv",)))


# ---------------------------------------------------------------- layout


def _shape(x, rank: int) -> tuple:
    return (1,) * (rank - len(x.shape)) + tuple(x.shape)


class Layout:
    """The shapes that fold interface arrays into a framework's 4-D ``(B, H, L, D)``.

    The interface's q, k, v are ``(*batch, heads, L, D)``, its mask and bias broadcast to
    the scores ``(*batch, Hq, Lq, Lk)``. Here the batch dims broadcast (NumPy rules) and
    are flattened into B, and the query heads Hq are a multiple of the key/value heads
    Hkv (grouped-query: query head h reads kv head h // (Hq / Hkv)). Arrays of any
    framework with ``shape`` and ``reshape`` fold, given its ``broadcast_to``.

    Attributes: ``batch`` (the broadcast batch dims), ``b`` (their product), ``hq``,
    ``hkv``, ``lq``, ``lk``.
    """

    def __init__(self, q, k, v, mask=None, bias=None):
        arrays = [x for x in (q, k, v, mask, bias) if x is not None]
        self._rank_out = max(2, *(len(x.shape) for x in arrays))
        rank = max(3, self._rank_out)
        q, k, v, *extras = (_shape(x, rank) for x in arrays)
        hq = np.broadcast_shapes(*((s[-3],) for s in (q, *extras)))[0]
        hkv = np.broadcast_shapes((k[-3],), (v[-3],))[0]
        if hq == 1:
            hq = hkv
        if hq % hkv:
            raise ValueError(f"{hq} query heads cannot share {hkv} key/value heads")
        self.batch = tuple(np.broadcast_shapes(*(s[:-3] for s in (q, k, v, *extras))))
        self.b = math.prod(self.batch)
        self.hq, self.hkv, self.lq, self.lk = hq, hkv, q[-2], k[-2]

    def fold(self, q, k, v, broadcast_to):
        """q, k, v as (B, Hq, Lq, Dk), (B, Hkv, Lk, Dk), (B, Hkv, Lk, Dv)."""
        return tuple(self._heads(x, heads, broadcast_to)
                     for x, heads in ((q, self.hq), (k, self.hkv), (v, self.hkv)))

    def _heads(self, x, heads, broadcast_to):
        x = x.reshape(_shape(x, len(self.batch) + 3))
        x = broadcast_to(x, self.batch + (heads,) + tuple(x.shape[-2:]))
        return x.reshape((self.b, heads) + tuple(x.shape[-2:]))

    def scores(self, x, broadcast_to, *, every_row=False):
        """A mask or bias as (B, 1 or Hq, 1 or Lq, Lk), broadcastable to the scores (with
        every_row, (B, 1 or Hq, Lq, Lk)); None stays None."""
        if x is None:
            return None
        x = x.reshape(_shape(x, len(self.batch) + 3))
        heads = 1 if x.shape[-3] == 1 else self.hq
        rows = self.lq if every_row else x.shape[-2]
        x = broadcast_to(x, self.batch + (heads, rows, self.lk))
        return x.reshape((self.b, heads, rows, self.lk))

    def restore(self, y):
        """(B, H, Lq, X) -> (*batch, H, Lq, X), at the rank the inputs broadcast to."""
        full = self.batch + tuple(y.shape[1:])
        return y.reshape(full[len(full) - self._rank_out:])


# ---------------------------------------------------------------- size


@functools.cache
def memory_bytes() -> int:
    """This machine's memory in bytes (0 where the system does not say), read once."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def score_shape(q_shape, k_shape) -> tuple:
    """The shape of the scores of q and k: batch dims broadcast, the query heads (a
    multiple of the kv heads), Lq, Lk."""
    q_shape, k_shape = tuple(q_shape), tuple(k_shape)
    cut = 3 if len(q_shape) >= 3 and len(k_shape) >= 3 else 2
    lead = q_shape[:-cut] if q_shape[:-cut] == k_shape[:-cut] else \
        np.broadcast_shapes(q_shape[:-cut], k_shape[:-cut])     # ~5 us: most calls skip it
    heads = (max(q_shape[-3], k_shape[-3]),) if cut == 3 else ()
    return tuple(lead) + heads + (q_shape[-2], k_shape[-2])


def check_size(name: str, q_shape, k_shape, itemsize: int = 4, copies: int = 3,
               share: float = 0.5, memory: int | None = None) -> None:
    """Raise NotImplementedError (the test is unsupported, by size) when `copies` score
    matrices of these query and key shapes, in elements of `itemsize` bytes, need more
    than `share` of this machine's memory (`memory` bytes: a device's own): what an
    adapter whose framework materializes the scores calls before it does."""
    memory = memory_bytes() if memory is None else memory
    shape = score_shape(q_shape, k_shape)
    needed = math.prod(shape) * itemsize * copies
    if memory and needed > share * memory:
        raise NotImplementedError(
            f"{name}: unsupported by size: {copies} score matrices of shape {shape} "
            f"({itemsize}-byte elements) need {needed / 1e9:.1f} GB, more than "
            f"{share:g} of this machine's {memory / 1e9:.1f} GB")


def sized(copies: int = 3, streams=None):
    """Wrap an adapter's attention_weights, sdpa, sdpa_lse or sdpa_vjp: check_size on its
    q and k (in their own itemsize, `copies` score matrices) before the framework runs, so
    that a call it cannot hold is unsupported, by size, not a crash. streams(params): True
    for the calls the framework computes without holding the scores (a flash kernel)."""
    def wrap(method):
        @functools.wraps(method)
        def checked(self, q, k, *arrays, **params):
            if streams is None or not streams(params):
                itemsize = max(4, np.dtype(getattr(q, "dtype", np.float32)).itemsize)
                check_size(f"{self.name} {method.__name__}", np.shape(q), np.shape(k),
                           itemsize=itemsize, copies=copies)
            return method(self, q, k, *arrays, **params)
        return signed(checked, method)      # the keywords it takes: the method's own
    return wrap


# ---------------------------------------------------------------- paged KV cache and states


def gather_pages(k_pages, v_pages, block_table, kv_lengths, page_layout="NHD"):
    """(k, v) of a paged KV cache as ``(B, Hkv, L, D)`` arrays, ``L = max(kv_lengths, 1)``.

    A page pool is ``(num_pages, page_size, Hkv, D)`` (``NHD``) or ``(num_pages, Hkv,
    page_size, D)`` (``HND``); sequence b's token t lies in page
    ``block_table[b][t // page_size]``, slot ``t % page_size``. Only the first
    ``kv_lengths[b]`` tokens of each sequence are read: the slots past them stay 0 (the
    pages listed past them, and the rest of its last page, may hold anything). Page ids
    are taken as 64-bit integers. Pass the result with ``kv_lengths`` to the backend's
    sdpa."""
    if page_layout not in ("NHD", "HND"):
        raise ValueError(f"page_layout must be NHD or HND, got {page_layout!r}")
    pools = [np.asarray(p) if page_layout == "NHD" else np.swapaxes(np.asarray(p), 1, 2)
             for p in (k_pages, v_pages)]
    page_size = pools[0].shape[1]
    longest = max(max(kv_lengths), 1)
    result = []
    for pool in pools:
        dense = np.zeros((len(kv_lengths), pool.shape[2], longest, pool.shape[3]), pool.dtype)
        for b, length in enumerate(kv_lengths):
            token = np.arange(length)
            ids = np.asarray(block_table[b], dtype=np.int64)[token // page_size]
            dense[b, :, :length] = np.swapaxes(pool[ids, token % page_size], 0, 1)
        result.append(dense)
    return tuple(result)


def merge_states(outs, lses, lse_base="e"):
    """(out, lse) of N partial states merged, in float64: ``outs (N, *batch, Lq, Dv)``,
    ``lses (N, *batch, Lq)`` in base ``e`` or ``2``. A state with lse ``-inf`` or ``+inf``
    (vLLM's spelling of an empty one) has weight 0 and its output is not read; a row
    whose every state is empty gives output 0 and lse ``-inf``."""
    scale = math.log(2.0) if lse_base == "2" else 1.0
    outs, lses = np.asarray(outs, np.float64), np.asarray(lses, np.float64) * scale
    lses = np.where(np.isinf(lses), -np.inf, lses)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        top = np.max(lses, axis=0)
        top = np.where(np.isfinite(top), top, 0.0)
        weights = np.exp(lses - top)
        total = np.sum(weights, axis=0)
        share = np.where(total > 0, weights / np.where(total > 0, total, 1.0), 0.0)
        out = np.sum(share[..., None] * np.where(share[..., None] > 0, outs, 0.0), axis=0)
        lse = (top + np.log(total)) / scale
    return out, lse

