"""Known bug: causal alignments swapped, top_left is treated as bottom_right and back."""

from _plant import Planted, original

SWAP = {"top_left": "bottom_right", "bottom_right": "top_left", None: None}


def _allowed(lq, lk, mask, causal, window, offset=None):
    return original["_allowed"](lq, lk, mask, SWAP[causal], window, offset)


class CausalAlignmentSwapped(Planted):
    """Causal alignments swapped: visible only where Lq != Lk."""

    helpers = {"_allowed": _allowed}
