"""What the torch-flex adapter routes around in torch.nn.attention.flex_attention (torch
2.13.0, CPU, eager), reproduced directly with torch against a float64 computation: the
test asserts that the difference exists, so a torch that changes it fails here and the
adapter's route (docs/findings.md, "What the adapters work around") is revisited."""

from __future__ import annotations

import warnings

import numpy as np
import pytest


def test_eager_flex_attention_ignores_the_block_masks_blocks():
    """A BlockMask lists, per query block, the key blocks to visit (kv_num_blocks,
    kv_indices); eager flex_attention reads every key and applies the mask_mod alone, so a
    key block the BlockMask leaves out is attended. The torch-flex backend gives the
    spec's block_mask to flex through the mask_mod as well, where eager flex honours it."""
    torch = pytest.importorskip("torch")
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    r = np.random.RandomState(7101)
    q, k, v = (torch.from_numpy(r.randn(1, 1, 256, 8)) for _ in range(3))
    # query block 0 visits key block 0, query block 1 key block 1 (blocks of 128 keys)
    blocks = flex.BlockMask.from_kv_blocks(
        torch.tensor([[[1, 1]]], dtype=torch.int32),
        torch.tensor([[[[0, 1], [1, 0]]]], dtype=torch.int32), BLOCK_SIZE=128)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = flex.flex_attention(q, k, v, block_mask=blocks).numpy()

    def attend(allowed):
        s = q.numpy() @ np.swapaxes(k.numpy(), -1, -2) / np.sqrt(8)
        s = np.where(allowed, s, -np.inf)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        return p / p.sum(axis=-1, keepdims=True) @ v.numpy()

    diagonal = np.kron(np.eye(2, dtype=bool), np.ones((128, 128), dtype=bool))
    assert np.abs(out - attend(np.ones((256, 256), dtype=bool))).max() < 1e-12
    assert np.abs(out - attend(diagonal)).max() > 0.1
