"""The float64 reference against values derived by hand and against finite differences."""

import itertools
import math

import numpy as np
import pytest

from attention_conformance.golden import reference as R


def rng(seed):
    return np.random.RandomState(seed)


def hand_softmax(row):
    exps = [math.exp(x - max(row)) for x in row]
    return [e / sum(exps) for e in exps]


def hand_attention(q, k, v, scale, allowed=None):
    """Token by token, as the lecture's stepwise recipe: alpha, softmax, weighted sum."""
    out = []
    for i, qi in enumerate(q):
        keys = [j for j in range(len(k)) if allowed is None or allowed[i][j]]
        alpha = [sum(a * b for a, b in zip(qi, k[j])) * scale for j in keys]
        weights = hand_softmax(alpha)
        out.append([sum(w * v[j][c] for w, j in zip(weights, keys)) for c in range(len(v[0]))])
    return np.array(out)


# --- worked examples ------------------------------------------------------------------

def test_softmax_of_5_2_1_2_matches_hand_values():
    got = R.softmax(np.array([5.0, 2.0, 1.0, 2.0]))
    assert np.allclose(got, hand_softmax([5, 2, 1, 2]), rtol=1e-15, atol=0)
    assert got[1] == got[3]
    assert abs(got.sum() - 1) < 1e-15


def test_unnormalised_weighted_sum_is_exact():
    a = np.array([[1, 0, 2], [0, 1, 1], [3, 1, 0], [1, 1, 1]], dtype=float)
    got = R.scores(np.array([[5.0, 2, 1, 2]]), a.T, kind="dot")
    assert got.tolist() == [[10.0, 5.0, 14.0]]


def test_i_saw_a_saw_identical_tokens_get_identical_outputs():
    x = np.eye(3)[[0, 1, 2, 1]]
    w = [rng(s).standard_normal((3, 4)) for s in (1, 2, 3)]
    out = R.self_attention(x, *w)
    assert np.array_equal(out[1], out[3])
    assert not np.allclose(out[0], out[1])


def test_stepwise_recipe_equals_matrix_form():
    x = rng(4).standard_normal((5, 3))
    wq, wk, wv = (rng(s).standard_normal((3, d)) for s, d in ((5, 2), (6, 2), (7, 4)))
    q, k, v = ([list(np.dot(w.T, a)) for a in x] for w in (wq, wk, wv))   # q = W^q a per token
    expected = hand_attention(q, k, v, 1 / math.sqrt(2))
    assert np.allclose(R.self_attention(x, wq, wk, wv), expected, rtol=1e-13, atol=1e-14)


def test_column_form_equals_row_form():
    q, k, v = (rng(s).standard_normal((n, d)) for s, n, d in ((8, 3, 4), (9, 5, 4), (10, 5, 6)))
    rows = R.sdpa(q, k, v)
    columns = R.sdpa_columns(q.T, k.T, v.T).T
    assert np.allclose(rows, columns, rtol=1e-13, atol=1e-14)


def test_sqrt_dk_statistics_of_the_article():
    q, k = rng(401).standard_normal((123, 456)), rng(402).standard_normal((123, 456))
    assert abs(R.scores(q, k, kind="dot").std() - math.sqrt(456)) < 1.0
    assert abs(R.scores(q, k, kind="scaled_dot").std() - 1.0) < 0.05


def test_self_attention_module_shape():
    out = R.self_attention(np.zeros((50, 5, 3)), np.ones((3, 5)), np.ones((3, 5)), np.ones((3, 4)))
    assert out.shape == (50, 5, 4)


def test_causal_first_row_is_one_hot_and_first_output_is_v0():
    q, k, v = (rng(s).standard_normal((4, 64)) for s in (11, 12, 13))
    p = R.attention_weights(q, k, causal="top_left")
    assert p[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert np.array_equal(R.sdpa(q, k, v, causal="top_left", scale=0.125)[0], v[0])
    assert np.all(np.triu(p, 1) == 0)


def test_cross_attention_three_queries_four_states():
    q, k, v = rng(1).standard_normal((3, 8)), rng(2).standard_normal((4, 8)), rng(3).standard_normal((4, 5))
    expected = hand_attention(q.tolist(), k.tolist(), v.tolist(), 1 / math.sqrt(8))
    assert np.allclose(R.sdpa(q, k, v), expected, rtol=1e-13, atol=1e-14)


def test_score_functions_by_hand():
    q, k = rng(1).standard_normal((2, 3)), rng(2).standard_normal((4, 5))
    w_add, u, vv = rng(3).standard_normal((5, 6)), rng(4).standard_normal((3, 6)), rng(5).standard_normal(6)
    w_bil = rng(6).standard_normal((3, 5))
    for i, j in itertools.product(range(2), range(4)):
        additive = sum(vv[a] * math.tanh(sum(k[j, b] * w_add[b, a] for b in range(5)) +
                                         sum(q[i, b] * u[b, a] for b in range(3))) for a in range(6))
        assert math.isclose(R.scores(q, k, kind="additive", w=w_add, u=u, v=vv)[i, j], additive,
                            rel_tol=1e-13)
        bilinear = sum(q[i, a] * w_bil[a, b] * k[j, b] for a in range(3) for b in range(5))
        assert math.isclose(R.scores(q, k, kind="bilinear", w=w_bil)[i, j], bilinear, rel_tol=1e-13)
    kk = k[:, :3]
    assert np.allclose(R.scores(q, kk, kind="scaled_dot"), q @ kk.T / math.sqrt(3))


def test_key_value_with_k_equal_v_is_plain_attention():
    q, x = rng(1).standard_normal((3, 4)), rng(2).standard_normal((6, 4))
    assert np.allclose(R.sdpa(q, x, x), R.attention_weights(q, x) @ x, rtol=1e-14)


def test_multi_head_attention_by_hand():
    x = rng(1).standard_normal((2, 5, 6))
    wq, wk, wv, wo = (rng(s).standard_normal((6, 6)) for s in (2, 3, 4, 5))
    heads = []
    for h in range(3):
        cols = slice(2 * h, 2 * h + 2)
        heads.append(np.stack([hand_attention((b @ wq)[:, cols].tolist(), (b @ wk)[:, cols].tolist(),
                                              (b @ wv)[:, cols].tolist(), 1 / math.sqrt(2))
                               for b in x]))
    expected = np.concatenate(heads, axis=-1) @ wo
    got = R.multi_head_attention(x, x, x, w_q=wq, w_k=wk, w_v=wv, w_o=wo, num_heads=3)
    assert np.allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_grouped_query_head_h_reads_kv_head_h_over_group():
    q, k, v = rng(1).standard_normal((6, 3, 4)), rng(2).standard_normal((2, 5, 4)), rng(3).standard_normal((2, 5, 3))
    got = R.sdpa(q, k, v)
    for h in range(6):
        assert np.allclose(got[h], R.sdpa(q[h], k[h // 3], v[h // 3]), rtol=1e-14)


# --- masks, alignments, windows, softcap ----------------------------------------------

def test_causal_alignments_by_hand():
    assert R.allowed_keys(2, 4, causal="top_left").astype(int).tolist() == [[1, 0, 0, 0], [1, 1, 0, 0]]
    assert R.allowed_keys(2, 4, causal="bottom_right").astype(int).tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert R.allowed_keys(3, 2, causal="bottom_right").astype(int).tolist() == [[0, 0], [1, 0], [1, 1]]


def test_window_by_hand():
    band = R.allowed_keys(4, 4, window=(1, 0)).astype(int).tolist()
    assert band == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    two_sided = R.allowed_keys(3, 5, window=(0, 1)).astype(int).tolist()
    assert two_sided == [[1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0]]
    assert R.allowed_keys(3, 3, window=(None, -1)).all()
    shifted = R.allowed_keys(2, 4, causal="bottom_right", window=(1, None)).astype(int).tolist()
    assert shifted == [[0, 1, 1, 0], [0, 0, 1, 1]]


def test_mask_and_bias_intersect_with_causal():
    q, k, v = (rng(s).standard_normal((3, 4)) for s in (1, 2, 3))
    mask = np.array([[True, True, True], [False, True, True], [True, True, True]])
    bias = rng(4).standard_normal((3, 3))
    allowed = mask & np.tril(np.ones((3, 3), bool))
    p = R.attention_weights(q, k, mask=mask, bias=bias, causal="top_left")
    s = q @ k.T / 2 + bias
    for i in range(3):
        expected = np.zeros(3)
        expected[allowed[i]] = hand_softmax(s[i][allowed[i]].tolist())
        assert np.allclose(p[i], expected, rtol=1e-14, atol=0)


def test_softcap_applies_before_bias_and_mask():
    q, k = rng(1).standard_normal((2, 4)) * 5, rng(2).standard_normal((3, 4)) * 5
    bias = np.array([[0.0, 1.0, -1.0]])
    mask = np.array([[True, True, False]])
    p = R.attention_weights(q, k, bias=bias, mask=mask, softcap=2.0, scale=1.0)
    s = 2.0 * np.tanh(q @ k.T / 2.0) + bias
    for i in range(2):
        assert np.allclose(p[i, :2], hand_softmax(s[i, :2].tolist()), rtol=1e-14)
        assert p[i, 2] == 0.0


@pytest.mark.parametrize("choice, row", [("zeros", [0.0] * 3), ("uniform", [1 / 3] * 3)])
def test_fully_masked_row_policies(choice, row):
    q, k = rng(1).standard_normal((2, 4)), rng(2).standard_normal((3, 4))
    mask = np.array([[False] * 3, [True] * 3])
    p = R.attention_weights(q, k, mask=mask, policies={"fully_masked_rows": choice})
    assert np.allclose(p[0], row, atol=0, rtol=1e-15)
    assert np.isnan(R.attention_weights(q, k, mask=mask, policies={"fully_masked_rows": "nan"})[0]).all()


def test_neg_inf_bias_row_and_nan_policies():
    q, k, v = rng(1).standard_normal((2, 4)), rng(2).standard_normal((3, 4)), rng(3).standard_normal((3, 2))
    bias = np.array([[-np.inf] * 3, [0.0] * 3])
    assert np.isnan(R.sdpa(q, k, v, bias=bias)[0]).all()
    assert R.sdpa(q, k, v, bias=bias, policies={"neg_inf_bias_rows": "zeros"})[0].tolist() == [0, 0]
    mask = np.array([True, True, False])
    k_nan, v_nan = k.copy(), v.copy()
    k_nan[2, 0] = v_nan[2, 1] = np.nan
    clean = R.sdpa(q, k, v, mask=mask)
    assert np.allclose(R.sdpa(q, k_nan, v, mask=mask), clean)
    assert np.isnan(R.sdpa(q, k_nan, v, mask=mask, policies={"masked_key_nan": "propagates"})).all()
    assert np.allclose(R.sdpa(q, k, v_nan, mask=mask), clean)
    assert np.isnan(R.sdpa(q, k, v_nan, mask=mask, policies={"masked_value_nan": "propagates"})).any()


def test_ignored_gradients_read_no_key_a_query_may_not_see():
    """masked_key_nan ignored: dq of a query is dS K over the keys it may see, so a NaN
    in a key it may not see is in none of its gradients (the never-read form); a key
    some query sees makes only that row NaN. key_nan_columns marks the dq elements a
    plain dS K fills with 0 * NaN instead."""
    q, k, v, d_out = (rng(s).standard_normal(shape) for s, shape in
                      ((11, (2, 4, 3)), (12, (2, 5, 3)), (13, (2, 5, 2)), (14, (2, 4, 2))))
    k_nan = k.copy()
    k_nan[:, 4, 1] = np.nan                       # key 4: hidden from every query
    k_nan[:, 3, 2] = np.nan                       # key 3: seen by query 3 alone
    clean = R.sdpa_vjp(q, k * (np.arange(5) < 4)[:, None], v, d_out, causal="top_left")
    dq, dk, dv = R.sdpa_vjp(q, k_nan, v, d_out, causal="top_left")
    assert np.allclose(dq[:, :3], clean[0][:, :3]) and np.isnan(dq[:, 3]).all()
    assert np.all(dk[:, 4] == 0)                  # no row's dS reaches key 4
    only_hidden = np.where(np.arange(5)[:, None] == 3, k, k_nan)
    alone = R.sdpa_vjp(q, only_hidden, v, d_out, causal="top_left")
    assert all(np.isfinite(g).all() for g in alone)   # key 4's NaN alone reaches nothing
    plain, _, _ = R.sdpa_vjp(q, k_nan, v, d_out, causal="top_left",
                             policies={"masked_key_nan": "propagates"})
    assert np.isnan(plain).all()
    columns = R.key_nan_columns(q, k_nan, causal="top_left")
    expected = np.zeros(q.shape, bool)
    expected[:, :, 1] = True                      # key 4, column 1: no query sees it
    expected[:, :3, 2] = True                     # key 3, column 2: queries 0-2 do not
    assert np.array_equal(columns, expected)


# --- gradients, blocks, rounding ------------------------------------------------------

GRADIENT_CASES = [
    dict(),
    dict(causal="top_left"),
    dict(causal="bottom_right", window=(1, None)),
    dict(softcap=1.5, scale=0.7),
    dict(mask="random", bias="random"),
]


def _finite_differences(f, arrays, eps=1e-6):
    grads = []
    for a in arrays:
        g = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            old = a[i]
            a[i] = old + eps
            up = f()
            a[i] = old - eps
            down = f()
            a[i] = old
            g[i] = (up - down) / (2 * eps)
        grads.append(g)
    return grads


@pytest.mark.parametrize("params", GRADIENT_CASES, ids=lambda p: ",".join(p) or "plain")
def test_sdpa_vjp_matches_finite_differences(params):
    params = dict(params)
    q, k, v = rng(1).standard_normal((2, 2, 3, 4)), rng(2).standard_normal((1, 5, 4)), rng(3).standard_normal((1, 5, 3))
    if params.get("mask") == "random":
        params["mask"] = rng(4).random_sample((3, 5)) < 0.7
        params["mask"][:, 0] = True
        params["bias"] = rng(5).standard_normal((5,))
    d_out = rng(6).standard_normal((2, 2, 3, 3))
    grads = R.sdpa_vjp(q, k, v, d_out, **params)
    numeric = _finite_differences(lambda: float(np.sum(R.sdpa(q, k, v, **params) * d_out)), [q, k, v])
    for name, got, want in zip("qkv", grads, numeric):
        assert got.shape == want.shape, name
        assert np.allclose(got, want, rtol=1e-6, atol=1e-7), (name, np.max(np.abs(got - want)))


def test_blockwise_result_does_not_depend_on_block_size(monkeypatch):
    q, k, v = rng(1).standard_normal((2, 37, 8)), rng(2).standard_normal((2, 41, 8)), rng(3).standard_normal((2, 41, 5))
    d_out = rng(4).standard_normal((2, 37, 5))
    whole = R.sdpa(q, k, v, causal="bottom_right"), R.sdpa_vjp(q, k, v, d_out, causal="bottom_right")
    monkeypatch.setattr(R, "BLOCK", 5)
    blocked = R.sdpa(q, k, v, causal="bottom_right"), R.sdpa_vjp(q, k, v, d_out, causal="bottom_right")
    assert np.allclose(whole[0], blocked[0], rtol=1e-14, atol=1e-15)
    for a, b in zip(whole[1], blocked[1]):
        assert np.allclose(a, b, rtol=1e-12, atol=1e-14)


def test_rounded_to_measures_a_plain_low_precision_error():
    q, k, v = (rng(s).standard_normal((4, 16)) for s in (1, 2, 3))
    exact = R.sdpa(q, k, v)
    errors = {}
    for dtype in ("float32", "float16", "bfloat16"):
        with R.rounded_to(dtype):
            errors[dtype] = np.max(np.abs(R.sdpa(q, k, v) - exact))
    assert 0 < errors["float32"] < 1e-5 < errors["float16"] < errors["bfloat16"] < 0.1
    assert np.array_equal(R.sdpa(q, k, v), exact)  # the context is left behind


def test_the_float32_tier_accumulates_in_float32_and_rounds_once():
    """rounded_to(dtype, "float32"): products and sums of dtype values summed in float32,
    the result rounded to the dtype; the input tier keeps numpy's own arithmetic."""
    from attention_conformance.model.dtypes import round_to
    ones = np.ones((1, 4096))
    with R.rounded_to("bfloat16"):
        assert R._sum(ones, -1)[0, 0] == 256.0        # bfloat16 sums stagnate
    with R.rounded_to("bfloat16", "float32"):
        assert R._sum(ones, -1)[0, 0] == 4096.0
        a, b = np.full((1, 3), 1.0 / 3), np.full((3, 1), 3.0)
        wide = (round_to(a, "bfloat16").astype(np.float32)
                @ round_to(b, "bfloat16").astype(np.float32)).astype(np.float64)
        assert R._mm(a, b)[0, 0] == round_to(wide, "bfloat16")[0, 0]


# --- log-sum-exp and attention sinks -------------------------------------------------

def test_lse_is_the_log_of_each_rows_denominator_by_hand():
    q, k, v = (np.array(x, dtype=float) for x in ([[1.0, 0.0], [0.0, 2.0]],
                                                  [[1.0, 1.0], [2.0, 0.0], [0.0, -1.0]],
                                                  [[1.0], [2.0], [3.0]]))
    out, lse = R.sdpa_lse(q, k, v, scale=1.0, causal="top_left")
    assert lse[0] == 1.0                                    # one key: log(exp(1))
    assert np.isclose(lse[1], math.log(math.exp(2.0) + math.exp(0.0)), rtol=1e-15)
    assert np.array_equal(out, R.sdpa(q, k, v, scale=1.0, causal="top_left"))
    p = R.attention_weights(q, k, scale=1.0)
    assert np.allclose(p, np.exp(q @ k.T - R.sdpa_lse(q, k, v, scale=1.0)[1][:, None]),
                       rtol=1e-15, atol=0)


@pytest.mark.parametrize("choice, lse", [("zeros", -np.inf), ("uniform", math.log(3)),
                                         ("nan", np.nan)])
def test_lse_of_an_empty_row_under_each_choice(choice, lse):
    q, k, v = rng(1).standard_normal((2, 4)), rng(2).standard_normal((3, 4)), rng(3).standard_normal((3, 2))
    mask = np.array([[False] * 3, [True] * 3])
    bias = np.where(mask, 0.0, -np.inf)
    for policy, kw in (("fully_masked_rows", {"mask": mask}), ("neg_inf_bias_rows", {"bias": bias})):
        got = R.sdpa_lse(q, k, v, **kw, policies={policy: choice})[1]
        assert np.array_equal(got[:1], [lse], equal_nan=True), (policy, got)
        assert np.isfinite(got[1])


def test_sink_is_a_key_of_value_zero_by_hand():
    q, k, v = rng(1).standard_normal((2, 3, 4)), rng(2).standard_normal((2, 5, 4)), rng(3).standard_normal((2, 5, 3))
    sink = np.array([0.7, -2.0])
    scale = 0.5
    s = np.concatenate([q @ np.swapaxes(k, -1, -2) * scale,
                        np.broadcast_to(sink[:, None, None], (2, 3, 1))], axis=-1)
    p = np.exp(s) / np.exp(s).sum(-1, keepdims=True)
    out, lse = R.sdpa_lse(q, k, v, sink=sink, scale=scale)
    assert np.allclose(out, p[..., :5] @ v, rtol=1e-14, atol=1e-15)
    assert np.allclose(lse, np.log(np.exp(s).sum(-1)), rtol=1e-14)
    assert np.allclose(R.attention_weights(q, k, sink=sink, scale=scale), p[..., :5], rtol=1e-14)
    mask = np.zeros((3, 5), dtype=bool)                     # no key: the sink takes it all
    out, lse = R.sdpa_lse(q, k, v, sink=sink, mask=mask, policies={"fully_masked_rows": "nan"})
    assert np.array_equal(out, np.zeros_like(out)) and np.allclose(lse, sink[:, None])


SINK_GRADIENT_CASES = [
    dict(),
    dict(causal="bottom_right", window=(1, None)),
    dict(softcap=1.5, scale=0.7, mask="random", bias="random"),
]


@pytest.mark.parametrize("params", SINK_GRADIENT_CASES, ids=lambda p: ",".join(p) or "plain")
@pytest.mark.parametrize("sink_shape", [(4,), (1,), (2, 4)])
def test_sdpa_vjp_with_a_sink_matches_finite_differences(params, sink_shape):
    params = dict(params)
    q, k, v = rng(1).standard_normal((2, 4, 3, 4)), rng(2).standard_normal((2, 2, 5, 4)), rng(3).standard_normal((1, 2, 5, 3))
    sink = rng(7).standard_normal(sink_shape)
    if params.get("mask") == "random":
        params["mask"] = rng(4).random_sample((3, 5)) < 0.6
        params["mask"][1] = False                           # a row only the sink sees
        params["bias"] = rng(5).standard_normal((5,))
    d_out = rng(6).standard_normal((2, 4, 3, 3))
    grads = R.sdpa_vjp(q, k, v, d_out, sink=sink, **params)
    assert len(grads) == 4 and grads[3].shape == sink.shape
    numeric = _finite_differences(
        lambda: float(np.sum(R.sdpa(q, k, v, sink=sink, **params) * d_out)), [q, k, v, sink])
    for name, got, want in zip(("dq", "dk", "dv", "d_sink"), grads, numeric):
        assert got.shape == want.shape, name
        assert np.allclose(got, want, rtol=1e-6, atol=1e-7), (name, np.max(np.abs(got - want)))


def test_very_negative_sink_changes_nothing_and_very_positive_takes_everything():
    q, k, v = rng(1).standard_normal((1, 3, 4)), rng(2).standard_normal((1, 5, 4)), rng(3).standard_normal((1, 5, 2))
    assert np.allclose(R.sdpa(q, k, v, sink=np.array([-1e4])), R.sdpa(q, k, v), rtol=1e-15)
    assert np.allclose(R.sdpa(q, k, v, sink=np.array([1e4])), 0.0, atol=1e-300)


def test_lse_and_sink_under_rounding_stay_close():
    q, k, v = rng(1).standard_normal((2, 6, 8)), rng(2).standard_normal((2, 9, 8)), rng(3).standard_normal((2, 9, 4))
    sink = np.array([0.5, -0.5])
    exact = R.sdpa_lse(q, k, v, sink=sink)
    with R.rounded_to("bfloat16"):
        plain = R.sdpa_lse(q, k, v, sink=sink)
    for a, b in zip(exact, plain):
        error = np.max(np.abs(a - b))
        assert 0 < error < 0.05, error


# --- variable lengths per batch element -----------------------------------------------

VARLEN_GRADIENT_CASES = [
    dict(kv_lengths=[5, 2]),
    dict(q_lengths=[3, 1], kv_lengths=[4, 5]),
    dict(q_lengths=[2, 3], kv_lengths=[5, 3], causal="bottom_right"),
    dict(q_lengths=[3, 2], kv_lengths=[4, 5], causal="top_left", window=(1, None)),
    dict(q_lengths=[3, 3], kv_lengths=[3, 5], causal="bottom_right", mask="random"),
]


@pytest.mark.parametrize("params", VARLEN_GRADIENT_CASES,
                         ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_varlen_sdpa_vjp_matches_finite_differences(params):
    params = dict(params)
    q, k, v = (rng(s).standard_normal(shape) for s, shape in
               ((11, (2, 2, 3, 4)), (12, (2, 1, 5, 4)), (13, (2, 1, 5, 3))))
    if params.get("mask") == "random":
        params["mask"] = rng(14).random_sample((2, 1, 3, 5)) < 0.7
        params["mask"][..., 0] = True
    d_out = rng(15).standard_normal((2, 2, 3, 3))
    grads = R.sdpa_vjp(q, k, v, d_out, **params)
    numeric = _finite_differences(lambda: float(np.sum(R.sdpa(q, k, v, **params) * d_out)),
                                  [q, k, v])
    for name, got, want in zip("qkv", grads, numeric):
        assert got.shape == want.shape, name
        assert np.allclose(got, want, rtol=1e-6, atol=1e-7), (name, np.max(np.abs(got - want)))


def test_varlen_is_each_batch_element_on_its_own_lengths():
    """Batch element b computed alone on its first q_lengths[b] queries and kv_lengths[b]
    keys (bottom-right offset of its own lengths); padded query rows are 0."""
    q, k, v = (rng(s).standard_normal(shape) for s, shape in
               ((21, (3, 2, 4, 3)), (22, (3, 2, 6, 3)), (23, (3, 2, 6, 2))))
    q_lengths, kv_lengths = [4, 2, 1], [6, 3, 2]
    for causal in (None, "top_left", "bottom_right"):
        out = R.sdpa(q, k, v, causal=causal, q_lengths=q_lengths, kv_lengths=kv_lengths)
        for b, (lq, lk) in enumerate(zip(q_lengths, kv_lengths)):
            alone = R.sdpa(q[b, :, :lq], k[b, :, :lk], v[b, :, :lk], causal=causal)
            assert np.allclose(out[b, :, :lq], alone, rtol=1e-14, atol=1e-15), (causal, b)
            assert np.all(out[b, :, lq:] == 0)


def test_varlen_hand_values_and_padding_never_read():
    """One key allowed: the output is that value; NaN in padded queries, keys and values
    (masked_*_nan ignored) changes nothing."""
    q, k = np.zeros((2, 2, 2)), np.zeros((2, 3, 2))
    v = np.arange(12.0).reshape(2, 3, 2)
    out = R.sdpa(q, k, v, q_lengths=[1, 2], kv_lengths=[1, 3])
    assert out[0].tolist() == [[0.0, 1.0], [0.0, 0.0]]
    assert np.allclose(out[1], [[8.0, 9.0], [8.0, 9.0]], rtol=1e-15)
    q2, k2, v2 = q.copy(), k.copy(), v.copy()
    q2[0, 1], k2[0, 1:], v2[0, 1:] = np.nan, np.nan, np.nan
    assert np.array_equal(R.sdpa(q2, k2, v2, q_lengths=[1, 2], kv_lengths=[1, 3]), out)
    q3 = q.copy()
    q3[0, 1] = np.nan                                # a padded query: its d_out is ignored
    dq, dk, dv = R.sdpa_vjp(q3, k, v, np.ones((2, 2, 2)), q_lengths=[1, 2], kv_lengths=[1, 3])
    assert np.all(dq[0, 1] == 0) and np.all(dk[0, 1:] == 0) and np.all(dv[0, 1:] == 0)
    assert dv[0, 0].tolist() == [1.0, 1.0]          # only the valid query's d_out
    assert np.all(np.isfinite(dk)) and np.all(np.isfinite(dq))


def test_varlen_kv_length_zero_is_a_fully_masked_row():
    q, k, v = (rng(s).standard_normal((2, 3, 4)) for s in (31, 32, 33))
    for choice, want in (("zeros", 0.0), ("uniform", v[0].mean(axis=0)), ("nan", np.nan)):
        out = R.sdpa(q, k, v, kv_lengths=[0, 3], policies={"fully_masked_rows": choice})
        assert np.allclose(out[0], np.broadcast_to(want, (3, 4)), equal_nan=True), choice


def test_varlen_blockwise_result_does_not_depend_on_block_size(monkeypatch):
    q, k, v = (rng(s).standard_normal(shape) for s, shape in
               ((41, (2, 37, 8)), (42, (2, 41, 8)), (43, (2, 41, 5))))
    d_out = rng(44).standard_normal((2, 37, 5))
    params = dict(causal="bottom_right", q_lengths=[30, 37], kv_lengths=[33, 17])
    whole = R.sdpa(q, k, v, **params), R.sdpa_vjp(q, k, v, d_out, **params)
    monkeypatch.setattr(R, "BLOCK", 5)
    blocked = R.sdpa(q, k, v, **params), R.sdpa_vjp(q, k, v, d_out, **params)
    assert np.allclose(whole[0], blocked[0], rtol=1e-14, atol=1e-15)
    for a, b in zip(whole[1], blocked[1]):
        assert np.allclose(a, b, rtol=1e-12, atol=1e-14)
