"""Known bug: partial states merged in base 2 (logaddexp2, exp2) while each block's lse
is natural.

Upstream: modelled on the decode context-parallel lse-base mismatch (vllm#47079): one side
of a merge in log2 (as FlashAttention's kernels keep it), the other in ln."""

import torch

from attention_conformance.backends.torch_ring import TorchRingBackend


class LseMergeWrongBase(TorchRingBackend):
    """lse merged in the wrong base: exp2 / logaddexp2 on natural log-sum-exps."""

    name = "bad-lse-merge-wrong-base"

    def _merge(self, out, lse, block_out, block_lse):
        merged = torch.logaddexp2(lse, block_lse)
        safe = torch.where(torch.isfinite(merged), merged, torch.zeros_like(merged))
        return (torch.exp2(lse - safe)[..., None] * out
                + torch.exp2(block_lse - safe)[..., None] * block_out), merged
