"""Known bug: keys and values swapped (attention over V, weighted sum of K)."""

from _plant import Planted, original


def _sdpa(q, k, v, **kw):
    return original["_sdpa"](q, v, k, **kw)


class KvSwapped(Planted):
    """K and V swapped: scores from the values, output from the keys."""

    helpers = {"_sdpa": _sdpa}
