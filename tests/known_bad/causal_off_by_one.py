"""Known bug: the causal mask is off by one, query i sees keys j < i instead of j <= i."""

import numpy as np

from _plant import Planted, original


def _allowed(lq, lk, mask, causal, window, offset=None):
    allowed = original["_allowed"](lq, lk, mask, causal, window, offset)
    if causal is None:
        return allowed
    start = (lk - lq if causal == "bottom_right" else 0) if offset is None else offset
    position = np.arange(lq)[:, None] + start
    return allowed & (np.arange(lk)[None, :] != position)      # the diagonal is lost


class CausalOffByOne(Planted):
    """Causal mask off by one: a query no longer sees its own key."""

    helpers = {"_allowed": _allowed}
