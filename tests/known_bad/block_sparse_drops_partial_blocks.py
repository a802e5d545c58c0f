"""Known bug: a block-sparse kernel that computes only the full blocks of its BlockMask
(flex_attention's full_kv_indices) and drops the partial ones (kv_indices, where the
mask_mod decides element by element)."""

import numpy as np

from attention_conformance.backends import rules
from _plant import Planted


def _full_blocks_only(q, k, mask, causal, window, block_mask, block_size):
    """The mask the buggy kernel uses: the element rule inside the blocks it allows
    wholly, nothing in a block it allows only in part."""
    lq, lk = np.shape(q)[-2], np.shape(k)[-2]
    element = rules.and_masks(None if mask is None else np.asarray(mask, dtype=bool),
                              rules.allowed(lq, lk, causal, window))
    if element is None:
        return rules.block_mask_dense(block_mask, block_size, lq, lk)
    size_q, size_k = block_size
    blocks = np.asarray(block_mask) != 0
    nq, nk = blocks.shape[-2:]
    padded = np.zeros(element.shape[:-2] + (nq * size_q, nk * size_k), dtype=bool)
    padded[..., :lq, :lk] = element
    whole = padded.reshape(element.shape[:-2] + (nq, size_q, nk, size_k)).all(axis=(-3, -1))
    full = blocks & whole
    return rules.block_mask_dense(full, block_size, lq, lk) & element


def _dropping(op):
    def call(self, q, k, *arrays, mask=None, causal=None, window=None, block_mask=None,
             block_size=None, **params):
        if block_mask is not None:
            mask = _full_blocks_only(q, k, mask, causal, window, block_mask, block_size)
        return getattr(Planted, op)(self, q, k, *arrays, mask=mask, causal=causal,
                                    window=window, **params)
    call.__name__ = op
    return call


class BlockSparseDropsPartialBlocks(Planted):
    """Block-sparse mask computing its full blocks only: every partial block dropped."""

    attention_weights = _dropping("attention_weights")
    sdpa = _dropping("sdpa")
    sdpa_vjp = _dropping("sdpa_vjp")
