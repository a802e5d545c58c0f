"""The serving forms on torch tensors, for the torch adapters: partial attention states
merged (torch has no merge op: composed from torch.exp and sums, the largest lse
subtracted first), the dtype of an lse, and fp8 inputs read and fp8 outputs written
through torch's own float8 dtypes."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import torch

#: the spec's fp8 formats as torch's dtypes (torch has them on the CPU, but its SDPA does
#: not take them there: '"mul_cpu_reduced_float" not implemented for 'Float8_e4m3fn'')
FP8 = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}


def fp8_to_float32(x) -> np.ndarray:
    """An fp8 NumPy array (ml_dtypes) cast to float32 by torch: its bits viewed as
    torch's float8 dtype, then torch's own cast (rules.descaled's to_float32)."""
    x = np.ascontiguousarray(x)
    if x.dtype.name not in FP8:
        return x.astype(np.float32)
    return torch.from_numpy(x.view(np.uint8)).view(FP8[x.dtype.name]).to(torch.float32).numpy()


def scaled_output(out: np.ndarray, o_scale, fmt: str) -> np.ndarray:
    """The output written with an output scale, by torch's own float8 cast: out / o_scale
    clamped to the format's largest finite value (torch's cast does not saturate: e4m3fn
    past 448 becomes NaN), its bits viewed as the ml_dtypes format (rules.descaled's
    quantize)."""
    dtype = FP8[fmt]
    top = torch.finfo(dtype).max
    x = torch.clamp(torch.from_numpy(np.asarray(out, np.float64)) / float(o_scale), -top, top)
    bits = x.to(dtype).view(torch.uint8).numpy()
    return np.array(bits.view(getattr(ml_dtypes, fmt)), copy=True)


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of an lse beside outputs of ``dtype``: float32 beside float16 and bfloat16
    (docs/interface.md, "Arrays and dtypes"), else ``dtype``."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


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
