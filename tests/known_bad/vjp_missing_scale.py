"""Known bug: the backward pass forgets the scale, dq and dk are off by 1/scale."""

from _plant import Planted, original


def _probs(q, k, **kw):
    p, t, scale, *parts = original["_probs"](q, k, **kw)
    return (p, t, type(scale)(1), *parts)     # the backward pass multiplies ds by this scale


class VjpMissingScale(Planted):
    """Scale missing from the gradient: ds is not multiplied by the scale in sdpa_vjp."""

    helpers = {"_probs": _probs}
