"""Known bug: the running max starts at a finite -5e4 sentinel instead of -inf.

Upstream: flashinfer-ai/flashinfer issue 4267 and PR 4401 (FA2 kernels initialise the
online-softmax max to -math::inf = -5e4: a row whose logits are all below it returns zeros).
"""

from _tiled import TiledPlanted


class TiledFiniteInitialMax(TiledPlanted):
    """Running max initialised to -5e4: rows whose scores all lie below it come out as zeros."""

    def _initial_max(self):
        return -5e4
