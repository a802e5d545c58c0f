"""Known bug: dK and dV are not reduced over the ring: each rank returns only its own
queries' contribution to its own block's key and value gradients.

Upstream: modelled on ring backward passes that forget to send the dK/dV accumulators
home (ring-flash-attention's backward sends them with the block, one step more)."""

from attention_conformance.backends.torch_ring import TorchRingBackend


class KvGradsNotReduced(TorchRingBackend):
    """dK/dV not reduced over the ring: only the rank's own queries' share of them."""

    name = "bad-kv-grads-not-reduced"
    reduces_kv_grads = False
