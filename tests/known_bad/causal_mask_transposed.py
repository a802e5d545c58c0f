"""Known bug: the causal mask is the upper triangle (triu for tril): queries see the future."""

import numpy as np

from _plant import Planted, original


def _allowed(lq, lk, mask, causal, window, offset=None):
    allowed = original["_allowed"](lq, lk, mask, None, window, offset)
    if causal is None:
        return allowed
    start = (lk - lq if causal == "bottom_right" else 0) if offset is None else offset
    position = np.arange(lq)[:, None] + start
    future = np.arange(lk)[None, :] >= position
    return future if allowed is None else allowed & future


class CausalMaskTransposed(Planted):
    """Causal mask transposed: query i sees keys j >= i instead of j <= i."""

    helpers = {"_allowed": _allowed}
