"""Packed documents (and, later, block-sparse masks) as the adapters' shared rule
composes them (backends/rules.py) and as the reference does (golden/structure.py),
each checked element by element against docs/interface.md's words."""

from __future__ import annotations

import numpy as np
import pytest

from attention_conformance.backends import rules
from attention_conformance.golden import reference, structure

IDS = [[0, 0, 1, 1, 1, 2], [-1, -1, 0, 0, 0, 0]]


def same_document(q_ids, kv_ids, i, j) -> bool:
    """docs/interface.md, "Packed documents": query i sees key j only when both carry
    the same document id."""
    return q_ids[i] == kv_ids[j]


@pytest.mark.parametrize("make", [
    lambda q, k, rank: rules.segment_mask(q, k, rank),
    lambda q, k, rank: structure.document_keys((2,) + (1,) * (rank - 3) + (6, 6), q, k),
], ids=["rules", "reference"])
@pytest.mark.parametrize("rank", [3, 4, 5])
def test_segment_ids_of_each_batch_element(make, rank):
    keep = make(IDS, IDS, rank)
    assert keep.ndim == rank
    for b, ids in enumerate(IDS):
        flat = keep[b].reshape(6, 6)
        for i in range(6):
            for j in range(6):
                assert flat[i, j] == same_document(ids, ids, i, j)


def test_one_list_of_ids_serves_the_whole_batch():
    keep = rules.segment_mask(IDS[0], IDS[0][:4], 4)
    assert keep.shape == (6, 4)
    assert np.array_equal(keep, structure.document_keys((2, 3, 6, 4), IDS[0], IDS[0][:4]))


def test_segment_ids_come_together():
    with pytest.raises(ValueError, match="together"):
        rules.segment_mask(IDS, None, 3)


def test_the_wrapped_op_gets_the_documents_and_its_own_mask_anded():
    seen = {}

    class Op:
        @rules.lengths_as_mask
        def sdpa(self, q, k, v, *, mask=None, causal=None, window=None):
            seen["mask"], seen["causal"] = mask, causal
            return np.zeros(q.shape[:-1] + (v.shape[-1],))

    q = np.zeros((2, 1, 6, 4))
    mask = np.ones((6, 6), dtype=bool)
    mask[:, 0] = False
    Op().sdpa(q, q, q, mask=mask, causal="top_left", q_segment_ids=IDS, kv_segment_ids=IDS)
    assert seen["causal"] == "top_left"                 # causal left to the framework
    expected = mask & structure.document_keys((2, 1, 6, 6), IDS, IDS)
    assert np.array_equal(np.broadcast_to(seen["mask"], (2, 1, 6, 6)), expected)


def test_the_reference_keeps_documents_apart():
    """Attention over a packed row is attention over each document on its own."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.normal(size=(1, 2, 6, 4)) for _ in range(3))
    packed = reference.sdpa(q, k, v, causal="top_left", q_segment_ids=IDS[:1],
                            kv_segment_ids=IDS[:1])
    for start, stop in ((0, 2), (2, 5), (5, 6)):
        alone = reference.sdpa(q[..., start:stop, :], k[..., start:stop, :],
                               v[..., start:stop, :], causal="top_left")
        assert np.allclose(packed[..., start:stop, :], alone, rtol=0, atol=1e-15)


def in_computed_block(block_mask, block_size, i, j) -> bool:
    """docs/interface.md, "Block-sparse masks": query i may see key j only when the block
    (i // Bq, j // Bk) is 1."""
    return block_mask[i // block_size[0]][j // block_size[1]] == 1


@pytest.mark.parametrize("block_mask, block_size, lq, lk", [
    ([[1, 0, 1], [0, 1, 1], [1, 1, 0]], [3, 5], 7, 11),
    ([[1, 0], [1, 1]], [4, 4], 8, 8),
    ([[0, 1, 1, 0]], [1, 1], 1, 4),
])
def test_block_masks_made_dense(block_mask, block_size, lq, lk):
    for dense in (rules.block_mask_dense(block_mask, block_size, lq, lk),
                  structure.block_keys((1, lq, lk), block_mask, block_size)):
        assert dense.shape == (lq, lk)
        for i in range(lq):
            for j in range(lk):
                assert dense[i, j] == in_computed_block(block_mask, block_size, i, j)


def test_a_block_mask_per_head_broadcasts_as_a_mask():
    per_head = [[[1, 0], [0, 1]], [[0, 1], [1, 0]]]
    dense = rules.block_mask_dense(per_head, [2, 2], 4, 3)
    assert dense.shape == (2, 4, 3)
    assert np.array_equal(dense, structure.block_keys((1, 2, 4, 3), per_head, [2, 2]))
    mask = rules.structure_mask(None, (1, 2, 4, 8), (1, 2, 3, 8), block_mask=per_head,
                                block_size=[2, 2], q_segment_ids=[0, 0, 1, 1],
                                kv_segment_ids=[0, 1, 1])
    assert np.array_equal(mask, dense & structure.document_keys((1, 2, 4, 3), [0, 0, 1, 1],
                                                                [0, 1, 1]))
