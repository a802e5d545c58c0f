"""The absorbed form of multi-head latent attention for adapters (docs/interface.md,
"Absorbed MLA"): FlashAttention 3's ``qv``, scores ``(q kᵀ + qv vᵀ) · scale`` with the
scale 1/sqrt(Dk + Dv) by default, is plain attention of q and qv side by side against k
and v side by side (FlashMLA's form). ``rules.lengths_as_mask`` and
``rules.structure_as_mask`` fold it in for the sdpa they wrap. NumPy only, like rules."""

from __future__ import annotations

import math

import numpy as np


def fold_qv(q, k, v, qv, scale=None):
    """(q and qv side by side, k and v side by side, the scale): plain attention over
    these computes the absorbed form."""
    q, k, v, qv = (np.asarray(x) for x in (q, k, v, qv))
    keys = np.broadcast_shapes(k.shape[:-1], v.shape[:-1])
    wide_k = np.concatenate([np.broadcast_to(k, keys + k.shape[-1:]),
                             np.broadcast_to(v, keys + v.shape[-1:])], axis=-1)
    scale = 1.0 / math.sqrt(q.shape[-1] + qv.shape[-1]) if scale is None else scale
    return np.concatenate([q, qv], axis=-1), wide_k, scale


def qv_folded(q, k, arrays, params):
    """A wrapped sdpa's q and k with params' qv (if any) folded in, params' scale set;
    arrays: the positional inputs after q and k (v first)."""
    qv = params.pop("qv", None)
    if qv is None:
        return q, k
    q, k, params["scale"] = fold_qv(q, k, arrays[0], qv, params.get("scale"))
    return q, k
