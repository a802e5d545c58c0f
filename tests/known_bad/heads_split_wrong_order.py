"""Known bug: heads split in the wrong order, head h takes every H-th column."""

import numpy as np

from _plant import Planted


def _split_heads(x, h):
    x = x.reshape(*x.shape[:-1], x.shape[-1] // h, h)   # should be (h, d): columns interleave
    return np.moveaxis(x, -1, -3)


class HeadsSplitWrongOrder(Planted):
    """Heads split in the wrong order: reshape to (d, h) instead of (h, d)."""

    helpers = {"_split_heads": _split_heads}
