"""attention_conformance.backends.rules: the rules the adapters share (which keys a query
may see, lengths as one mask, the 4-D layout), checked against the interface's own
words, element by element, and the guide's example run as it is shown."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from _cli_support import cli
from attention_conformance.backends import rules

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "adding-a-backend.md"


def sees(i, j, lq, lk, causal, window) -> bool:
    """docs/interface.md, one query and one key: query i sits at p = i + (Lk - Lq under
    bottom_right, else 0); causal allows j <= p, a window p - left <= j <= p + right,
    a side None or negative being open."""
    p = i + (lk - lq if causal == "bottom_right" else 0)
    left, right = window if window is not None else (None, None)
    return ((causal is None or j <= p)
            and (left is None or left < 0 or j >= p - left)
            and (right is None or right < 0 or j <= p + right))


def test_importing_rules_imports_no_framework_and_nothing_of_the_suite():
    code = ("import sys, attention_conformance.backends.rules\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'jax', 'tensorflow', 'keras', 'paddle', 'onnx', 'onnxruntime')"
            " or m.startswith('attention_conformance.') and m not in "
            "('attention_conformance.backends', 'attention_conformance.backends.rules',"
            " 'attention_conformance.backends.absorbed',"
            " 'attention_conformance.backends._fp8',"
            " 'attention_conformance.backends._signature',"
            " 'attention_conformance.backends._outputs')))")  # rules' own, NumPy only
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


WINDOWS = [None, (0, 0), (1, None), (None, 2), (2, 1), (-1, 1), (3, -5)]


@pytest.mark.parametrize("causal, window",
                         list(itertools.product(rules.CAUSAL, WINDOWS)))
def test_allowed_is_the_rule_of_the_interface(causal, window):
    for lq, lk in [(1, 1), (3, 3), (2, 5), (5, 2), (4, 0), (0, 3)]:
        got = rules.allowed(lq, lk, causal, window)
        if causal is None and window is None:
            assert got is None
            continue
        want = np.array([[sees(i, j, lq, lk, causal, window) for j in range(lk)]
                         for i in range(lq)], dtype=bool).reshape(lq, lk)
        assert got.dtype == bool and np.array_equal(got, want), (lq, lk)


def test_an_unknown_causal_alignment_is_refused():
    with pytest.raises(ValueError, match="causal must be one of"):
        rules.allowed(2, 2, "bottom_left")


@pytest.mark.parametrize("causal, window", [(None, None), ("top_left", None),
                                            ("bottom_right", None), ("bottom_right", (1, 0)),
                                            (None, (0, 1))])
def test_compose_lengths_gives_each_batch_element_its_own_problem(causal, window):
    q_lengths, kv_lengths = [3, 1, 0, 2], [5, 2, 3, 0]
    lq, lk = 4, 6
    mask = np.random.default_rng(0).random((4, 1, lq, lk)) < 0.8
    got, padded = rules.compose_lengths((4, 2, lq, 8), (4, 2, lk, 8), mask, causal, window,
                                        q_lengths, kv_lengths)
    assert got.shape == (4, 1, lq, lk) and padded.shape == (4, 1, lq, 1)
    for b, (ql, kl) in enumerate(zip(q_lengths, kv_lengths)):
        for i, j in itertools.product(range(lq), range(lk)):
            if i >= ql:            # padded: the valid keys, every key when there is none
                want = j < kl or kl == 0
            else:                  # the element alone: its own ql queries and kl keys
                want = j < kl and mask[b, 0, i, j] and sees(i, j, ql, kl, causal, window)
            assert got[b, 0, i, j] == want, (b, i, j)
        assert np.array_equal(padded[b, 0, :, 0], np.arange(lq) >= ql)


def test_lengths_that_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="do not fit"):
        rules.compose_lengths((2, 3, 4), (2, 5, 4), None, None, None, [1, 4], None)


def test_layout_folds_broadcast_batch_dims_and_grouped_heads_and_restores():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 1, 4, 3, 5))         # batch (2, 1), 4 query heads
    k = rng.standard_normal((3, 2, 6, 5))            # batch (3,), 2 kv heads
    v = rng.standard_normal((2, 6, 7))               # no batch
    mask = rng.random((1, 4, 1, 6)) < 0.5            # per query head, one row
    lay = rules.Layout(q, k, v, mask)
    assert (lay.batch, lay.b, lay.hq, lay.hkv, lay.lq, lay.lk) == ((2, 3), 6, 4, 2, 3, 6)
    fq, fk, fv = lay.fold(q, k, v, np.broadcast_to)
    assert (fq.shape, fk.shape, fv.shape) == ((6, 4, 3, 5), (6, 2, 6, 5), (6, 2, 6, 7))
    for b, (b0, b1) in enumerate(itertools.product(range(2), range(3))):
        assert np.array_equal(fq[b], q[b0, 0]) and np.array_equal(fk[b], k[b1])
        assert np.array_equal(fv[b], v)
    assert lay.scores(mask, np.broadcast_to).shape == (6, 4, 1, 6)
    assert lay.scores(mask, np.broadcast_to, every_row=True).shape == (6, 4, 3, 6)
    assert lay.scores(None, np.broadcast_to) is None
    out = np.arange(6 * 4 * 3 * 7).reshape(6, 4, 3, 7)
    assert np.array_equal(lay.restore(out), out.reshape(2, 3, 4, 3, 7))


def test_layout_restores_the_rank_of_the_inputs():
    q = np.zeros((3, 5))                             # rank 2: (L, D), one head
    lay = rules.Layout(q, q, q)
    fq, _, _ = lay.fold(q, q, q, np.broadcast_to)
    assert fq.shape == (1, 1, 3, 5) and lay.restore(fq).shape == (3, 5)


def test_layout_broadcasts_one_query_head_over_the_kv_heads():
    q, kv = np.zeros((2, 1, 3, 5)), np.zeros((2, 4, 6, 5))
    lay = rules.Layout(q, kv, kv)
    assert (lay.hq, lay.hkv) == (4, 4)
    assert lay.fold(q, kv, kv, np.broadcast_to)[0].shape == (2, 4, 3, 5)


def test_layout_refuses_heads_that_cannot_share():
    with pytest.raises(ValueError, match="3 query heads cannot share 2"):
        rules.Layout(np.zeros((3, 2, 4)), np.zeros((2, 2, 4)), np.zeros((2, 2, 4)))


def _masked_attention(q, k, v, mask=None, scale=None):
    """Plain attention that takes a boolean mask and nothing else, in q's dtype; a row
    without keys gets NaN (0/0): the guide's my_attention, as its policy says."""
    scale = q.dtype.type(1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    s = (q @ np.swapaxes(k, -1, -2)) * scale
    s = np.where(mask, s, q.dtype.type(-np.inf)) if mask is not None else s
    with np.errstate(invalid="ignore"):
        p = np.exp(s - np.max(s, axis=-1, keepdims=True))
        return (p / p.sum(axis=-1, keepdims=True)) @ v


def _guide_example() -> str:
    section = GUIDE.read_text().split("## Shared helpers: attention_conformance.backends.rules")[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_guide_example_certifies_lengths_through_a_mask_only_op():
    """The guide's adapter, run as shown: each batch element gets its own problem (its
    q_lengths[b] queries and kv_lengths[b] keys, bottom-right at its own offset), and a
    padded query's row is 0."""
    namespace = {"my_attention": _masked_attention}
    exec(_guide_example(), namespace)
    backend = namespace["MaskOnlyBackend"]()
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, 1, n, 3)) for n in (4, 5, 5))
    out = backend.sdpa(q, k, v, causal="bottom_right", q_lengths=[2, 4], kv_lengths=[5, 3])
    for b, (ql, kl) in enumerate([(2, 5), (4, 3)]):
        alone = np.array([[sees(i, j, ql, kl, "bottom_right", None) for j in range(kl)]
                          for i in range(ql)])
        want = _masked_attention(q[b, :, :ql], k[b, :, :kl], v[b, :, :kl], alone)
        assert np.allclose(out[b, :, :ql], want, equal_nan=True)
        assert not out[b, :, ql:].any()


def test_the_guide_example_certifies_with_no_failure(tmp_path):
    """The guide's MaskOnlyBackend, saved to a file with a plain my_attention and certified
    on the whole quick spec: what it does not implement is unsupported (a bias, a softcap,
    a sink: its sdpa takes none; grouped-query heads: NotImplementedError), never failed.
    It accepted a bias and a softcap and ignored them, and the lengths_as_mask wrapper's
    **params claimed a sink: 198 failed, 559 passed."""
    import inspect

    (tmp_path / "mask_only.py").write_text(
        "import numpy as np\n\n" + inspect.getsource(_masked_attention)
        + "my_attention = _masked_attention\n\n" + _guide_example())
    run = cli("certify", "mask_only.py:MaskOnlyBackend", "--report", tmp_path, "-q",
              cwd=tmp_path)
    data = json.loads((tmp_path / "mask-only.json").read_text())
    failed = [(r["id"], r["message"][:200]) for r in data["results"]
              if r["status"] not in ("pass", "unsupported")]
    assert run.returncode == 0 and not failed, (failed[:10], run.stdout[-2000:] + run.stderr)
    reasons = {r["message"] for r in data["results"] if r["status"] == "unsupported"}
    assert {"the backend's sdpa takes no bias", "the backend's sdpa takes no softcap",
            "the backend's sdpa takes no sink",
            "my_attention: no grouped-query heads"} <= reasons
    passed = {r["topic"] for r in data["results"] if r["status"] == "pass"}
    assert {"varlen", "masks", "causal", "documents", "block_sparse"} <= passed, passed


def test_fold_qv_makes_the_absorbed_form_plain_attention_over_wider_heads():
    rng = np.random.default_rng(3)
    q, qv = rng.standard_normal((3, 2, 4)), rng.standard_normal((3, 2, 6))
    k, v = rng.standard_normal((1, 5, 4)), rng.standard_normal((1, 5, 6))
    wide_q, wide_k, scale = rules.fold_qv(q, k, v, qv)
    assert scale == 1 / np.sqrt(10) and wide_q.shape == (3, 2, 10) and wide_k.shape == (1, 5, 10)
    assert np.allclose(wide_q @ wide_k.swapaxes(-1, -2), q @ k.swapaxes(-1, -2) + qv @ v.swapaxes(-1, -2))
    assert rules.fold_qv(q, k, v, qv, scale=0.5)[2] == 0.5
