"""Known bug: attention dropout (p = 0.1) left on at inference, as in training mode."""

import numpy as np

from _plant import Planted, original


def _probs(q, k, **kw):
    p, t, scale, *parts = original["_probs"](q, k, **kw)
    keep = np.random.RandomState(0).random_sample(p.shape) >= 0.1
    return ((p * keep / p.dtype.type(0.9)).astype(p.dtype), t, scale, *parts)


class DropoutLeftOn(Planted):
    """Dropout left on: 10% of the weights zeroed and the rest scaled by 1/0.9."""

    helpers = {"_probs": _probs}
