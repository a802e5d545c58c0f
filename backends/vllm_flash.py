"""vLLM's FlashAttention (``vllm.vllm_flash_attn``) on one CUDA GPU: the `vllm-flash`
backend.

Prepared without a GPU and unverified on hardware: written from vLLM's fork of
FlashAttention (vllm_flash_attn/flash_attn_interface.py: ``flash_attn_varlen_func``) and
vLLM's ``merge_attn_states`` (vllm/v1/attention/ops/merge_attn_states.py). Where CUDA is
absent it loads, imports no vLLM, and every test is unsupported with the reason
(backends/_cuda.py); scripts/gpu_certify.sh certifies it on a GPU machine.

- ``sdpa``, ``sdpa_lse``: ``flash_attn_varlen_func`` over the batch packed end to end
  (``cu_seqlens_q``/``cu_seqlens_k`` from ``q_lengths``/``kv_lengths``, the interface's
  "Variable sequence lengths"); ``causal`` and ``window_size`` are FlashAttention's, both
  aligned bottom-right (query i at i + Lk - Lq), so top-left causal with Lq != Lk, and a
  window without causal where Lq != Lk, are unsupported. No mask, bias, documents or
  block mask: FlashAttention takes none.
- ``paged_sdpa``: the same function with ``block_table`` and ``seqused_k``: vLLM's paged
  KV cache, pages ``(num_blocks, block_size, Hkv, D)`` (an HND pool is transposed to it),
  a block size that is a multiple of 16 (vLLM's FlashAttention backend's).
- ``merge_states``: ``merge_attn_states`` (two states; N folded pairwise), base e, which
  reads a +inf lse as an empty state.

FlashAttention 3 where vLLM says the GPU has it (``is_fa_version_supported(3)``: Hopper),
else 2; the version is in ``versions``. float16 and bfloat16 only; heads padded with zero
columns to 64, 128 or 256 (exact) and ``softmax_scale`` always passed.
"""

from __future__ import annotations

import math

import numpy as np

from . import rules
from ._cuda import CudaAdapter, pad_head, padded_head, refuse, to_cuda, to_numpy


def fa_form(ql: int, kl: int, causal, window):
    """(causal, (left, right)) of FlashAttention meaning causal and window for a sequence
    of ql queries over kl keys, or None. Its causal and window are aligned bottom-right;
    -1 is an open side."""
    left, right = (-1 if side is None else side for side in rules.window_sides(window))
    if causal is None:
        return (False, (-1, -1)) if window is None else \
            ((False, (left, right)) if ql == kl else None)
    if causal == "bottom_right" or ql == kl:
        return True, (left, -1)
    return None


def shared_form(name, q_lengths, kv_lengths, causal, window):
    forms = {fa_form(ql, kl, causal, window) for ql, kl in zip(q_lengths, kv_lengths)}
    if len(forms) != 1 or None in forms:
        raise NotImplementedError(
            f"{name}: FlashAttention aligns causal and windows bottom-right and takes no "
            f"mask: causal={causal!r}, window={window!r} over these lengths is not its form")
    return forms.pop()


def cumulative(lengths) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


class VllmFlashBackend(CudaAdapter):
    name = "vllm-flash"
    package = "vllm"
    dtypes = frozenset({"float16", "bfloat16"})
    dtype_notes = {"float32": "FlashAttention computes float16 and bfloat16 only",
                   "float64": "FlashAttention computes no float64"}
    policy = {
        "fully_masked_rows": "zeros",    # "If the row of the mask is all zero, the output will be zero"
        "neg_inf_bias_rows": "zeros",
        "masked_key_nan": "per_row",     # masked tiles are skipped, a masked score replaced
        "masked_value_nan": "propagates",
        "accumulation": "float32",
        "padded_query_rows": "zeros",
        "lse_base": "e",
    }
    paths = {
        "sdpa": "native: vllm_flash_attn.flash_attn_varlen_func (cu_seqlens_q, cu_seqlens_k)",
        "sdpa_lse": "native: as sdpa, return_softmax_lse=True",
        "paged_sdpa": "native: flash_attn_varlen_func with block_table and seqused_k",
        "merge_states": "native: vLLM's merge_attn_states, pairwise",
    }

    def _import(self):
        import vllm
        from vllm.vllm_flash_attn import flash_attn_varlen_func, is_fa_version_supported

        try:
            from vllm.v1.attention.ops.merge_attn_states import merge_attn_states
        except ImportError:          # vLLM before its v1 layout
            from vllm.attention.ops.merge_attn_states import merge_attn_states
        self.fa_version = 3 if is_fa_version_supported(3) else 2
        self.versions.update(vllm=vllm.__version__, fa_version=str(self.fa_version))
        self.varlen, self.merge = flash_attn_varlen_func, merge_attn_states
        return vllm

    # ------------------------------------------------------------------ sdpa, sdpa_lse
    def sdpa(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
             softcap=None, window=None, q_lengths=None, kv_lengths=None, q_segment_ids=None,
             kv_segment_ids=None, block_mask=None, block_size=None):
        self._ready()
        refuse(self.name, mask=mask, bias=bias, sink=sink, q_segment_ids=q_segment_ids,
               block_mask=block_mask)
        return self._varlen(q, k, v, causal, scale, softcap, window, q_lengths, kv_lengths,
                            False)[0]

    def sdpa_lse(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
                 softcap=None, window=None):
        self._ready()
        refuse(self.name, mask=mask, bias=bias, sink=sink)
        return self._varlen(q, k, v, causal, scale, softcap, window, None, None, True)

    def _varlen(self, q, k, v, causal, scale, softcap, window, q_lengths, kv_lengths, lse):
        self._ready()
        rules.check_causal(causal)
        layout = rules.Layout(q, k, v)
        q4, k4, v4 = layout.fold(np.asarray(q), np.asarray(k), np.asarray(v), np.broadcast_to)
        qls = list(q_lengths or [layout.lq] * layout.b)
        kls = list(kv_lengths or [layout.lk] * layout.b)
        is_causal, sides = shared_form(self.name, qls, kls, causal, window)
        size = padded_head(max(q4.shape[-1], v4.shape[-1]), self.name)
        tq, tk, tv = (pad_head(to_cuda(self._pack(x, n), self.device), size)
                      for x, n in ((q4, qls), (k4, kls), (v4, kls)))
        result = self.varlen(
            tq, tk, tv, max(qls), to_cuda(cumulative(qls), self.device), max(kls),
            cu_seqlens_k=to_cuda(cumulative(kls), self.device),
            softmax_scale=1 / math.sqrt(q4.shape[-1]) if scale is None else float(scale),
            causal=is_causal, window_size=list(sides),
            softcap=0.0 if softcap is None else float(softcap),
            return_softmax_lse=lse, fa_version=self.fa_version)
        out, lses = result if lse else (result, None)
        return self._unpack(layout, q, out[..., :v4.shape[-1]], lses, qls)

    @staticmethod
    def _pack(x4, lengths) -> np.ndarray:
        """(B, H, L, D) -> (sum of lengths, H, D): each element's first rows, end to end."""
        return np.concatenate([np.swapaxes(x4[b, :, :n], 0, 1) for b, n in enumerate(lengths)])

    def _unpack(self, layout, like, out, lses, qls):
        """The packed (total_q, Hq, Dv) output and (Hq, total_q) lse back to (B, Hq, Lq, Dv)
        and (B, Hq, Lq); padded rows 0 (lse -inf)."""
        import torch

        full = torch.zeros((layout.b, layout.hq, layout.lq, out.shape[-1]), device=self.device)
        lse = torch.full((layout.b, layout.hq, layout.lq), -math.inf, device=self.device)
        for b, (start, n) in enumerate(zip(cumulative(qls)[:-1], qls)):
            full[b, :, :n] = out[start:start + n].float().transpose(0, 1)
            if lses is not None:
                lse[b, :, :n] = lses[:, start:start + n].float()
        result = layout.restore(to_numpy(full, like=like))
        if lses is None:
            return result, None
        wide = rules.lse_dtype(like.dtype)                   # float32 beside half outputs
        return result, layout.restore(to_numpy(lse[..., None], like=wide))[..., 0]

    # ------------------------------------------------------------------ paged, merge
    def paged_sdpa(self, q, k_pages, v_pages, *, block_table, kv_lengths, sink=None,
                   page_layout="NHD", causal=None, scale=None, softcap=None, window=None,
                   q_lengths=None):
        self._ready()
        refuse(self.name, sink=sink)
        rules.check_causal(causal)
        pools = [np.asarray(p) if page_layout == "NHD" else np.swapaxes(np.asarray(p), 1, 2)
                 for p in (k_pages, v_pages)]
        page_size = pools[0].shape[1]
        if page_size % 16:
            raise NotImplementedError(f"{self.name}: pages of {page_size} tokens (vLLM's "
                                      "FlashAttention backend takes multiples of 16)")
        q = np.asarray(q)
        b, hq, lq, dk = q.shape
        qls, kls = list(q_lengths or [lq] * b), list(kv_lengths)
        is_causal, sides = shared_form(self.name, qls, kls, causal, window)
        dv = pools[1].shape[-1]
        size = padded_head(max(dk, dv), self.name)
        tk, tv = (pad_head(to_cuda(p, self.device), size) for p in pools)
        tq = pad_head(to_cuda(self._pack(q, qls), self.device), size)
        result = self.varlen(
            tq, tk, tv, max(qls), to_cuda(cumulative(qls), self.device), max(max(kls), 1),
            seqused_k=to_cuda(np.asarray(kls, np.int32), self.device),
            block_table=to_cuda(self._table(block_table), self.device),
            softmax_scale=1 / math.sqrt(dk) if scale is None else float(scale),
            causal=is_causal, window_size=list(sides),
            softcap=0.0 if softcap is None else float(softcap), fa_version=self.fa_version)
        layout = rules.Layout(q, q[:, :1], q[:, :1])
        return self._unpack(layout, q, result[..., :dv], None, qls)[0]

    @staticmethod
    def _table(block_table) -> np.ndarray:
        """The block table as FlashAttention's int32 (B, max pages), rows padded with 0."""
        width = max(len(row) for row in block_table)
        table = np.zeros((len(block_table), width), dtype=np.int64)
        for b, row in enumerate(block_table):
            table[b, :len(row)] = row
        if table.max(initial=0) > np.iinfo(np.int32).max:
            raise NotImplementedError("vllm-flash: page ids past 2^31 - 1 (its block_table "
                                      "is int32)")
        return table.astype(np.int32)

    def merge_states(self, outs, lses):
        import torch

        self._ready()
        outs, lses = np.asarray(outs), np.asarray(lses)
        if outs.shape[0] < 2:
            raise NotImplementedError("vllm-flash: merge_attn_states merges two states")
        n, dv = outs.shape[0], outs.shape[-1]
        rows = int(np.prod(lses.shape[1:], dtype=np.int64))
        states = to_cuda(outs.reshape(n, rows, 1, dv), self.device)
        logs = to_cuda(lses.reshape(n, 1, rows), self.device, torch.float32)
        out, lse = states[0], logs[0]
        for i in range(1, n):      # [NUM_TOKENS, NUM_HEADS, HEAD_SIZE], lse [NUM_HEADS, NUM_TOKENS]
            merged, merged_lse = torch.empty_like(out), torch.empty_like(lse)
            self.merge(merged, out, lse, states[i], logs[i], merged_lse)
            out, lse = merged, merged_lse
        return (to_numpy(out[:, 0], like=outs).reshape(outs.shape[1:]),
                to_numpy(lse[0], like=rules.lse_dtype(outs.dtype)).reshape(lses.shape[1:]))
