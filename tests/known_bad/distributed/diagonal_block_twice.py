"""Known bug: the ring merges a rank's own block twice (the diagonal block counted twice).

Upstream: modelled on a ring that double-counted replicated tokens (sglang PR 33327): a
block merged twice weighs its keys twice in the softmax."""

import torch

from attention_conformance.backends.torch_ring import TorchRingBackend


class DiagonalBlockTwice(TorchRingBackend):
    """Diagonal block counted twice: the rank's own key block is merged once more at the end."""

    name = "bad-diagonal-block-twice"

    def _forward(self, ring, q, k, v, scale, softcap):
        out, lse = super()._forward(ring, q, k, v, scale, softcap)
        allowed = self._allowed(ring, ring["rank"])      # k, v here are the rank's own block
        if self._skips(ring, ring["rank"], allowed):
            return out, lse
        block = self.block_lse(q, k, v, mask=torch.from_numpy(allowed), scale=scale,
                               softcap=softcap)
        return self._merge(out, lse, *block)
