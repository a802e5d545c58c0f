"""Known bug: where a block leaves a query row no key (its chunk fully masked for that
row), the merge takes the block's empty state (0, -inf) and drops the rank's partial
state accumulated so far.

Upstream: modelled on ring and split-KV merges that special-case an empty chunk's lse of
-inf by overwriting, not skipping (FlashDecoding-style combine kernels)."""

import torch

from attention_conformance.backends.torch_ring import TorchRingBackend


class MaskedChunkDropsState(TorchRingBackend):
    """A rank's partial state dropped when the block's chunk is fully masked for a row."""

    name = "bad-masked-chunk-drops-state"

    def _merge(self, out, lse, block_out, block_lse):
        merged_out, merged = super()._merge(out, lse, block_out, block_lse)
        empty = torch.isneginf(block_lse)
        return (torch.where(empty[..., None], block_out, merged_out),
                torch.where(empty, block_lse, merged))
