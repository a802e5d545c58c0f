"""The float64 reference of the serving forms: a paged KV cache read back into
contiguous keys and values, partial attention states merged, fp8 inputs times
their descale factors, and an fp8 output over its output scale.

Written from docs/interface.md ("Paged KV cache", "Merging partial states", "fp8 inputs
and descale factors", "The output scale"),
independently of every backend (backends/rules.py has the adapters' own gather).
"""

from __future__ import annotations

import math

import numpy as np

from ..model.ops import PAGE_LAYOUTS
from ..model.policies import DEFAULT_POLICIES
from .rounding import _r, _ro, _sum


def pages_as_tokens(pages, layout):
    """(num_pages, page_size, Hkv, D) whatever the layout."""
    if layout not in PAGE_LAYOUTS:
        raise ValueError(f"unknown page layout {layout!r}")
    return pages if layout == "NHD" else np.swapaxes(pages, 1, 2)


def read_pages(pages, block_table, kv_lengths, layout="NHD"):
    """The keys (or values) of each sequence as (B, Hkv, L, D), L = max(kv_lengths, 1).

    Sequence b's token t lies in page block_table[b][t // page_size] at slot
    t % page_size; its first kv_lengths[b] tokens are read, nothing else: the slots past
    them (and the pages the table lists beyond them) stay 0 here, whatever they hold."""
    tokens = pages_as_tokens(np.asarray(pages, dtype=np.float64), layout)
    _, page_size, heads, width = tokens.shape
    longest = max(max(kv_lengths), 1)
    out = np.zeros((len(kv_lengths), heads, longest, width))
    for b, (row, length) in enumerate(zip(block_table, kv_lengths)):
        for t in range(length):
            out[b, :, t, :] = tokens[row[t // page_size], t % page_size]
    return out


def dequantized(x, descale):
    """x (q, k or v; an fp8 case's values as stored, in float64) times its descale
    factor: one for the tensor, shape (1,), or one per batch element and kv head, (B,
    Hkv), which query head h of a group of G = Hq / Hkv reads at column h // G."""
    x = np.asarray(x, dtype=np.float64)
    if descale is None:
        return x
    descale = np.asarray(descale, dtype=np.float64)
    if descale.size == 1:
        return _r(x * descale.reshape(()))
    per_head = np.repeat(descale, x.shape[-3] // descale.shape[-1], axis=-1)   # (B, H)
    return _r(x * per_head[..., None, None])


def scaled_output(out, o_scale):
    """The output written with an output scale: out / o_scale, the value whose product
    with o_scale is the attention (FlashInfer's o_scale, real = quantized * o_scale;
    vLLM's output_scale), saturated at the largest finite value of the case's fp8 format
    (rounding.output_format) and, in the plain computation, rounded to it."""
    return out if o_scale is None else _ro(np.asarray(out, dtype=np.float64) / float(o_scale))


def _empty(lse):
    """A state that holds no key: lse -inf, or +inf as vLLM spells it (FlashAttention's
    lse of an empty row)."""
    return np.isinf(lse)


def merge_states(outs, lses, *, policies=None):
    """(out, lse) of N partial states (outs: (N, *batch, Lq, Dv), lses: (N, *batch, Lq))
    merged: weights w_n = exp(lse_n - lse), lse = log(sum_n exp(lse_n)), lses in the
    base of the `lse_base` policy (2: exp2 and log2). An empty state (lse +-inf) has
    weight 0 and its output is never read; a row whose every state is empty merges to
    output 0 and lse -inf."""
    base = math.log(2.0) if dict(DEFAULT_POLICIES, **(policies or {}))["lse_base"] == "2" else 1.0
    outs, lses = np.asarray(outs, dtype=np.float64), np.asarray(lses, dtype=np.float64)
    natural = np.where(_empty(lses), -np.inf, _r(lses * base))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        top = np.max(natural, axis=0, keepdims=True)
        finite_top = np.where(np.isfinite(top), top, 0.0)
        weights = _r(np.exp(_r(natural - finite_top)))           # 0 for an empty state
        total = _sum(weights, 0)
        share = _r(np.where(total > 0, weights / np.where(total > 0, total, 1.0), 0.0))
        kept = np.where(share[..., None] > 0, outs, 0.0)         # an empty state's is not read
        out = _r(_sum(_r(share[..., None] * kept), 0))[0]
        lse = _r(finite_top + _r(np.log(total)))[0]
    return out, _r(lse / base)
