"""Known bug: the mask is applied after the softmax, so allowed weights no longer sum to 1."""

import numpy as np

from _plant import Planted, original


def _probs(q, k, *, mask, causal, window, **kw):
    p, t, scale, *parts = original["_probs"](q, k, mask=None, causal=None, window=None, **kw)
    allowed = original["_allowed"](q.shape[-2], k.shape[-2], mask, causal, window)
    if allowed is not None:
        p = np.where(allowed[..., :p.shape[-1]], p, 0).astype(p.dtype)
    return (p, t, scale, *parts)


class MaskAfterSoftmax(Planted):
    """Mask applied after the softmax: disallowed weights zeroed, the rest not renormalised."""

    helpers = {"_probs": _probs}
