"""Per-batch sequence lengths (``q_lengths``, ``kv_lengths``) for adapters whose framework
takes a boolean mask but no lengths: the lengths, causal and window become one mask.

Shared by the built-in adapters (NumPy only; no framework is imported here). What it
composes, following docs/interface.md:

- valid tokens of batch element b (dim 0) are the first q_lengths[b] queries and the first
  kv_lengths[b] keys; a key past its length is disallowed like a masked key;
- causal and window use the per-batch position i + offset_b, offset_b =
  kv_lengths[b] - q_lengths[b] under bottom_right, else 0;
- a padded query (i >= q_lengths[b]) is never read: its q row enters as zeros, its mask
  row allows the valid keys (every key when there is none, so that no row is emptied on
  its account), its d_out row enters as zeros, and its output, weight and dq rows are
  set to 0 afterwards (padded_query_rows: zeros).
"""

from __future__ import annotations

import functools

import numpy as np


def _full(lengths, batch, size):
    if lengths is None:
        return np.full(batch, size, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.shape != (batch,) or np.any(lengths < 0) or np.any(lengths > size):
        raise ValueError(f"lengths {lengths.tolist()} do not fit a batch of {batch} "
                         f"with {size} tokens")
    return lengths


def compose(q_shape, k_shape, mask, causal, window, q_lengths, kv_lengths):
    """(mask, padded): the boolean mask (B, 1.., Lq, Lk) that holds the given mask, the
    lengths, causal and window; padded (B, 1.., Lq, 1) marks padded queries."""
    rank = max(len(q_shape), len(k_shape))
    if rank < 3:
        raise ValueError("q_lengths and kv_lengths need a batch dim")
    batch, lq, lk = q_shape[0], q_shape[-2], k_shape[-2]
    q_len = _full(q_lengths, batch, lq)[:, None, None]
    kv_len = _full(kv_lengths, batch, lk)[:, None, None]
    i = np.arange(lq)[None, :, None]
    j = np.arange(lk)[None, None, :]
    valid_keys = np.broadcast_to(j < kv_len, (batch, lq, lk))
    keep = valid_keys.copy()
    position = i + (kv_len - q_len if causal == "bottom_right" else 0)
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
    lead = (batch,) + (1,) * (rank - 3)
    keep = keep.reshape(lead + (lq, lk))
    if mask is not None:
        keep = keep & np.asarray(mask, dtype=bool)
    padded = (i >= q_len).reshape(lead + (lq, 1))
    open_row = (valid_keys | (kv_len == 0)).reshape(lead + (lq, lk))
    return np.where(padded, open_row, keep), padded


def zero_rows(x, padded):
    """x with the rows of padded queries set to 0, in x's own dtype."""
    x = np.asarray(x)
    return np.where(padded, np.zeros((), dtype=x.dtype), x)


def as_mask(method):
    """Wrap an adapter's attention_weights, sdpa or sdpa_vjp: with q_lengths or kv_lengths,
    call it with the composed mask (causal and window folded in) and zero the padded rows."""
    vjp = method.__name__ == "sdpa_vjp"

    @functools.wraps(method)
    def wrapper(self, q, k, *arrays, mask=None, causal=None, window=None, q_lengths=None,
                kv_lengths=None, **params):
        if q_lengths is None and kv_lengths is None:
            return method(self, q, k, *arrays, mask=mask, causal=causal, window=window,
                          **params)
        mask, padded = compose(np.shape(q), np.shape(k), mask, causal, window, q_lengths,
                               kv_lengths)
        q = zero_rows(q, padded)
        if vjp:
            v, d_out = arrays
            arrays = (v, zero_rows(d_out, padded))
        result = method(self, q, k, *arrays, mask=mask, causal=None, window=None, **params)
        if vjp:                       # (dq, dk, dv), and d_sink with a sink
            return (zero_rows(result[0], padded),) + tuple(result[1:])
        return zero_rows(result, padded)

    return wrapper
