"""The torch backends' multi_head_attention: ``torch.nn.MultiheadAttention`` with the
interface's weights where the module can express the case, otherwise projections, head
split and ``w_o`` with torch ops around the backend's own sdpa path.

Not a backend itself; imported by backends/torch.py (which imports torch first).
"""

from __future__ import annotations

import numpy as np
import torch


def multi_head_attention(attend, q, k, v, ws, heads, kv_heads, allowed, use_module):
    """(*batch, Lq, Eo) from (*batch, L, E) tensors: the module when use_module and it fits
    (kv_heads == heads, H*Dh == H*Dhv == Eq == Eo), else composed around attend."""
    with torch.no_grad():
        if use_module and kv_heads == heads and _module_fits(q.shape[-1], heads, *ws):
            return _module(q, k, v, ws, heads, allowed)
        return _composed(attend, q, k, v, ws, heads, kv_heads, allowed)


def _module_fits(e_q: int, heads: int, w_q, w_k, w_v, w_o) -> bool:
    """nn.MultiheadAttention needs H*Dh == H*Dhv == Eq == Eo (its embed_dim)."""
    return (e_q % heads == 0 and w_q.shape[1] == e_q and w_k.shape[1] == e_q
            and w_v.shape[1] == e_q and tuple(w_o.shape) == (e_q, e_q))


def _module(q, k, v, ws, heads, allowed):
    """torch.nn.MultiheadAttention with our weights, on (B, L, E) inputs."""
    w_q, w_k, w_v, w_o = ws
    e_q, e_k, e_v = q.shape[-1], k.shape[-1], v.shape[-1]
    mha = torch.nn.MultiheadAttention(e_q, heads, bias=False, kdim=e_k, vdim=e_v,
                                      batch_first=True, dtype=q.dtype).eval()
    if mha.in_proj_weight is not None:
        mha.in_proj_weight.copy_(torch.cat([w_q.T, w_k.T, w_v.T]))
    else:
        mha.q_proj_weight.copy_(w_q.T)
        mha.k_proj_weight.copy_(w_k.T)
        mha.v_proj_weight.copy_(w_v.T)
    mha.out_proj.weight.copy_(w_o.T)
    extra = [] if allowed is None else [allowed.shape[:-3]]
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], *extra)
    lq, lk = q.shape[-2], k.shape[-2]
    q3, k3, v3 = (t.expand(*lead, *t.shape[-2:]).reshape(-1, *t.shape[-2:]) for t in (q, k, v))
    attn_mask = None
    if allowed is not None:
        if allowed.dim() <= 2:
            allowed = allowed.expand(lq, lk)
        else:
            allowed = allowed.expand(*lead, heads, lq, lk).reshape(-1, lq, lk)
        attn_mask = ~allowed  # torch's bool attn_mask: True = NOT allowed
    out, _ = mha(q3, k3, v3, attn_mask=attn_mask, need_weights=False)
    return out.reshape(*lead, lq, out.shape[-1])


def _composed(attend, q, k, v, ws, heads, kv_heads, allowed):
    """Projections, head split, the sdpa path (grouped-query via enable_gqa), W_o."""
    w_q, w_k, w_v, w_o = ws
    hq = _split_heads(torch.matmul(q, w_q), heads)
    hk = _split_heads(torch.matmul(k, w_k), kv_heads)
    hv = _split_heads(torch.matmul(v, w_v), kv_heads)
    out = attend(hq, hk, hv, mask=allowed)
    return torch.matmul(_merge_heads(out), w_o)


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(..., L, heads*D) -> (..., heads, L, D); head h takes columns [h*D, (h+1)*D)."""
    return x.unflatten(-1, (heads, x.shape[-1] // heads)).movedim(-2, -3)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(..., heads, L, D) -> (..., L, heads*D)."""
    return x.movedim(-3, -2).flatten(-2)
