"""The float64 reference of the serving forms (golden/serving.py) against values derived
by hand and against the textbook ops: a paged cache read back, merged states."""

from __future__ import annotations

import math

import numpy as np

from attention_conformance.golden import reference as R


def test_pages_read_back_in_table_order_and_nothing_past_the_length():
    pages = np.arange(4 * 2 * 1 * 1, dtype=float).reshape(4, 2, 1, 1)   # page p slot s: 2p + s
    pages[1] = np.nan                                                    # listed, never read
    k = R.read_pages(pages, [[3, 0, 1]], [3])
    assert k[0, 0, :, 0].tolist() == [6.0, 7.0, 0.0]                     # page 3, then page 0 slot 0
    hnd = R.read_pages(np.swapaxes(pages, 1, 2), [[3, 0, 1]], [3], "HND")
    assert np.array_equal(hnd, k)


def test_paged_sdpa_is_sdpa_over_the_pages_in_order():
    rng = np.random.RandomState(0)
    q, k, v = rng.randn(1, 2, 3, 4), rng.randn(1, 1, 7, 4), rng.randn(1, 1, 7, 5)
    order = [2, 0, 3]                    # pages of 3 tokens, the last one holds 1
    k_pages, v_pages = np.full((4, 3, 1, 4), np.nan), np.full((4, 3, 1, 5), np.nan)
    for i, page in enumerate(order):
        n = min(3, 7 - 3 * i)
        k_pages[page, :n] = np.swapaxes(k[0, :, 3 * i:3 * i + n], 0, 1)
        v_pages[page, :n] = np.swapaxes(v[0, :, 3 * i:3 * i + n], 0, 1)
    got = R.paged_sdpa(q, k_pages, v_pages, block_table=[order], kv_lengths=[7],
                       causal="bottom_right")
    assert np.allclose(got, R.sdpa(q, k, v, causal="bottom_right"), atol=1e-14)


def test_two_states_merge_by_hand():
    outs = np.array([[[1.0, 0.0]], [[0.0, 1.0]]])        # (N=2, Lq=1, Dv=2)
    lses = np.array([[math.log(1.0)], [math.log(3.0)]])
    out, lse = R.merge_states(outs, lses)
    assert np.allclose(out, [[0.25, 0.75]]) and np.allclose(lse, [math.log(4.0)])
    out2, lse2 = R.merge_states(outs, lses / math.log(2.0), policies={"lse_base": "2"})
    assert np.allclose(out2, out) and np.allclose(lse2, lse / math.log(2.0))


def test_empty_states_add_nothing_and_a_row_of_them_merges_to_zero():
    outs = np.array([[[5.0], [7.0]], [[2.0], [9.0]], [[1e3], [3.0]]])
    lses = np.array([[0.3, -np.inf], [np.inf, np.inf], [-np.inf, -np.inf]])
    out, lse = R.merge_states(outs, lses)
    assert out.tolist() == [[5.0], [0.0]] and lse[0] == 0.3 and lse[1] == -np.inf


def test_split_states_merge_to_attention_over_all_keys():
    rng = np.random.RandomState(1)
    q, k, v = rng.randn(2, 3, 4), rng.randn(2, 9, 4), rng.randn(2, 9, 3)
    parts = [R.sdpa_lse(q, k[:, s], v[:, s]) for s in (slice(0, 4), slice(4, 9))]
    out, lse = R.merge_states(np.stack([p[0] for p in parts]), np.stack([p[1] for p in parts]))
    whole = R.sdpa_lse(q, k, v)
    assert np.allclose(out, whole[0], atol=1e-14) and np.allclose(lse, whole[1], atol=1e-14)
    base2 = R.sdpa_lse(q, k, v, policies={"lse_base": "2"})[1]
    assert np.allclose(base2 * math.log(2.0), whole[1], atol=1e-14)


def _softmax_rows(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_the_absorbed_form_scores_q_k_plus_qv_v_at_1_over_sqrt_dk_plus_dv():
    """FlashAttention 3's qv, written out: softmax((q kᵀ + qv vᵀ) / sqrt(Dk + Dv)) v, one
    latent kv head shared by every query head."""
    rng = np.random.RandomState(1)
    q, qv = rng.randn(2, 4, 3, 2), rng.randn(2, 4, 3, 5)
    k, v = rng.randn(2, 1, 6, 2), rng.randn(2, 1, 6, 5)
    s = (q @ np.swapaxes(k, -1, -2) + qv @ np.swapaxes(v, -1, -2)) / math.sqrt(2 + 5)
    assert np.allclose(R.sdpa(q, k, v, qv=qv), _softmax_rows(s) @ v, atol=1e-14)
    given = R.sdpa(q, k, v, qv=qv, scale=0.3, causal="bottom_right")
    assert np.allclose(given, R.sdpa(np.concatenate([q, qv], -1), np.concatenate([k, v], -1),
                                     v, scale=0.3, causal="bottom_right"), atol=1e-14)


def test_paged_sdpa_with_qv_scores_qv_against_the_value_pages():
    rng = np.random.RandomState(2)
    q, qv = rng.randn(1, 2, 1, 3), rng.randn(1, 2, 1, 4)
    k_pages, v_pages = rng.randn(3, 2, 1, 3), rng.randn(3, 2, 1, 4)
    got = R.paged_sdpa(q, k_pages, v_pages, block_table=[[2, 0]], kv_lengths=[3], qv=qv)
    k, v = (np.concatenate([p[2], p[0, :1]])[None].swapaxes(1, 2) for p in (k_pages, v_pages))
    assert np.allclose(got, R.sdpa(q, k, v, qv=qv), atol=1e-14)
