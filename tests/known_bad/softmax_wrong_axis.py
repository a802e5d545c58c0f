"""Known bug: the softmax normalises over queries (axis -2) instead of keys."""

from _plant import Planted, original


def _softmax(s, axis=-1):
    return original["_softmax"](s, axis=-2 if s.ndim >= 2 else axis)


class SoftmaxWrongAxis(Planted):
    """Softmax over the wrong axis: dim -2 (queries) where it must be -1 (keys)."""

    helpers = {"_softmax": _softmax}
