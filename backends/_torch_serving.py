"""The serving forms on torch tensors, for the torch adapters: partial attention states
merged (torch has no merge op: composed from torch.exp and sums, the largest lse
subtracted first)."""

from __future__ import annotations

import math

import torch


def merge_states(outs: torch.Tensor, lses: torch.Tensor, lse_base: str = "e"):
    """(out, lse) of N partial states ``outs (N, *batch, Lq, Dv)``, ``lses (N, *batch, Lq)``
    in base e or 2: weights exp(lse_n - lse); a state with lse -inf or +inf (vLLM's empty
    one) weighs 0 and is not read; a row of empty states gives 0 and -inf."""
    scale = math.log(2.0) if lse_base == "2" else 1.0
    natural = torch.where(torch.isinf(lses), -torch.inf, lses * scale)
    top = torch.amax(natural, dim=0)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weights = torch.exp(natural - top)                  # the largest state weighs 1
    total = weights.sum(dim=0)
    share = torch.where(total > 0, weights / torch.where(total > 0, total, 1.0), 0.0)
    kept = torch.where(share[..., None] > 0, outs, torch.zeros_like(outs))
    return (share[..., None] * kept).sum(dim=0), (top + torch.log(total)) / scale
