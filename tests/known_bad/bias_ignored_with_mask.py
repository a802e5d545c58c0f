"""Known bug: the additive bias is dropped whenever a boolean mask is also given."""

from _plant import Planted, original


def _probs(q, k, *, mask, bias, **kw):
    return original["_probs"](q, k, mask=mask, bias=None if mask is not None else bias, **kw)


class BiasIgnoredWithMask(Planted):
    """Bias ignored when a mask is given (mask and bias are both allowed by the interface)."""

    helpers = {"_probs": _probs}
