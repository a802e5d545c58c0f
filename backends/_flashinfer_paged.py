"""The `flashinfer` backend's paged forms (backends/flashinfer.py): a paged KV cache
through FlashInfer's batch decode and prefill wrappers, and MLA through its latent
wrapper; and native_mask, FlashInfer's causal and window, which both modules use.
Unverified on hardware, like the adapter.

A block table becomes FlashInfer's CSR form: ``kv_indptr`` (cumulative pages per
sequence), ``kv_indices`` (the pages of each sequence, in order) and
``kv_last_page_len`` (tokens in each sequence's last page), int32 as its plan takes them.
A sink goes as the wrappers' ``run(..., sinks=)`` and fp8 descales as their per-tensor
``q_scale``, ``k_scale``, ``v_scale`` (signatures cited in flashinfer.py).
"""

from __future__ import annotations

import math

import numpy as np

from . import rules
from ._cuda import (float32_like, is_fp8, padded_head, per_tensor, to_cuda, to_cuda_padded,
                    to_numpy)


def native_mask(ql: int, kl: int, causal, window):
    """(causal, window_left) of FlashInfer meaning causal and window for one sequence of
    ql queries over kl keys, or None when they need a custom mask. FlashInfer's causal
    and window_left count from the bottom-right corner (query i at i + kl - ql)."""
    left, right = rules.window_sides(window)
    window_left = -1 if left is None else left
    if causal is None:
        if left is None and right is None:
            return False, -1
        return (False, window_left) if right is None and ql == kl else None
    if causal == "bottom_right" or ql == kl:
        return True, window_left
    return None


def page_csr(block_table, kv_lengths, page_size: int):
    """(kv_indptr, kv_indices, kv_last_page_len) of the sequences' pages (int32). A
    sequence of no token lists no page and a last page of 0."""
    pages = [-(-length // page_size) for length in kv_lengths]
    ids = [np.asarray(row[:n], dtype=np.int64) for row, n in zip(block_table, pages)]
    indices = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    if indices.size and indices.max() > np.iinfo(np.int32).max:
        raise NotImplementedError("flashinfer: page ids past 2^31 - 1 (its kv_indices are "
                                  "int32)")
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    last = np.asarray([length - page_size * (n - 1) if n else 0
                       for length, n in zip(kv_lengths, pages)], dtype=np.int32)
    return indptr, indices.astype(np.int32), last


def _shared_native(q_lengths, kv_lengths, causal, window):
    """FlashInfer's (causal, window_left) when one pair means causal and window for every
    sequence, else None (a custom mask)."""
    forms = {native_mask(ql, kl, causal, window) for ql, kl in zip(q_lengths, kv_lengths)}
    return forms.pop() if len(forms) == 1 and None not in forms else None


def paged_sdpa(backend, q, k_pages, v_pages, block_table, kv_lengths, page_layout, causal,
               scale, softcap, window, q_lengths, *, sinks=None, masks=None,
               descales=(None, None, None), lse=False):
    """out (B, Hq, Lq, Dv) of the wrappers, and with lse its log2 lse (B, Hq, Lq). sinks:
    (B, Hq) or None; masks: each sequence's (ql, kl) mask shared by its heads, or None;
    descales: one per tensor (FlashInfer's q_scale, k_scale, v_scale)."""
    q = np.asarray(q)
    q_lengths = list(q_lengths or [q.shape[2]] * q.shape[0])
    if sinks is not None and np.any(sinks != sinks[:1]):      # one sinks row per call
        parts = [paged_sdpa(backend, q[i:i + 1], k_pages, v_pages, block_table[i:i + 1],
                            kv_lengths[i:i + 1], page_layout, causal, scale, softcap, window,
                            q_lengths[i:i + 1], sinks=sinks[i:i + 1], descales=descales,
                            masks=None if masks is None else masks[i:i + 1], lse=lse)
                 for i in range(q.shape[0])]
        parts = [p if lse else (p, None) for p in parts]
        out = np.concatenate([p[0] for p in parts])
        return (out, np.concatenate([p[1] for p in parts])) if lse else out
    run = dict(return_lse=lse, **_scales(backend.name, descales))
    if sinks is not None:   # run(..., sinks: [num_qo_heads] float32): prefill.py, decode.py
        run["sinks"] = to_cuda(np.ascontiguousarray(sinks[0], np.float32), backend.device)
    return _paged_run(backend, q, k_pages, v_pages, block_table, kv_lengths, page_layout,
                      causal, scale, softcap, window, q_lengths, masks, run)


def _scales(name, descales) -> dict:
    """run()'s q_scale, k_scale, v_scale (floats, one per tensor: it multiplies sm_scale
    by the first two and the output by the third)."""
    scales = {f"{x}_scale": per_tensor(name, d) for x, d in zip("qkv", descales)}
    return {key: value for key, value in scales.items() if value is not None}


def _paged_run(backend, q, k_pages, v_pages, block_table, kv_lengths, page_layout, causal,
               scale, softcap, window, q_lengths, masks, run):
    import torch

    b, hq, lq, dk = q.shape
    node = 2 if page_layout == "HND" else 1
    page_size, hkv = np.shape(k_pages)[node], np.shape(k_pages)[3 - node]
    if hkv == 1 and dk == 576 and np.shape(v_pages)[-1] == 512 and len(run) == 1:
        return mla_paged(backend, q, k_pages, v_pages, block_table, kv_lengths, page_layout,
                         causal, scale, softcap, window, q_lengths, run["return_lse"])
    dv = np.shape(v_pages)[-1]
    size = padded_head(max(dk, dv), backend.name)
    scale = 1 / math.sqrt(dk) if scale is None else float(scale)
    native = _shared_native(q_lengths, kv_lengths, causal, window) if masks is None else None
    indptr, indices, last = (to_cuda(x, backend.device)
                             for x in page_csr(block_table, kv_lengths, page_size))
    pools = tuple(to_cuda_padded(p, backend.device, size) for p in (k_pages, v_pages))
    packed = np.concatenate([np.swapaxes(q[i, :, :n], 0, 1) for i, n in enumerate(q_lengths)])
    tq = to_cuda_padded(packed, backend.device, size)
    common = dict(sm_scale=scale, logits_soft_cap=softcap, q_data_type=tq.dtype,
                  kv_data_type=pools[0].dtype)
    if is_fp8(q):               # fp8 attention writes the o_data_type it is given
        common["o_data_type"] = torch.bfloat16
    if native is not None and lq == 1 and set(q_lengths) == {1} and \
            (native[0] or native[1] == -1):
        wrapper = backend.lib.BatchDecodeWithPagedKVCacheWrapper(backend._workspace(),
                                                                 kv_layout=page_layout)
        wrapper.plan(indptr, indices, last, hq, hkv, size, page_size, window_left=native[1],
                     **common)
    else:
        wrapper = backend.lib.BatchPrefillWithPagedKVCacheWrapper(backend._workspace(),
                                                                  kv_layout=page_layout)
        qo_indptr = to_cuda(np.concatenate([[0], np.cumsum(q_lengths)]).astype(np.int32),
                            backend.device)
        form = dict(causal=native[0], window_left=native[1]) if native is not None else \
            dict(custom_mask=_flat_mask(q_lengths, kv_lengths, causal, window, backend.device,
                                        masks))
        wrapper.plan(qo_indptr, indptr, indices, last, hq, hkv, size, page_size, **form,
                     **common)
    result = wrapper.run(tq, pools, **run)
    packed_out, packed_lse = result if run["return_lse"] else (result, None)
    like = float32_like(q, k_pages, v_pages)
    out = _unpacked(packed_out[..., :dv].float(), q_lengths, (b, hq, lq, dv), 0.0, backend)
    if packed_lse is None:
        return to_numpy(out, like=like)
    lses = _unpacked(packed_lse.float()[..., None], q_lengths, (b, hq, lq, 1), -math.inf,
                     backend)
    return to_numpy(out, like=like), to_numpy(lses[..., 0], like=rules.lse_dtype(like.dtype))


def _unpacked(packed, q_lengths, shape, fill, backend):
    """Packed rows (nnz, Hq, D) as (B, Hq, Lq, D), rows past a sequence's queries ``fill``."""
    import torch

    full = torch.full(shape, fill, dtype=torch.float32, device=backend.device)
    for i, (start, n) in enumerate(zip(np.cumsum([0] + q_lengths[:-1]), q_lengths)):
        full[i, :, :n] = packed[start:start + n].transpose(0, 1)
    return full


def _flat_mask(q_lengths, kv_lengths, causal, window, device, masks=None):
    """FlashInfer's flattened custom mask: each request's (ql, kl) mask (``masks``' and
    causal's and window's), row-major, end to end."""
    import torch

    parts = []
    for i, (ql, kl) in enumerate(zip(q_lengths, kv_lengths)):
        allowed = rules.and_masks(None if masks is None else masks[i],
                                  rules.allowed(ql, kl, causal, window))
        parts.append(np.ones(ql * kl, bool) if allowed is None else
                     np.broadcast_to(allowed, (ql, kl)).ravel())
    return torch.from_numpy(np.concatenate(parts)).to(device)


# ---------------------------------------------------------------- MLA


def _mla_run(backend, q, ckv, kpe, qo_lengths, kv_lengths, block_table, page_size, causal,
             scale, lse):
    """BatchMLAPagedAttentionWrapper over ckv (pages, page_size, 512) and kpe (pages,
    page_size, 64): q (nnz, heads, 576) packed -> (out (nnz, heads, 512), lse or None)."""
    indptr, indices, _ = page_csr(block_table, kv_lengths, page_size)
    device = backend.device
    wrapper = backend.lib.mla.BatchMLAPagedAttentionWrapper(backend._workspace())
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lengths)]).astype(np.int32)
    wrapper.plan(to_cuda(qo_indptr, device), to_cuda(indptr, device), to_cuda(indices, device),
                 to_cuda(np.asarray(kv_lengths, np.int32), device), q.shape[1], 512, 64,
                 page_size, causal, scale, q.dtype, ckv.dtype)
    result = wrapper.run(q[..., :512].contiguous(), q[..., 512:].contiguous(), ckv, kpe,
                         return_lse=lse)
    return result if lse else (result, None)


def _mla_causal(causal, q_lengths, kv_lengths):
    """MLA's causal flag (bottom-right, FlashInfer's alignment), or unsupported."""
    if causal is None:
        return False
    if causal == "bottom_right" or all(a == b for a, b in zip(q_lengths, kv_lengths)):
        return True
    raise NotImplementedError("flashinfer: MLA's causal mask is bottom-right only")


def mla_sdpa(backend, q, k, layout, causal, scale, q_lengths, kv_lengths, lse):
    """sdpa / sdpa_lse of latent attention: each sequence's keys as pages of one token."""
    import torch

    q4, k4, _ = layout.fold(np.asarray(q), np.asarray(k), np.asarray(k), np.broadcast_to)
    qls = list(q_lengths or [layout.lq] * layout.b)
    kls = list(kv_lengths or [layout.lk] * layout.b)
    packed_q = np.concatenate([np.swapaxes(q4[i, :, :n], 0, 1) for i, n in enumerate(qls)])
    keys = np.concatenate([k4[i, 0, :n] for i, n in enumerate(kls)])       # (pages, 576)
    starts = np.cumsum([0] + kls[:-1])
    table = [list(range(s, s + n)) for s, n in zip(starts, kls)]
    tk = to_cuda(keys[:, None, :], backend.device)
    out, s = _mla_run(backend, to_cuda(packed_q, backend.device), tk[..., :512].contiguous(),
                      tk[..., 512:].contiguous(), qls, kls, table, 1,
                      _mla_causal(causal, qls, kls), scale, lse)
    full = torch.zeros((layout.b, layout.hq, layout.lq, 512), device=backend.device)
    lses = torch.full((layout.b, layout.hq, layout.lq), -math.inf, device=backend.device)
    for i, (start, n) in enumerate(zip(np.cumsum([0] + qls[:-1]), qls)):
        full[i, :, :n] = out[start:start + n].float().transpose(0, 1)
        if lse:
            lses[i, :, :n] = s[start:start + n].float().transpose(0, 1)
    result = layout.restore(to_numpy(full, like=q))
    wide = rules.lse_dtype(np.asarray(q).dtype)              # float32 beside half outputs
    return result, (layout.restore(to_numpy(lses[..., None], like=wide))[..., 0] if lse else None)


def mla_paged(backend, q, k_pages, v_pages, block_table, kv_lengths, page_layout, causal,
              scale, softcap, window, q_lengths, lse=False, qv=None):
    """Paged latent attention: FlashMLA's form (pages of 576 whose first 512 columns are
    V) or, with qv, the absorbed one (q_pe = q, q_nope = qv, kpe = the key pages of 64,
    ckv = the value pages of 512: the same scores)."""
    if softcap is not None or window is not None:
        raise NotImplementedError("flashinfer: MLA takes no softcap or window")
    one = (lambda p: np.asarray(p)[:, :, 0]) if page_layout == "NHD" else \
        (lambda p: np.asarray(p)[:, 0])                           # (pages, page_size, D)
    if qv is None:
        pool = one(k_pages)
        if not np.array_equal(one(v_pages).view(np.uint8), pool[..., :512].copy().view(np.uint8)):
            raise NotImplementedError("flashinfer: MLA reads V as the first 512 columns of "
                                      "the latent cache; these pages hold other values")
        ckv, kpe = pool[..., :512], pool[..., 512:]
    else:
        ckv, kpe, q = one(v_pages), one(k_pages), np.concatenate([np.asarray(qv), q], axis=-1)
    b, hq, lq, _ = q.shape
    qls = list(q_lengths or [lq] * b)
    packed_q = np.concatenate([np.swapaxes(q[i, :, :n], 0, 1) for i, n in enumerate(qls)])
    out, s = _mla_run(backend, to_cuda(packed_q, backend.device),
                      to_cuda(np.ascontiguousarray(ckv), backend.device),
                      to_cuda(np.ascontiguousarray(kpe), backend.device), qls, list(kv_lengths),
                      block_table, ckv.shape[1], _mla_causal(causal, qls, kv_lengths),
                      1 / math.sqrt(576) if scale is None else float(scale), lse)
    full = to_numpy(_unpacked(out.float(), qls, (b, hq, lq, 512), 0.0, backend), like=q)
    if not lse:
        return full
    lses = _unpacked(s.float()[..., None], qls, (b, hq, lq, 1), -math.inf, backend)
    return full, to_numpy(lses[..., 0], like=rules.lse_dtype(q.dtype))
