"""Each finding listed for tinygrad in backends/expected_failures/tinygrad.yaml (and what
its adapter declares of it) reproduced directly with tinygrad's own ops, not through the
adapter, and compared with a float64 NumPy computation.

Every test asserts that the difference exists: when tinygrad changes, its test fails
here, and the declaration it justifies is to be revisited. Skipped where tinygrad is
not installed (the tinygrad tox environment runs it).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from test_runtime_findings import _qkv


@pytest.fixture(scope="module")
def Tensor():
    """tinygrad's Tensor, compiling in this process as the adapter does (PARALLEL=0: no
    pool of spawned workers), or skip."""
    os.environ.setdefault("PARALLEL", "0")
    return pytest.importorskip("tinygrad").Tensor


def _softmax64(x):
    """softmax in float64 NumPy, as the specification computes it: exp(x - max) / sum."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


def test_softmax_over_one_element_is_folded_to_one(Tensor):
    """Tensor.softmax over an axis of one element is 1 whatever the element: tinygrad
    folds x - max(x) to 0 for a single element, so -inf, inf and NaN give 1 where
    exp(x - max) / sum is NaN (0/0, inf - inf, NaN)."""
    for x in (-np.inf, np.inf, np.nan):
        want = _softmax64([[x]])
        got = Tensor(np.array([[x]])).softmax(-1).numpy()
        assert np.isnan(want).all() and got.tolist() == [[1.0]], (x, got)
    # two elements are not folded: a row of -inf is NaN, as in float64 NumPy
    got = Tensor(np.array([[-np.inf, -np.inf]])).softmax(-1).numpy()
    assert np.isnan(got).all() and np.isnan(_softmax64([[-np.inf, -np.inf]])).all()


def test_a_query_whose_only_key_is_masked_reads_that_key(Tensor):
    """scaled_dot_product_attention over one key that the mask disallows returns that
    key's value (its softmax over one logit, -inf, is folded to 1), where every other
    Lk gives NaN, the choice tinygrad makes for an empty row (fully_masked_rows: nan).
    The expected failure causal-bottom-right-more-queries-than-keys (Lq 3, Lk 1: queries
    0 and 1 see no key) is this call: the adapter gives bottom-right causal as this mask."""
    q, k, v = _qkv(0, lq=3, lk=1)
    masked = np.zeros((3, 1), dtype=bool)
    out = Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v),
                                                 attn_mask=Tensor(masked)).numpy()
    np.testing.assert_array_equal(out, np.broadcast_to(v, out.shape))
    with np.errstate(invalid="ignore"):
        want = _softmax64(np.full((3, 1), -np.inf)) @ v      # 0/0: NaN
    assert np.isnan(want).all()
    # the same empty rows over two keys are NaN, the declared policy
    q, k, v = _qkv(0, lq=3, lk=2)
    out = Tensor(q).scaled_dot_product_attention(
        Tensor(k), Tensor(v), attn_mask=Tensor(np.zeros((3, 2), dtype=bool))).numpy()
    assert np.isnan(out).all()


def test_an_all_neg_inf_bias_on_one_key_reads_that_key(Tensor):
    """The same fold with a float bias of -inf on the only key (neg_inf_bias_rows: nan
    for every other Lk): the query gets V0."""
    q, k, v = _qkv(1, lq=2, lk=1)
    bias = np.full((2, 1), -np.inf)
    out = Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v),
                                                 attn_mask=Tensor(bias)).numpy()
    np.testing.assert_array_equal(out, np.broadcast_to(v, out.shape))
    assert np.isnan(_softmax64(bias)).all()          # -inf - -inf: NaN in float64
