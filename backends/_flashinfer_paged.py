"""The `flashinfer` backend's paged forms (backends/flashinfer.py): a paged KV cache
through FlashInfer's batch decode and prefill wrappers, and MLA through its latent
wrapper; and native_mask, FlashInfer's causal and window, which both modules use.
Unverified on hardware, like the adapter.

A block table becomes FlashInfer's CSR form: ``kv_indptr`` (cumulative pages per
sequence), ``kv_indices`` (the pages of each sequence, in order) and
``kv_last_page_len`` (tokens in each sequence's last page), int32 as its plan takes them.
"""

from __future__ import annotations

import math

import numpy as np

from . import rules
from ._cuda import pad_head, padded_head, to_cuda, to_numpy


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
               scale, softcap, window, q_lengths):
    import torch

    q = np.asarray(q)
    b, hq, lq, dk = q.shape
    node = 2 if page_layout == "HND" else 1
    page_size, hkv = np.shape(k_pages)[node], np.shape(k_pages)[3 - node]
    if hkv == 1 and dk == 576 and np.shape(v_pages)[-1] == 512:
        return _mla_paged(backend, q, k_pages, v_pages, block_table, kv_lengths, page_layout,
                          causal, scale, softcap, window, q_lengths)
    dv = np.shape(v_pages)[-1]
    size = padded_head(max(dk, dv), backend.name)
    scale = 1 / math.sqrt(dk) if scale is None else float(scale)
    q_lengths = list(q_lengths or [lq] * b)
    native = _shared_native(q_lengths, kv_lengths, causal, window)
    indptr, indices, last = (to_cuda(x, backend.device)
                             for x in page_csr(block_table, kv_lengths, page_size))
    pools = tuple(pad_head(to_cuda(p, backend.device), size) for p in (k_pages, v_pages))
    packed = np.concatenate([np.swapaxes(q[i, :, :n], 0, 1) for i, n in enumerate(q_lengths)])
    tq = pad_head(to_cuda(packed, backend.device), size)
    common = dict(sm_scale=scale, logits_soft_cap=softcap, q_data_type=tq.dtype,
                  kv_data_type=tq.dtype)
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
            dict(custom_mask=_flat_mask(q_lengths, kv_lengths, causal, window, backend.device))
        wrapper.plan(qo_indptr, indptr, indices, last, hq, hkv, size, page_size, **form,
                     **common)
    packed_out = wrapper.run(tq, pools)[..., :dv].float()
    out = torch.zeros((b, hq, lq, dv), dtype=torch.float32, device=backend.device)
    for i, (start, n) in enumerate(zip(np.cumsum([0] + q_lengths[:-1]), q_lengths)):
        out[i, :, :n] = packed_out[start:start + n].transpose(0, 1)
    return to_numpy(out, like=q)


def _flat_mask(q_lengths, kv_lengths, causal, window, device):
    """FlashInfer's flattened custom mask: each request's (ql, kl) mask, row-major, end to
    end."""
    import torch

    parts = [np.broadcast_to(rules.allowed(ql, kl, causal, window), (ql, kl)).ravel()
             if causal is not None or window is not None else np.ones(ql * kl, bool)
             for ql, kl in zip(q_lengths, kv_lengths)]
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


def _mla_paged(backend, q, k_pages, v_pages, block_table, kv_lengths, page_layout, causal,
               scale, softcap, window, q_lengths):
    import torch

    if softcap is not None or window is not None:
        raise NotImplementedError("flashinfer: MLA takes no softcap or window")
    pool = np.asarray(k_pages)
    pool = pool[:, :, 0] if page_layout == "NHD" else pool[:, 0]    # (pages, page_size, 576)
    values = np.asarray(v_pages)
    values = values[:, :, 0] if page_layout == "NHD" else values[:, 0]
    if not np.array_equal(values.view(np.uint8), pool[..., :512].copy().view(np.uint8)):
        raise NotImplementedError("flashinfer: MLA reads V as the first 512 columns of the "
                                  "latent cache; these pages hold other values")
    b, hq, lq, _ = q.shape
    qls = list(q_lengths or [lq] * b)
    packed_q = np.concatenate([np.swapaxes(q[i, :, :n], 0, 1) for i, n in enumerate(qls)])
    tk = to_cuda(pool, backend.device)
    out, _ = _mla_run(backend, to_cuda(packed_q, backend.device), tk[..., :512].contiguous(),
                      tk[..., 512:].contiguous(), qls, list(kv_lengths), block_table,
                      pool.shape[1], _mla_causal(causal, qls, kv_lengths),
                      1 / math.sqrt(576) if scale is None else float(scale), False)
    full = torch.zeros((b, hq, lq, 512), device=backend.device)
    for i, (start, n) in enumerate(zip(np.cumsum([0] + qls[:-1]), qls)):
        full[i, :, :n] = out[start:start + n].float().transpose(0, 1)
    return to_numpy(full, like=q)
