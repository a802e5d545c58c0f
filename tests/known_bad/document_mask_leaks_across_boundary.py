"""Known bug: a packed-document mask built from cu_seqlens off by one, so that each
document's queries also see the last key of the document before it (a key crosses one
boundary)."""

import numpy as np

from _plant import Planted


def _leaky_mask(mask, q, k, q_segment_ids, kv_segment_ids):
    """The mask the buggy kernel uses: same document, or the key just before the
    query's document starts (the previous document's last key)."""
    rank = max(np.ndim(q), np.ndim(k))
    q_ids = np.asarray(q_segment_ids)[..., :, None]
    kv_ids = np.asarray(kv_segment_ids)
    next_ids = np.concatenate([kv_ids[..., 1:], kv_ids[..., -1:]], axis=-1)[..., None, :]
    keep = (q_ids == kv_ids[..., None, :]) | (q_ids == next_ids)
    if keep.ndim == 3:
        keep = keep.reshape((keep.shape[0],) + (1,) * (rank - 3) + keep.shape[1:])
    return keep if mask is None else keep & np.asarray(mask, dtype=bool)


def _leaking(op):
    def call(self, q, k, *arrays, mask=None, q_segment_ids=None, kv_segment_ids=None,
             **params):
        if q_segment_ids is not None:
            mask = _leaky_mask(mask, q, k, q_segment_ids, kv_segment_ids)
        return getattr(Planted, op)(self, q, k, *arrays, mask=mask, **params)
    call.__name__ = op
    return call


class DocumentMaskLeaksAcrossBoundary(Planted):
    """Document mask off by one (cu_seqlens): a query sees the previous document's last key."""

    attention_weights = _leaking("attention_weights")
    sdpa = _leaking("sdpa")
    sdpa_vjp = _leaking("sdpa_vjp")
