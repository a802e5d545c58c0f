"""Known bug: heads merged by a plain reshape, without moving the head axis back first."""

from _plant import Planted


def _merge_heads(x):
    return x.reshape(*x.shape[:-3], x.shape[-2], x.shape[-3] * x.shape[-1])


class HeadsMergedWithoutTranspose(Planted):
    """Heads merged without the transpose: (B, H, L, D) reshaped straight to (B, L, H*D)."""

    helpers = {"_merge_heads": _merge_heads}
