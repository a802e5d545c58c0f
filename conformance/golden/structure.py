"""The float64 reference's structured masks: packed documents (segment ids) and
block-sparse masks, each made into the boolean mask it means (docs/interface.md,
"Packed documents" and "Block-sparse masks").

Written from the definitions, element by element, apart from the adapters' rule in
backends/rules.py:

- ``q_segment_ids`` / ``kv_segment_ids``: query i may see key j only when both carry the
  same document id (of their batch element, for one list per element of dim 0);
- ``block_mask`` with ``block_size = (Bq, Bk)``: query i may see key j only when
  block ``(i // Bq, j // Bk)`` is nonzero.

Both are and-ed with the case's own mask; causal, window and lengths apply on top as
they always do (global positions).
"""

from __future__ import annotations

import functools

import numpy as np

#: the params this module folds into the mask
STRUCTURE_PARAMS = ("q_segment_ids", "kv_segment_ids", "block_mask", "block_size")


def _ids(ids, rank):
    """Segment ids as an int array (L,) or (B, 1.., L) of `rank - 1` dims."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim == 1:
        return ids
    return ids.reshape((ids.shape[0],) + (1,) * (rank - 3) + ids.shape[1:])


def document_keys(score_shape, q_segment_ids, kv_segment_ids):
    """Boolean, broadcastable to the scores: query i and key j carry one document id."""
    rank = len(score_shape)
    q_ids = _ids(q_segment_ids, rank)[..., :, None]
    kv_ids = _ids(kv_segment_ids, rank)[..., None, :]
    return q_ids == kv_ids


def block_keys(score_shape, block_mask, block_size):
    """Boolean (..., Lq, Lk): key j allowed for query i when its block is nonzero."""
    blocks = np.asarray(block_mask) != 0
    size_q, size_k = block_size
    rows = np.arange(score_shape[-2]) // size_q
    cols = np.arange(score_shape[-1]) // size_k
    return blocks[..., rows[:, None], cols[None, :]]


def structure_mask(score_shape, mask, q_segment_ids=None, kv_segment_ids=None,
                   block_mask=None, block_size=None):
    """The case's mask and-ed with what its segment ids and block mask allow (the mask
    itself, maybe None, when neither is given)."""
    parts = [] if mask is None else [np.asarray(mask, dtype=bool)]
    if q_segment_ids is not None or kv_segment_ids is not None:
        parts.append(document_keys(score_shape, q_segment_ids, kv_segment_ids))
    if block_mask is not None:
        parts.append(block_keys(score_shape, block_mask, block_size))
    if not parts:
        return None
    keep = parts[0]
    for part in parts[1:]:
        keep = keep & part
    return keep


def _score_shape(q, k):
    q, k = np.shape(q), np.shape(k)
    lead = np.broadcast_shapes(q[:-2], k[:-3] + (q[-3],) if len(k) >= 3 and len(q) >= 3
                               else k[:-2])
    return lead + (q[-2], k[-2])


def structured(function):
    """A reference op that takes the structure params: they become its mask."""

    @functools.wraps(function)
    def wrapper(q, k, *arrays, mask=None, **params):
        structure = {name: params.pop(name) for name in STRUCTURE_PARAMS if name in params}
        if any(value is not None for value in structure.values()):
            mask = structure_mask(_score_shape(q, k), mask, **structure)
        return function(q, k, *arrays, mask=mask, **params)

    return wrapper
