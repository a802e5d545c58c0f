"""Known bug: the backward recomputes P = exp(s - lse) without guarding rows whose lse is -inf.

Upstream: Dao-AILab/flash-attention issue 443 ("[flashv2/BW] nan in some configurations":
NaN dq for causal varlen with seqlen_k < seqlen_q, where rows have no key).
"""

import numpy as np

from _tiled import TiledPlanted


class TiledBwdUnguardedEmptyRows(TiledPlanted):
    """Backward P = exp(s - lse) unguarded: rows without keys give NaN gradients."""

    def _recompute_p(self, s, lse):
        return np.exp(s - lse[..., None])
