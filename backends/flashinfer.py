"""FlashInfer (``flashinfer-python``) on one CUDA GPU: the `flashinfer` backend.

Prepared without a GPU and unverified on hardware: written from FlashInfer's documented
Python API (flashinfer/prefill.py, decode.py, cascade.py, sparse.py, mla/_core.py).
Where CUDA is absent it loads, imports no FlashInfer, and every test is unsupported with
the reason (backends/_cuda.py); scripts/gpu_certify.sh certifies it on a GPU machine.

Each op converts the interface's arrays in, calls FlashInfer's own op, and converts out:

- ``sdpa``, ``sdpa_lse``: per batch element (its own ``q_lengths``/``kv_lengths`` rows,
  FlashAttention's varlen form), ``single_decode_with_kv_cache`` for one query that sees
  every key (or a bottom-right window), else ``single_prefill_with_kv_cache``; causal and
  windows go as its ``causal``/``window_left`` where they mean the same (FlashInfer aligns
  both bottom-right), anything else (top-left with Lq != Lk, a right window side, masks,
  documents) as its ``custom_mask``; a block mask alone (shared by every head, blocks
  that tile the sequence) through ``BlockSparseAttentionWrapper``; MLA (one latent head
  of 576 whose first 512 columns are V) through ``BatchMLAPagedAttentionWrapper``.
- ``paged_sdpa``: ``BatchDecodeWithPagedKVCacheWrapper`` (one query per sequence) or
  ``BatchPrefillWithPagedKVCacheWrapper``, the block table as ``kv_indptr``,
  ``kv_indices``, ``kv_last_page_len``, the pools in their own layout (``kv_layout`` NHD
  or HND).
- ``merge_states``: ``flashinfer.merge_states``.

- a ``sink``, fp8 inputs and their descales: the paged wrappers' ``run(q, paged_kv_cache,
  q_scale=, k_scale=, v_scale=, return_lse=, sinks=)`` (``sinks``: float32, one per query
  head; a sink that differs between batch elements is one call per sequence; the scales
  one float per tensor, a descale per (batch, kv head) unsupported), sdpa's K and V as
  one page per batch element (a mask shared by the heads as its custom mask); an fp8 q
  plans ``o_data_type=bfloat16``, and every output of an fp8 case is float32.
- ``qv`` (absorbed MLA): ``BatchMLAPagedAttentionWrapper`` with ``q_nope = qv``,
  ``q_pe = q``, ``ckv_cache = v``, ``kpe_cache = k`` (one kv head, Dk 64, Dv 512: the
  sizes it compiles), which are the absorbed scores.

Followed: flashinfer-ai/flashinfer fb28d724 (0.6.18), flashinfer/prefill.py
``BatchPrefillWithPagedKVCacheWrapper.plan(qo_indptr, paged_kv_indptr,
paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads, head_dim_qk,
page_size, ..., custom_mask=None, causal=False, sm_scale=None, window_left=-1,
logits_soft_cap=None, q_data_type="float16", kv_data_type=None, o_data_type=None)`` and
``run(q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None, ...)``
(sm_scale times q_scale and k_scale, the output times v_scale), decode.py's
``BatchDecodeWithPagedKVCacheWrapper.run`` with the same keywords.

Every lse FlashInfer returns and takes is log2 (its kernels' own base): the backend
declares ``lse_base: 2``. FlashInfer computes float16, bfloat16 and fp8. Heads smaller
than 64 are padded with zero columns to 64 (``_cuda.pad_head``: exact; fp8 as bytes),
and ``sm_scale`` is always passed. No bias.
"""

from __future__ import annotations

import math

import numpy as np

from . import rules
from ._cuda import (CudaAdapter, is_fp8, pad_head, padded_head, refuse, sink_rows, to_cuda,
                    to_numpy)
from ._flashinfer_paged import mla_paged, mla_sdpa, native_mask, paged_sdpa

#: FlashInfer's workspace (its examples' 128 MB)
WORKSPACE_BYTES = 128 * 1024 * 1024


def _single_mask(mask):
    """A (H, ql, kl) mask as one (ql, kl) shared by every head, or None if it differs."""
    return mask[0] if all(np.array_equal(m, mask[0]) for m in mask[1:]) else None


def is_mla(k, v, hkv: int) -> bool:
    """DeepSeek's latent attention: one KV head of 576 columns whose first 512 are V."""
    return hkv == 1 and k.shape[-1] == 576 and v.shape[-1] == 512 and \
        np.array_equal(np.asarray(v).view(np.uint8), np.asarray(k)[..., :512].copy().view(np.uint8))


class FlashinferBackend(CudaAdapter):
    name = "flashinfer"
    package = "flashinfer-python"
    dtypes = frozenset({"float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"})
    dtype_notes = {"float32": "FlashInfer's attention kernels take float16, bfloat16 and "
                              "fp8 only", "float64": "FlashInfer computes no float64"}
    policy = {
        "fully_masked_rows": "zeros",
        "neg_inf_bias_rows": "zeros",
        "masked_key_nan": "per_row",     # a masked score is replaced; skipped tiles unread
        "masked_value_nan": "propagates",
        "accumulation": "float32",
        "padded_query_rows": "zeros",
        "lse_base": "2",                 # log2, as FlashInfer's kernels and merge_states
    }
    paths = {
        "sdpa": "native: single_prefill_with_kv_cache / single_decode_with_kv_cache per "
                "sequence (custom_mask where causal/window/mask are not its own); "
                "BlockSparseAttentionWrapper for a block mask; BatchMLAPagedAttentionWrapper "
                "for MLA 576/512 and qv 64/512; the paged wrappers' sinks, q_scale, k_scale, "
                "v_scale with a sink or fp8",
        "sdpa_lse": "native: as sdpa, return_lse=True (base 2)",
        "paged_sdpa": "native: BatchDecodeWithPagedKVCacheWrapper / "
                      "BatchPrefillWithPagedKVCacheWrapper (kv_indptr, kv_indices, "
                      "kv_last_page_len; sinks, q_scale, k_scale, v_scale)",
        "merge_states": "native: flashinfer.merge_states (base 2)",
    }

    def _import(self):
        import flashinfer

        self.versions["flashinfer"] = getattr(flashinfer, "__version__", "?")
        return flashinfer

    def _workspace(self):
        import torch

        if getattr(self, "_buffer", None) is None:
            self._buffer = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        return self._buffer

    # ------------------------------------------------------------------ sdpa, sdpa_lse
    def sdpa(self, q, k, v, *, mask=None, bias=None, sink=None, qv=None, q_descale=None,
             k_descale=None, v_descale=None, causal=None, scale=None, softcap=None,
             window=None, q_lengths=None, kv_lengths=None, q_segment_ids=None,
             kv_segment_ids=None, block_mask=None, block_size=None):
        self._ready()
        structure = dict(q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)
        descales = (q_descale, k_descale, v_descale)
        if qv is not None:
            refuse(self.name, mask=mask, bias=bias, sink=sink, q_descale=q_descale,
                   k_descale=k_descale, v_descale=v_descale, q_segment_ids=q_segment_ids,
                   block_mask=block_mask)
            return self._absorbed(q, k, v, qv, causal, scale, softcap, window, q_lengths,
                                  kv_lengths)
        if block_mask is not None and q_lengths is None and kv_lengths is None \
                and sink is None and not self._fp8(q, k, v, descales):
            out = self._block_sparse(q, k, v, mask, structure, block_mask, block_size,
                                     causal=causal, scale=scale, softcap=softcap,
                                     window=window, bias=bias, sink=sink)
            if out is not None:
                return out
        mask = rules.structure_mask(mask, np.shape(q), np.shape(k), block_mask=block_mask,
                                    block_size=block_size, **structure)
        if sink is not None or self._fp8(q, k, v, descales):
            refuse(self.name, bias=bias)
            return self._as_pages(q, k, v, mask, causal, scale, softcap, window, q_lengths,
                                  kv_lengths, sink, descales, False)
        return self._attend(q, k, v, mask, causal, scale, softcap, window, q_lengths,
                            kv_lengths, bias=bias, sink=sink)[0]

    def sdpa_lse(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
                 softcap=None, window=None):
        if sink is not None:
            self._ready()
            refuse(self.name, bias=bias)
            return self._as_pages(q, k, v, mask, causal, scale, softcap, window, None, None,
                                  sink, (None, None, None), True)
        return self._attend(q, k, v, mask, causal, scale, softcap, window, None, None,
                            bias=bias, sink=sink, lse=True)

    @staticmethod
    def _fp8(q, k, v, descales) -> bool:
        return any(is_fp8(x) for x in (q, k, v)) or any(d is not None for d in descales)

    def _as_pages(self, q, k, v, mask, causal, scale, softcap, window, q_lengths, kv_lengths,
                  sink, descales, lse):
        """sdpa / sdpa_lse through the paged wrappers (their sinks and scales): each batch
        element's keys and values one page, a mask (shared by the heads) its custom mask."""
        rules.check_causal(causal)
        layout = rules.Layout(q, k, v, mask)
        q4, k4, v4 = layout.fold(np.asarray(q), np.asarray(k), np.asarray(v), np.broadcast_to)
        masks = layout.scores(mask, np.broadcast_to, every_row=True)
        if masks is not None and masks.shape[1] != 1 and \
                any(not np.array_equal(m[0], h) for m in masks for h in m[1:]):
            raise NotImplementedError(f"{self.name}: a mask that differs between heads with a "
                                      "sink or fp8 (the paged wrappers' custom mask is one "
                                      "per request)")
        qls = list(q_lengths or [layout.lq] * layout.b)
        kls = list(kv_lengths or [layout.lk] * layout.b)
        pools = [np.swapaxes(x, 1, 2) for x in (k4, v4)]        # (B, Lk, Hkv, D): NHD pages
        result = paged_sdpa(
            self, q4, *pools, [[b] for b in range(layout.b)], kls, "NHD", causal, scale,
            softcap, window, qls, sinks=sink_rows(sink, layout.batch, layout.hq),
            masks=None if masks is None else [m[0, :ql, :kl] for m, ql, kl in
                                               zip(masks, qls, kls)],
            descales=descales, lse=lse)
        out, lses = result if lse else (result, None)
        return (layout.restore(out), layout.restore(lses[..., None])[..., 0]) if lse else \
            layout.restore(out)

    def _absorbed(self, q, k, v, qv, causal, scale, softcap, window, q_lengths, kv_lengths):
        """The absorbed form as FlashInfer's MLA: [qv, q] against [v, k] (ckv then kpe)."""
        q, k, v, qv = (np.asarray(x) for x in (q, k, v, qv))
        if k.shape[-3] != 1 or k.shape[-1] != 64 or v.shape[-1] != 512:
            raise NotImplementedError(
                f"{self.name}: qv goes through BatchMLAPagedAttentionWrapper, which takes one "
                f"kv head, a rope part of 64 and a latent of 512 (here {k.shape[-3]} heads, "
                f"{k.shape[-1]} and {v.shape[-1]})")
        keys = np.broadcast_shapes(k.shape[:-1], v.shape[:-1])
        wide_q = np.concatenate([qv, q], axis=-1)
        wide_k = np.concatenate([np.broadcast_to(v, keys + (512,)),
                                 np.broadcast_to(k, keys + (64,))], axis=-1)
        layout = rules.Layout(wide_q, wide_k, wide_k)
        return self._mla_sdpa(wide_q, wide_k, layout, None, causal,
                              1 / math.sqrt(576) if scale is None else float(scale), softcap,
                              window, q_lengths, kv_lengths, False)[0]

    def _attend(self, q, k, v, mask, causal, scale, softcap, window, q_lengths, kv_lengths,
                *, bias, sink, lse=False):
        self._ready()
        refuse(self.name, bias=bias, sink=sink)
        rules.check_causal(causal)
        layout = rules.Layout(q, k, v, mask)
        scale = 1 / math.sqrt(np.shape(q)[-1]) if scale is None else float(scale)
        if is_mla(k, v, layout.hkv):
            return self._mla_sdpa(q, k, layout, mask, causal, scale, softcap, window,
                                  q_lengths, kv_lengths, lse)
        q4, k4, v4 = layout.fold(np.asarray(q), np.asarray(k), np.asarray(v), np.broadcast_to)
        masks = layout.scores(mask, np.broadcast_to, every_row=True)
        ql = q_lengths or [layout.lq] * layout.b
        kl = kv_lengths or [layout.lk] * layout.b
        out, lses = self._empty(q4, v4.shape[-1], lse)
        size = padded_head(max(q4.shape[-1], v4.shape[-1]), self.name)
        for b in range(layout.b):
            element = masks[b, :, :ql[b], :kl[b]] if masks is not None else None
            o, s = self._element(q4[b, :, :ql[b]], k4[b, :, :kl[b]], v4[b, :, :kl[b]],
                                 element, causal, window, scale, softcap, size, lse)
            out[b, :, :ql[b]] = o
            if lse:
                lses[b, :, :ql[b]] = s
        result = layout.restore(to_numpy(out, like=q))
        wide = rules.lse_dtype(np.asarray(q).dtype)          # float32 beside half outputs
        return result, (layout.restore(to_numpy(lses[..., None], like=wide))[..., 0]
                        if lse else None)

    def _empty(self, q4, dv, lse):
        import torch

        b, hq, lq = q4.shape[:3]
        out = torch.zeros((b, hq, lq, dv), dtype=torch.float32, device=self.device)
        lses = torch.full((b, hq, lq), -math.inf, device=self.device) if lse else None
        return out, lses

    def _element(self, q, k, v, mask, causal, window, scale, softcap, size, lse):
        """One sequence: q (Hq, ql, D), k and v (Hkv, kl, D) -> out (Hq, ql, Dv) and its
        lse (Hq, ql), float32 tensors."""
        import torch

        ql, kl = q.shape[1], k.shape[1]
        native = native_mask(ql, kl, causal, window) if mask is None else None
        if native is None:
            allowed = np.broadcast_to(rules.and_masks(mask, rules.allowed(ql, kl, causal, window)),
                                      (q.shape[0], ql, kl))
            shared = _single_mask(allowed)
            if shared is None:                 # a mask per head: one call per head
                group = q.shape[0] // k.shape[0]
                parts = [self._element(q[h:h + 1], k[h // group:h // group + 1],
                                       v[h // group:h // group + 1], allowed[h:h + 1], None,
                                       None, scale, softcap, size, lse)
                         for h in range(q.shape[0])]
                return (torch.cat([p[0] for p in parts]),
                        torch.cat([p[1] for p in parts]) if lse else None)
        tq, tk, tv = (pad_head(to_cuda(np.swapaxes(x, 0, 1), self.device), size)
                      for x in (q, k, v))
        call = dict(sm_scale=scale, logits_soft_cap=softcap, return_lse=lse, kv_layout="NHD")
        if native is not None and ql == 1 and (native[0] or native[1] == -1):
            result = self.lib.single_decode_with_kv_cache(tq[0], tk, tv, window_left=native[1],
                                                          **call)
            result = (result[0][None], result[1][None]) if lse else result[None]
        elif native is not None:
            result = self.lib.single_prefill_with_kv_cache(tq, tk, tv, causal=native[0],
                                                           window_left=native[1], **call)
        else:
            result = self.lib.single_prefill_with_kv_cache(
                tq, tk, tv, custom_mask=torch.from_numpy(np.ascontiguousarray(shared)).to(
                    self.device), **call)
        o, s = result if lse else (result, None)
        o = o[..., :v.shape[-1]].float().transpose(0, 1)
        return o, (s.float().transpose(0, 1) if lse else None)

    # ------------------------------------------------------------------ block-sparse
    def _block_sparse(self, q, k, v, mask, structure, block_mask, block_size, *, causal,
                      scale, softcap, window, bias, sink):
        """The block mask through BlockSparseAttentionWrapper (indptr/indices of its BSR
        form, the rest of the mask per nonzero block), or None where it does not apply: a
        block mask per head, blocks that do not tile Lq and Lk, a rest that differs per
        head."""
        self._ready()
        refuse(self.name, bias=bias, sink=sink)
        blocks = np.asarray(block_mask) != 0
        (lq, dk), lk = np.shape(q)[-2:], np.shape(k)[-2]
        size_q, size_k = block_size
        if blocks.ndim != 2 or lq % size_q or lk % size_k:
            return None
        rest = rules.and_masks(rules.structure_mask(mask, np.shape(q), np.shape(k), **structure),
                               rules.allowed(lq, lk, causal, window))
        layout = rules.Layout(q, k, v, None if rest is None else np.asarray(rest))
        rests = layout.scores(None if rest is None else np.asarray(rest), np.broadcast_to,
                              every_row=True)
        if rests is not None and rests.shape[1] != 1:
            return None
        return self._run_block_sparse(layout, q, k, v, blocks, block_size, rests,
                                      1 / math.sqrt(dk) if scale is None else float(scale),
                                      softcap)

    def _run_block_sparse(self, layout, q, k, v, blocks, block_size, rests, scale, softcap):
        import torch

        rows, cols = np.nonzero(blocks)
        indptr = np.concatenate([[0], np.cumsum(blocks.sum(axis=1))]).astype(np.int32)
        q4, k4, v4 = layout.fold(np.asarray(q), np.asarray(k), np.asarray(v), np.broadcast_to)
        size = padded_head(max(q4.shape[-1], v4.shape[-1]), self.name)
        out, _ = self._empty(q4, v4.shape[-1], False)
        wrapper = self.lib.BlockSparseAttentionWrapper(self._workspace())
        r, c = block_size
        for b in range(layout.b):
            per_block = None
            if rests is not None:
                per_block = torch.from_numpy(np.stack(
                    [rests[b, 0, i * r:(i + 1) * r, j * c:(j + 1) * c] for i, j in
                     zip(rows, cols)])).to(self.device)
            tq, tk, tv = (pad_head(to_cuda(np.swapaxes(x[b], 0, 1), self.device), size)
                          for x in (q4, k4, v4))
            wrapper.plan(to_cuda(indptr, self.device), to_cuda(cols.astype(np.int32), self.device),
                         layout.lq, layout.lk, r, c, layout.hq, layout.hkv, size,
                         mask=per_block, sm_scale=scale, logits_soft_cap=softcap,
                         q_data_type=tq.dtype, kv_data_type=tk.dtype, o_data_type=tq.dtype)
            out[b] = wrapper.run(tq, tk, tv)[..., :v4.shape[-1]].float().transpose(0, 1)
        return layout.restore(to_numpy(out, like=q))

    # ------------------------------------------------------------------ paged, MLA, merge
    def paged_sdpa(self, q, k_pages, v_pages, *, block_table, kv_lengths, sink=None,
                   qv=None, q_descale=None, k_descale=None, v_descale=None,
                   page_layout="NHD", causal=None, scale=None, softcap=None, window=None,
                   q_lengths=None):
        self._ready()
        rules.check_causal(causal)
        if qv is not None:
            refuse(self.name, sink=sink, q_descale=q_descale, k_descale=k_descale,
                   v_descale=v_descale)
            node = 2 if page_layout == "HND" else 1
            if np.shape(k_pages)[3 - node] != 1 or np.shape(k_pages)[-1] != 64 or \
                    np.shape(v_pages)[-1] != 512:
                raise NotImplementedError(f"{self.name}: qv goes through "
                                          "BatchMLAPagedAttentionWrapper: one kv head, a rope "
                                          "part of 64 and a latent of 512")
            return mla_paged(self, np.asarray(q), k_pages, v_pages, block_table, kv_lengths,
                             page_layout, causal, scale, softcap, window, q_lengths, qv=qv)
        return paged_sdpa(self, q, k_pages, v_pages, block_table, kv_lengths, page_layout,
                          causal, scale, softcap, window, q_lengths,
                          sinks=sink_rows(sink, (np.shape(q)[0],), np.shape(q)[1]),
                          descales=(q_descale, k_descale, v_descale))

    def _mla_sdpa(self, q, k, layout, mask, causal, scale, softcap, window, q_lengths,
                  kv_lengths, lse):
        refuse(self.name, mask=mask, softcap=softcap, window=window)
        return mla_sdpa(self, q, k, layout, causal, scale, q_lengths, kv_lengths, lse)

    def merge_states(self, outs, lses):
        import torch

        self._ready()
        outs, lses = np.asarray(outs), np.asarray(lses)
        n, dv = outs.shape[0], outs.shape[-1]
        rows = int(np.prod(lses.shape[1:], dtype=np.int64))
        v = pad_head(to_cuda(outs.reshape(n, rows, 1, dv), self.device), -(-dv // 64) * 64)
        s = to_cuda(lses.reshape(n, rows, 1), self.device, torch.float32)
        out, lse = self.lib.merge_states(v.transpose(0, 1).contiguous(),
                                         s.transpose(0, 1).contiguous())
        return (to_numpy(out[:, 0, :dv], like=outs).reshape(outs.shape[1:]),
                to_numpy(lse[:, 0], like=rules.lse_dtype(outs.dtype)).reshape(lses.shape[1:]))
