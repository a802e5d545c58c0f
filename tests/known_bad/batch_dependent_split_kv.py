"""Known bug: the number of key splits is chosen from the batch size (as FlashAttention's
num_splits heuristic does), so a sequence's output changes in its last bits with the
batch it runs in, while the backend declares batch_invariant."""

import numpy as np

from _plant import Planted, original


def _sdpa(q, k, v, **kw):
    """P V, its key sum cut in two halves added afterwards when the batch has more than
    one element (a split-KV launch for a larger batch)."""
    p, _, _ = original["_probs"](q, original["_expand_kv"](k, q), **kw)
    v = original["_expand_kv"](v, q)
    if q.ndim < 3 or q.shape[0] == 1:
        return p @ v
    half = p.shape[-1] // 2
    return p[..., :half] @ v[..., :half, :] + p[..., half:] @ v[..., half:, :]


class BatchDependentSplitKv(Planted):
    """Split count from the batch size: bits change with the batch (declares batch_invariant)."""

    invariants = ("deterministic", "batch_invariant", "split_invariant")
    helpers = {"_sdpa": _sdpa}
