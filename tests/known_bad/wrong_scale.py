"""Known bug: the default scale is 1/d_k instead of 1/sqrt(d_k)."""

from _plant import Planted, original


def _probs(q, k, *, scale, **kw):
    return original["_probs"](q, k, scale=1.0 / q.shape[-1] if scale is None else scale, **kw)


class WrongScale(Planted):
    """Wrong scale: scores divided by d_k, not sqrt(d_k), when no scale is given."""

    helpers = {"_probs": _probs}
