"""Known bug: the causal skip decides from local positions (rank * n + i), as if the
sequence were split contiguously; under zigzag it skips blocks a query may see.

Upstream: modelled on zigzag ring attention (ring-flash-attention's zigzag_ring_flash_attn),
where a rank holds chunks r and 2W-1-r and a skip written for contiguous chunks is wrong."""

import numpy as np

from attention_conformance.backends import rules
from attention_conformance.backends.torch_ring import TorchRingBackend


class ZigzagLocalCausalSkip(TorchRingBackend):
    """Causal skip from local, not global, positions: wrong under zigzag sharding."""

    name = "bad-zigzag-local-causal-skip"

    def _skips(self, ring, source, allowed):
        n_q, n_kv = allowed.shape[-2:]
        whole = rules.allowed(ring["lq"], ring["lk"], ring["causal"], ring["window"])
        if whole is None:
            return False
        local_q = ring["rank"] * n_q + np.arange(n_q)
        local_kv = source * n_kv + np.arange(n_kv)
        return not whole[np.ix_(local_q, local_kv)].any()
