"""Known bug: the mask is applied after the softmax, so allowed weights no longer sum to 1."""

import numpy as np

from _plant import Planted, original


def _probs(q, k, *, mask, causal, window, **kw):
    p, t, scale = original["_probs"](q, k, mask=None, causal=None, window=None, **kw)
    allowed = original["_allowed"](q.shape[-2], k.shape[-2], mask, causal, window)
    return (p if allowed is None else np.where(allowed, p, 0).astype(p.dtype)), t, scale


class MaskAfterSoftmax(Planted):
    """Mask applied after the softmax: disallowed weights zeroed, the rest not renormalised."""

    helpers = {"_probs": _probs}
