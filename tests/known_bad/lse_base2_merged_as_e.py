"""Known bug (flashinfer#2113, vllm#47079, sglang#33064): attention that writes a base-2
lse (FlashInfer's) merged by code that reads it as a natural log."""

import math

from _plant import Planted
from attention_conformance.backends import rules


class LseBase2MergedAsE(Planted):
    """Base-2 lse merged as base e: declares lse_base 2, its merge uses exp, not exp2."""

    def __init__(self):
        super().__init__()
        self.policy = dict(self.policy, lse_base="2")

    def sdpa_lse(self, q, k, v, **params):
        out, lse = super().sdpa_lse(q, k, v, **params)
        return out, (lse.astype(float) / math.log(2.0)).astype(lse.dtype)

    def merge_states(self, outs, lses):
        out, lse = rules.merge_states(outs, lses, "e")
        return out.astype(outs.dtype), lse.astype(lses.dtype)
