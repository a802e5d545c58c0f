"""Known bug: a fully masked row gives NaN although the backend declares the zeros policy."""

import numpy as np

from _plant import Planted, original


def _probs(q, k, *, mask, causal, window, **kw):
    p, t, scale, *parts = original["_probs"](q, k, mask=mask, causal=causal, window=window,
                                             **kw)
    allowed = original["_allowed"](q.shape[-2], k.shape[-2], mask, causal, window)
    if allowed is not None:     # the plain softmax of a row of -inf: 0/0
        p = np.where(np.any(allowed, axis=-1, keepdims=True), p, np.nan).astype(p.dtype)
    return (p, t, scale, *parts)


class NanFullyMaskedRows(Planted):
    """NaN for fully masked rows under a declared fully_masked_rows: zeros policy."""

    helpers = {"_probs": _probs}
