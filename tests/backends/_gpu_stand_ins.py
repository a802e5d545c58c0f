"""Stand-ins of FlashInfer's and vLLM's ops on the CPU, for the GPU adapters' conversions.

The `flashinfer` and `vllm-flash` adapters are prepared without a GPU. Here each of the
library functions they call is written in float64 torch, from what that library
documents (shapes, layouts, its CSR page form, bottom-right causal and windows, a log2
lse for FlashInfer, a natural one for vLLM), and the adapters are certified on the CPU
over them (tests/backends/test_gpu_adapters.py): what fails is the adapter's conversion
(packing, layouts, block tables, masks, lse shapes), not the library's arithmetic, which
only a GPU run (scripts/gpu_certify.sh) certifies. Where a library documents nothing (an
empty state in a merge) the stand-in does what the spec says. The torch-context-parallel
adapter runs with plain SDPA in place of context_parallel (ContextParallelOnCpu).
"""

from __future__ import annotations

import math
import types

import torch

from attention_conformance.backends import rules
from attention_conformance.backends.flashinfer import FlashinferBackend
from attention_conformance.backends.torch_context_parallel import TorchContextParallelBackend
from attention_conformance.backends.vllm_flash import VllmFlashBackend

LN2 = math.log(2.0)


def attend(q, k, v, allowed, scale, cap=None, sink=None, out_dtype=None):
    """q (ql, Hq, D), k (kl, Hkv, D), v (kl, Hkv, Dv), allowed (ql, kl) -> out (ql, Hq,
    Dv) of out_dtype (q's) and the natural lse (Hq, ql) in float64; a row without keys: 0,
    -inf. sink (Hq,): one more key per head, of value 0, in every row's denominator."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, 1) for t in (k, v))
    s = torch.einsum("qhd,khd->hqk", q.double(), k)
    s = cap * torch.tanh(s * scale / cap) if cap else s * scale
    s = s.masked_fill(~allowed.bool(), -math.inf)
    lse = torch.logsumexp(s, -1)
    if sink is not None:
        lse = torch.logaddexp(lse, sink.double()[:, None].expand_as(lse))
    p = torch.where(torch.isinf(lse)[..., None], 0.0, torch.exp(s - lse[..., None]))
    return torch.einsum("hqk,khd->qhd", p, v).to(out_dtype or q.dtype), lse


def bottom_right(ql, kl, causal, left=-1, right=-1):
    """The keys of FlashInfer's and FlashAttention's masks: query i at i + kl - ql."""
    i = torch.arange(ql)[:, None] + kl - ql
    j = torch.arange(kl)[None, :]
    keep = torch.ones(ql, kl, dtype=torch.bool)
    if causal:
        keep &= j <= i
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return keep


def pages(pool, ids, tokens, layout="NHD"):
    """The first `tokens` tokens of the pages `ids` of a pool, (tokens, H, D)."""
    chosen = pool[torch.as_tensor(ids, dtype=torch.long)]
    if layout == "HND":
        chosen = chosen.transpose(1, 2)
    return chosen.reshape(-1, *chosen.shape[2:])[:tokens]


def merged(outs, lses, base):
    """rules.merge_states (the spec's merge) on tensors, in the given lse base."""
    out, lse = rules.merge_states(outs.double().numpy(), lses.double().numpy(), base)
    return torch.from_numpy(out), torch.from_numpy(lse)


# ---------------------------------------------------------------- FlashInfer


def _fi_prefill(q, k, v, custom_mask=None, causal=False, kv_layout="NHD", sm_scale=None,
                window_left=-1, logits_soft_cap=None, return_lse=False, sinks=None,
                o_data_type=None, v_scale=None):
    assert kv_layout == "NHD"
    assert sinks is None or (sinks.dtype == torch.float32 and sinks.shape == q.shape[1:2])
    ql, kl = q.shape[0], k.shape[0]
    mask = custom_mask.reshape(ql, kl) if custom_mask is not None else \
        bottom_right(ql, kl, causal, window_left)
    out, lse = attend(q, k, v, mask, sm_scale, logits_soft_cap, sinks, torch.float64)
    out = (out * (1.0 if v_scale is None else v_scale)).to(o_data_type or q.dtype)
    return (out, (lse / LN2).T.float()) if return_lse else out


def _fi_decode(q, k, v, kv_layout="NHD", sm_scale=None, window_left=-1,
               logits_soft_cap=None, return_lse=False):
    result = _fi_prefill(q[None], k, v, kv_layout=kv_layout, sm_scale=sm_scale,
                         window_left=window_left, logits_soft_cap=logits_soft_cap,
                         return_lse=return_lse)
    return (result[0][0], result[1][0]) if return_lse else result[0]


class _Paged:
    """BatchPrefillWithPagedKVCacheWrapper and BatchDecodeWithPagedKVCacheWrapper."""

    def __init__(self, workspace, kv_layout="NHD"):
        self.layout = kv_layout

    def plan(self, *args, causal=False, window_left=-1, custom_mask=None, sm_scale=None,
             logits_soft_cap=None, q_data_type=None, kv_data_type=None, o_data_type=None):
        if len(args) == 7:                  # decode: no qo_indptr, one query each
            args = (torch.arange(len(args[0])).int(),) + args
        self.qo, self.indptr, self.indices, self.last, _, _, _, self.page_size = args
        self.form = dict(causal=causal, window_left=window_left, sm_scale=sm_scale,
                         logits_soft_cap=logits_soft_cap, o_data_type=o_data_type)
        self.mask = custom_mask
        assert q_data_type is not None and kv_data_type is not None

    def run(self, q, paged_kv_cache, q_scale=None, k_scale=None, v_scale=None,
            return_lse=False, sinks=None):
        """sm_scale times q_scale and k_scale, the output times v_scale (prefill.py)."""
        assert all(x is None or type(x) is float for x in (q_scale, k_scale, v_scale))
        assert all(p.dtype == paged_kv_cache[0].dtype for p in paged_kv_cache)
        form = dict(self.form, sm_scale=self.form["sm_scale"] * (q_scale or 1.0) *
                    (k_scale or 1.0), v_scale=v_scale, sinks=sinks, return_lse=return_lse)
        outs, lses, mask_at = [], [], 0
        for b in range(len(self.indptr) - 1):
            ids = self.indices[self.indptr[b]:self.indptr[b + 1]]
            tokens = self.page_size * (len(ids) - 1) + int(self.last[b]) if len(ids) else 0
            k, v = (pages(p, ids, tokens, self.layout) for p in paged_kv_cache)
            qb = q[self.qo[b]:self.qo[b + 1]]
            mask = None
            if self.mask is not None:
                mask = self.mask[mask_at:mask_at + len(qb) * tokens]
                mask_at += len(qb) * tokens
            out, lse = _fi_prefill(qb, k, v, custom_mask=mask, **dict(form, return_lse=True))
            outs.append(out)
            lses.append(lse)
        return (torch.cat(outs), torch.cat(lses)) if return_lse else torch.cat(outs)


class _BlockSparse:
    def __init__(self, workspace):
        pass

    def plan(self, indptr, indices, M, N, R, C, num_qo_heads, num_kv_heads, head_dim,
             mask=None, sm_scale=None, logits_soft_cap=None, **dtypes):
        self.allowed = torch.zeros(M, N, dtype=torch.bool)
        for r in range(len(indptr) - 1):
            for p in range(int(indptr[r]), int(indptr[r + 1])):
                c = int(indices[p])
                self.allowed[r * R:(r + 1) * R, c * C:(c + 1) * C] = \
                    True if mask is None else mask[p]
        self.form = dict(sm_scale=sm_scale, logits_soft_cap=logits_soft_cap)

    def run(self, q, k, v):
        return _fi_prefill(q, k, v, custom_mask=self.allowed, **self.form)


class _Mla:
    def __init__(self, workspace):
        pass

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv,
             head_dim_kpe, page_size, causal, sm_scale, q_data_type, kv_data_type):
        self.qo, self.indptr, self.indices, self.lengths = qo_indptr, kv_indptr, kv_indices, \
            kv_len_arr
        self.causal, self.scale = causal, sm_scale

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, return_lse=False):
        latent = torch.cat([ckv_cache, kpe_cache], -1)
        outs, lses = [], []
        for b in range(len(self.indptr) - 1):
            ids = self.indices[self.indptr[b]:self.indptr[b + 1]]
            k = pages(latent, ids, int(self.lengths[b]))[:, None]
            q = torch.cat([q_nope, q_pe], -1)[self.qo[b]:self.qo[b + 1]]
            out, lse = attend(q, k, k[..., :512],
                              bottom_right(len(q), len(k), self.causal), self.scale)
            outs.append(out)
            lses.append((lse / LN2).T.float())
        return (torch.cat(outs), torch.cat(lses)) if return_lse else torch.cat(outs)


def _fi_merge_states(v, s):
    out, lse = merged(v.transpose(0, 1), s.transpose(0, 1), "2")
    return out.to(v.dtype), lse.float()


FLASHINFER = types.SimpleNamespace(
    single_prefill_with_kv_cache=_fi_prefill, single_decode_with_kv_cache=_fi_decode,
    BatchPrefillWithPagedKVCacheWrapper=_Paged, BatchDecodeWithPagedKVCacheWrapper=_Paged,
    BlockSparseAttentionWrapper=_BlockSparse, merge_states=_fi_merge_states,
    mla=types.SimpleNamespace(BatchMLAPagedAttentionWrapper=_Mla))


class FlashinferOnCpu(FlashinferBackend):
    """The flashinfer adapter over the stand-ins, on the CPU."""

    name = "flashinfer-stand-in"

    def __init__(self):
        self.device, self.unavailable, self.lib = torch.device("cpu"), None, FLASHINFER
        self.versions = {"device": "cpu", "flashinfer": "stand-in"}


# ---------------------------------------------------------------- vLLM


def _varlen(q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k=None,
            seqused_k=None, q_v=None, softmax_scale=None, causal=False, window_size=None,
            softcap=0.0, block_table=None, return_softmax_lse=False, q_descale=None,
            k_descale=None, v_descale=None, fa_version=2, s_aux=None):
    """vLLM's flash_attn_varlen_func; FA3's s_aux, q_v and descales as hopper/flash_api.cpp
    checks them (s_aux bfloat16 (num_heads,); q_v heads <= 64, values >= 256; descales
    (b, h_k) float32 with an e4m3 q, k and v; an fp8 output is bfloat16)."""
    fp8 = q.dtype == torch.float8_e4m3fn
    if fa_version == 2:
        assert s_aux is None and q_v is None and not fp8 and q_descale is None
    assert s_aux is None or (s_aux.dtype == torch.bfloat16 and s_aux.shape == q.shape[1:2])
    assert q_v is None or (q.shape[-1] <= 64 and q_v.shape[-1] >= 256
                           and q_v.shape[:-1] == q.shape[:-1] and q_v.dtype == q.dtype)
    assert k.dtype == q.dtype == v.dtype and q.dtype in (torch.float16, torch.bfloat16) or fp8
    batch = len(cu_seqlens_q) - 1
    for d in (q_descale, k_descale, v_descale):
        assert d is None or (d.dtype == torch.float32 and d.shape == (batch, k.shape[-2]))
    outs, lses = [], []
    for b in range(batch):
        qb = q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]].double()
        if block_table is not None:
            tokens = int(seqused_k[b])
            ids = block_table[b][:-(-tokens // k.shape[1])]
            kb, vb = pages(k, ids, tokens).double(), pages(v, ids, tokens).double()
        else:
            kb, vb = (t[cu_seqlens_k[b]:cu_seqlens_k[b + 1]].double() for t in (k, v))
        group = qb.shape[1] // kb.shape[1]
        for x, d, g in ((qb, q_descale, group), (kb, k_descale, 1), (vb, v_descale, 1)):
            if fp8 and d is not None:
                x *= d[b].double().repeat_interleave(g)[:, None]
        if q_v is not None:     # (q kᵀ + q_v vᵀ): q and q_v side by side against k and v
            qb = torch.cat([qb, q_v[cu_seqlens_q[b]:cu_seqlens_q[b + 1]].double()], -1)
            kb = torch.cat([kb, vb], -1)
        mask = bottom_right(len(qb), len(kb), causal, *(window_size or (-1, -1)))
        out, lse = attend(qb, kb, vb, mask, softmax_scale, softcap or None, s_aux,
                          torch.bfloat16 if fp8 else q.dtype)
        outs.append(out)
        lses.append(lse.float())
    out = torch.cat(outs)
    return (out, torch.cat(lses, 1)) if return_softmax_lse else out


def _merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse,
                       output_lse=None):
    out, lse = merged(torch.stack([prefix_output, suffix_output]),
                      torch.stack([prefix_lse.T, suffix_lse.T]), "e")
    output.copy_(out.to(output.dtype))
    if output_lse is not None:
        output_lse.copy_(lse.T.float())


class VllmFlashOnCpu(VllmFlashBackend):
    """The vllm-flash adapter over the stand-ins, on the CPU."""

    name = "vllm-flash-stand-in"

    def __init__(self):
        self.device, self.unavailable, self.lib = torch.device("cpu"), None, None
        self.varlen, self.merge, self.fa_version = _varlen, _merge_attn_states, 3
        self.versions = {"device": "cpu", "vllm": "stand-in"}



# ---------------------------------------------------------------- torch context parallel


class ContextParallelOnCpu(TorchContextParallelBackend):
    """The torch-context-parallel adapter with its CUDA part (context_parallel itself)
    replaced by torch's SDPA over the whole gathered sequence on the CPU: what runs is the
    adapter's own part, each rank's shards gathered over the suite's group, put at their
    global positions, and its rows (and dK, dV) given back."""

    name = "torch-context-parallel-stand-in"
    dtypes = frozenset({"float64", "float32"})
    dtype_notes = {}

    def __init__(self):
        self.device, self.unavailable, self.lib = torch.device("cpu"), None, None
        self.versions = {"device": "cpu", "context_parallel": "stand-in"}

    def _context_parallel(self, whole, causal, scale, shard, dtype_name):
        import torch.nn.functional as F

        dtype = torch.float64 if dtype_name == "float64" else torch.float32
        leaves = [t.to(dtype).detach().requires_grad_(len(whole) == 4) for t in whole[:3]]
        group = leaves[0].shape[1] // leaves[1].shape[1]
        k, v = (t.repeat_interleave(group, dim=1) for t in leaves[1:])
        out = F.scaled_dot_product_attention(leaves[0], k, v, is_causal=causal, scale=scale)
        if len(whole) == 3:
            return [out.detach()]
        return [g.detach() for g in torch.autograd.grad(out, leaves, whole[3].to(dtype))]
