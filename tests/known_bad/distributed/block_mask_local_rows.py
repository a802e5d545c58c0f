"""Known bug: the block mask is read at local block numbers, as if the sequence were split
contiguously (rank r's i-th token at r·n + i); under zigzag or any load-balanced sharding
a rank's tokens lie elsewhere, and it computes the wrong blocks.

Upstream: modelled on flex_attention under PyTorch's context_parallel with its load
balancer, where a BlockMask built for the sequence in order must be rearranged for the
shuffled tokens (torch's create_cp_block_mask exists for this); one that is not reads
another query block's row."""

from attention_conformance.backends import rules
from attention_conformance.backends.torch_ring import TorchRingBackend


class BlockMaskLocalRows(TorchRingBackend):
    """Block mask read at local (contiguous) block numbers: wrong under zigzag sharding."""

    name = "bad-block-mask-local-rows"

    def _allowed(self, ring, source):
        structure = dict(ring["structure"])
        blocks = {n: structure.pop(n) for n in ("block_mask", "block_size") if n in structure}
        keep = super()._allowed({**ring, "structure": structure}, source)
        if not blocks:
            return keep
        contiguous = {**ring["shard"]}
        for side in ("q_positions", "kv_positions"):
            n = len(contiguous[side][0])
            contiguous[side] = [list(range(r * n, (r + 1) * n))
                                for r in range(ring["world"])]
        return keep & rules.shard_allowed(contiguous, source, ring["ndim"],
                                          rank=ring["rank"], **blocks)
