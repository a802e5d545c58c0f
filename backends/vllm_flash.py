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
- FlashAttention 3 only (vLLM's FA2 raises on them or lacks them; unsupported there):
  a ``sink`` as ``s_aux`` (bfloat16, one per query head, added to each row's softmax
  denominator in natural-log units and to its lse; a float16 sink that bfloat16 does not
  hold exactly, or one that differs between batch elements, is unsupported); ``qv`` (the
  absorbed MLA form) as ``q_v`` (heads of at most 64, values padded to 256 or 512, float16
  and bfloat16); fp8 q, k and v (float8_e4m3fn, all three) with ``q_descale``,
  ``k_descale``, ``v_descale`` per (sequence, kv head) (a ``(1,)`` descale expanded), the
  bfloat16 output converted to float32. Followed: vllm-project/flash-attention
  617264c1 (vllm_flash_attn/flash_attn_interface.py ``flash_attn_varlen_func(q, k, v,
  max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k=None, seqused_k=None, q_v=None,
  ..., block_table=None, return_softmax_lse=False, out=None, scheduler_metadata=None,
  q_descale=None, k_descale=None, v_descale=None, num_splits=0, fa_version=2,
  s_aux=None, ...)``; hopper/flash_api.cpp: descales ``(b, h_k)`` float32 read only for
  an e4m3 q, output bfloat16; ``s_aux`` bfloat16 ``(num_heads,)``, Hopper, at most 64
  query heads, Dk == Dv; ``q_v`` Dk <= 64, Dv >= 256; hopper/softmax.h ``finalize_aux``).

FlashAttention 3 where vLLM says the GPU has it (``is_fa_version_supported(3)``: Hopper),
else 2; the version is in ``versions``. float16 and bfloat16 only; heads padded with zero
columns to 64, 128 or 256 (exact) and ``softmax_scale`` always passed.
"""

from __future__ import annotations

import math

import numpy as np

from . import rules
from ._cuda import (CudaAdapter, float32_like, is_fp8, padded_head, refuse, sink_rows,
                    to_cuda, to_cuda_padded, to_numpy)


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
    dtypes = frozenset({"float16", "bfloat16", "float8_e4m3fn"})
    dtype_notes = {"float32": "FlashAttention computes float16, bfloat16 and fp8 only",
                   "float64": "FlashAttention computes no float64",
                   "float8_e5m2": "FlashAttention 3's fp8 kernels take float8_e4m3fn only"}
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
        "sdpa": "native: vllm_flash_attn.flash_attn_varlen_func (cu_seqlens_q, cu_seqlens_k; "
                "FA3: s_aux, q_v, q_descale/k_descale/v_descale)",
        "sdpa_lse": "native: as sdpa, return_softmax_lse=True",
        "paged_sdpa": "native: flash_attn_varlen_func with block_table and seqused_k (FA3: "
                      "s_aux, q_v, descales)",
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
    def sdpa(self, q, k, v, *, mask=None, bias=None, sink=None, qv=None, q_descale=None,
             k_descale=None, v_descale=None, causal=None, scale=None, softcap=None,
             window=None, q_lengths=None, kv_lengths=None, q_segment_ids=None,
             kv_segment_ids=None, block_mask=None, block_size=None):
        self._ready()
        refuse(self.name, mask=mask, bias=bias, q_segment_ids=q_segment_ids,
               block_mask=block_mask)
        return self._varlen(q, k, v, causal, scale, softcap, window, q_lengths, kv_lengths,
                            False, sink=sink, qv=qv,
                            descales=(q_descale, k_descale, v_descale))[0]

    def sdpa_lse(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
                 softcap=None, window=None):
        self._ready()
        refuse(self.name, mask=mask, bias=bias)
        return self._varlen(q, k, v, causal, scale, softcap, window, None, None, True,
                            sink=sink)

    def _varlen(self, q, k, v, causal, scale, softcap, window, q_lengths, kv_lengths, lse,
                *, sink=None, qv=None, descales=(None, None, None)):
        self._ready()
        rules.check_causal(causal)
        layout = rules.Layout(q, k, v)
        q4, k4, v4 = layout.fold(np.asarray(q), np.asarray(k), np.asarray(v), np.broadcast_to)
        qls = list(q_lengths or [layout.lq] * layout.b)
        kls = list(kv_lengths or [layout.lk] * layout.b)
        is_causal, sides = shared_form(self.name, qls, kls, causal, window)
        size, size_v = self._sizes(q4.shape[-1], v4.shape[-1], qv)
        folded_qv = None if qv is None else \
            self._pack(layout.fold(np.asarray(qv), k4, v4, np.broadcast_to)[0], qls)
        extra = self._fa3(q4, k4, sink_rows(sink, layout.batch, layout.hq), folded_qv,
                          descales, layout.b, layout.hkv, size_v)
        tq, tk = (to_cuda_padded(self._pack(x, n), self.device, size)
                  for x, n in ((q4, qls), (k4, kls)))
        tv = to_cuda_padded(self._pack(v4, kls), self.device, size_v)
        result = self.varlen(
            tq, tk, tv, max(qls), to_cuda(cumulative(qls), self.device), max(kls),
            cu_seqlens_k=to_cuda(cumulative(kls), self.device),
            softmax_scale=self._scale(scale, q4.shape[-1], qv, v4.shape[-1]),
            causal=is_causal, window_size=list(sides),
            softcap=0.0 if softcap is None else float(softcap),
            return_softmax_lse=lse, fa_version=self.fa_version, **extra)
        out, lses = result if lse else (result, None)
        return self._unpack(layout, float32_like(q, k, v), out[..., :v4.shape[-1]], lses, qls)

    @staticmethod
    def _scale(scale, dk, qv, dv) -> float:
        """softmax_scale, always passed: the interface's default 1/sqrt(Dk) (1/sqrt(Dk + Dv)
        with qv), not FlashAttention's of the padded head."""
        return 1 / math.sqrt(dk + (0 if qv is None else dv)) if scale is None else float(scale)

    def _sizes(self, dk: int, dv: int, qv) -> tuple[int, int]:
        """The head sizes q and k, and v, are padded to (zero columns: exact)."""
        if qv is None:
            size = padded_head(max(dk, dv), self.name)
            return size, size
        if dk > 64 or dv > 512:
            raise NotImplementedError(f"{self.name}: FA3's q_v takes heads of at most 64 and "
                                      f"values of at most 512 (here {dk} and {dv})")
        return 64, 256 if dv <= 256 else 512

    def _fa3(self, q, k, sinks, qv, descales, b, hkv, size_v) -> dict:
        """flash_attn_varlen_func's FlashAttention-3 inputs: s_aux for a sink (``sinks``:
        (B, Hq)), q_v for qv (packed), the descales of fp8 q, k, v; {} without them."""
        fp8 = is_fp8(q) or is_fp8(k) or any(d is not None for d in descales)
        used = [name for name, there in (("a sink", sinks is not None),
                                         ("qv", qv is not None), ("fp8", fp8)) if there]
        if not used:
            return {}
        if self.fa_version != 3:
            raise NotImplementedError(
                f"{self.name}: {' and '.join(used)} need FlashAttention 3 (vLLM's FA2 takes no "
                f"s_aux, q_v or descales); this GPU runs FA{self.fa_version}")
        extra = {}
        if sinks is not None:
            extra["s_aux"] = self._s_aux(sinks, qv)
        if qv is not None:
            extra["q_v"] = to_cuda_padded(qv, self.device, size_v)
        if fp8:
            extra.update(self._descales(q, k, descales, b, hkv))
        return extra

    def _s_aux(self, sinks, qv):
        """FA3's s_aux: one bfloat16 logit per query head, the same for every sequence."""
        import ml_dtypes

        if qv is not None or np.any(sinks != sinks[:1]):
            raise NotImplementedError(
                f"{self.name}: FA3's s_aux is one sink per query head for the whole batch, "
                "with Dk == Dv (a sink per batch element, or with q_v, is not its form)")
        row = np.asarray(sinks[0], np.float64)
        held = row.astype(ml_dtypes.bfloat16)
        if not np.array_equal(held.astype(np.float64), row, equal_nan=True):
            raise NotImplementedError(f"{self.name}: FA3's s_aux is bfloat16, which does not "
                                      f"hold this {sinks.dtype} sink exactly")
        return to_cuda(held, self.device)

    def _descales(self, q, k, descales, b, hkv) -> dict:
        """q_descale, k_descale, v_descale as FA3's (B, Hkv) float32; q, k, v must all be
        float8_e4m3fn (FA3 takes no mix; vLLM quantizes the query itself)."""
        if not (is_fp8(q) and np.asarray(q).dtype == np.asarray(k).dtype):
            raise NotImplementedError(
                f"{self.name}: a {np.asarray(q).dtype} query over {np.asarray(k).dtype} keys: "
                "FA3 takes q, k and v of one dtype")
        full = {}
        for name, d in zip(("q_descale", "k_descale", "v_descale"), descales):
            d = np.ones(1, np.float32) if d is None else np.asarray(d, np.float32)
            d = d.reshape(()) if d.size == 1 else d
            full[name] = to_cuda(np.ascontiguousarray(np.broadcast_to(d, (b, hkv))), self.device)
        return full

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
                   qv=None, q_descale=None, k_descale=None, v_descale=None,
                   page_layout="NHD", causal=None, scale=None, softcap=None, window=None,
                   q_lengths=None):
        self._ready()
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
        size, size_v = self._sizes(dk, dv, qv)
        extra = self._fa3(q, pools[0], sink_rows(sink, (b,), hq),
                          None if qv is None else self._pack(np.asarray(qv), qls),
                          (q_descale, k_descale, v_descale), b, pools[0].shape[2], size_v)
        tk, tv = (to_cuda_padded(p, self.device, n) for p, n in zip(pools, (size, size_v)))
        tq = to_cuda_padded(self._pack(q, qls), self.device, size)
        result = self.varlen(
            tq, tk, tv, max(qls), to_cuda(cumulative(qls), self.device), max(max(kls), 1),
            seqused_k=to_cuda(np.asarray(kls, np.int32), self.device),
            block_table=to_cuda(self._table(block_table), self.device),
            softmax_scale=self._scale(scale, dk, qv, dv),
            causal=is_causal, window_size=list(sides),
            softcap=0.0 if softcap is None else float(softcap), fa_version=self.fa_version,
            **extra)
        layout = rules.Layout(q, q[:, :1], q[:, :1])
        return self._unpack(layout, float32_like(q, *pools), result[..., :dv], None, qls)[0]

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
