"""Known bug: the boolean mask read with PyTorch's key_padding_mask polarity (True = ignore)."""

from _plant import Planted, original


def _mask(mask):
    mask = original["_mask"](mask)
    return None if mask is None else ~mask


class KeyPaddingMaskInverted(Planted):
    """Mask inverted: True taken to mean 'ignore this key', the opposite of the interface."""

    helpers = {"_mask": _mask}
