"""The scale profile's machinery: the sampled golden's rows (and the backward's key
columns), the blocked reference (the same values as reference.py, only the keys a block
sees computed), the sampled backward (reference.sdpa_vjp's values at its rows and
columns), validation from the shapes alone, min_memory_gb, and the NumPy backend (its
forward and backward passes) block by block."""

from __future__ import annotations

import numpy as np
import pytest

from attention_conformance.backends import numpy as numpy_backend
from attention_conformance.backends import rules
from attention_conformance.golden import blocks, compute, reference, sampled, sampled_vjp
from attention_conformance.model.errors import Unsupported
from attention_conformance.specs import validation

from attention_conformance.model.folder import default_folder
from attention_conformance.specs.loader import load_file

RNG = np.random.RandomState(7)


def scale_cases() -> dict:
    """The cases of spec/cases/scale.yaml, loaded alone (validated from their shapes)."""
    cases, errors = load_file(default_folder().cases_dir / "scale.yaml")
    assert not errors, errors
    return {case.id: case for case in cases}
CALLS = [  # (params, q shape, k shape)
    ({}, (2, 3, 150, 8), (2, 3, 220, 8)),
    ({"causal": "top_left"}, (1, 4, 300, 8), (1, 2, 300, 8)),
    ({"causal": "bottom_right", "window": (40, 3)}, (1, 2, 200, 8), (1, 1, 500, 8)),
    ({"causal": "bottom_right"}, (1, 1, 300, 8), (1, 1, 120, 8)),      # Lq > Lk: empty rows
    ({"window": (20, None)}, (2, 1, 260, 8), (2, 1, 260, 8)),
]


def _inputs(q_shape, k_shape):
    q, k, v = RNG.randn(*q_shape), RNG.randn(*k_shape), RNG.randn(*k_shape)
    return q, k, v, RNG.rand(q_shape[-2], k_shape[-2]) > 0.2, RNG.randn(k_shape[-2])


def test_the_sampled_rows_are_the_boundaries_and_a_seeded_sample():
    rows = sampled.sampled_rows(131072, seed=5)
    assert list(rows) == sorted(set(rows)) and rows[0] == 0 and rows[-1] == 131071
    for power in range(10, 17):
        assert {2 ** power - 1, 2 ** power} <= set(rows)
    assert {63, 64, 127, 128, 65535, 65536, 65537} <= set(rows)
    assert len(rows) < 80 and np.array_equal(rows, sampled.sampled_rows(131072, seed=5))
    assert not np.array_equal(rows, sampled.sampled_rows(131072, seed=6))
    assert list(sampled.sampled_rows(4, seed=1)) == list(range(4))
    decode = sampled.sampled_rows(64, seed=1)          # a few queries: a quarter drawn
    assert {0, 63} <= set(decode) and len(decode) <= 2 + 16
    assert f"{len(rows)} sampled query rows of 131,072 (0, " in sampled.describe_rows(rows, 131072)


@pytest.mark.parametrize("params,q_shape,k_shape", CALLS)
def test_the_blocked_reference_is_the_reference(params, q_shape, k_shape):
    q, k, v, mask, bias = _inputs(q_shape, k_shape)
    for extra in ({}, {"mask": mask}, {"bias": bias, "softcap": 4.0},
                  {"sink": RNG.randn(q_shape[1])}):
        for policy in (None, {"fully_masked_rows": "uniform"}):
            want = reference.sdpa_lse(q, k, v, **params, **extra, policies=policy)
            got = blocks.sdpa_rows(q, k, v, **params, **extra, policies=policy)
            rows = np.array([0, 1, 63, 64, q_shape[-2] - 1])
            some = blocks.sdpa_rows(q, k, v, rows=rows, **params, **extra, policies=policy)
            for a, b, c in zip(want, got, some):
                np.testing.assert_allclose(b, a, atol=1e-13, rtol=0)
                np.testing.assert_allclose(c, a[..., rows, :] if a.ndim == b.ndim and
                                           a.shape[-1] == q_shape[-1] else a[..., rows],
                                           atol=1e-13, rtol=0)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_the_blocked_plain_error_is_the_references_size(dtype):
    """The plain computation over the keys each block sees (in float32, float32's own
    arithmetic) lands as far from the golden as reference.py's over every key: the
    tolerance rule is the same."""
    q, k, v, mask, _ = _inputs((1, 4, 300, 16), (1, 2, 300, 16))
    for params in ({"causal": "top_left"}, {"mask": mask, "window": (40, 2)}):
        gold = reference.sdpa(q, k, v, **params)
        with reference.rounded_to(dtype):
            plain = np.max(np.abs(reference.sdpa(q, k, v, **params) - gold))
            blocked = np.max(np.abs(blocks.sdpa(q, k, v, **params) - gold))
        assert plain / 3 < blocked < plain * 3, (params, plain, blocked)


def test_a_block_skips_the_keys_causal_and_a_window_hide():
    blocks.reset_stats()
    q, k, v, _, _ = _inputs((1, 1, 2048, 4), (1, 1, 2048, 4))
    blocks.sdpa_rows(q, k, v, causal="top_left", window=(63, 0))
    assert blocks.reset_stats()["exact"]["scores"] < 2048 * 64 * 3      # not 2048 * 2048
    assert rules.key_range(100, 110, 200, 200, "top_left", (15, 0)) == (85, 110)
    assert rules.key_range(0, 5, 10, 40, "bottom_right") == (0, 35)


@pytest.mark.parametrize("params,q_shape,k_shape", CALLS)
def test_the_numpy_backward_block_by_block_is_the_numpy_backward(params, q_shape, k_shape,
                                                                 monkeypatch):
    q, k, v, mask, bias = _inputs(q_shape, k_shape)
    d_out, backend = RNG.randn(*q_shape), numpy_backend.NumpyBackend()
    for extra in ({}, {"mask": mask}, {"bias": bias, "softcap": 4.0}):
        whole = backend.sdpa_vjp(q, k, v, d_out, **params, **extra)
        with monkeypatch.context() as patch:
            patch.setattr(numpy_backend, "BLOCKED_ABOVE", 0)
            patch.setattr(numpy_backend, "BLOCK_ELEMENTS", 3000)
            blocked = backend.sdpa_vjp(q, k, v, d_out, **params, **extra)
        for a, b in zip(whole, blocked):
            np.testing.assert_allclose(b, a, atol=1e-12, rtol=0)


@pytest.mark.parametrize("params,q_shape,k_shape", CALLS)
def test_the_numpy_backend_block_by_block_is_the_numpy_backend(params, q_shape, k_shape,
                                                                 monkeypatch):
    q, k, v, mask, bias = _inputs(q_shape, k_shape)
    backend = numpy_backend.NumpyBackend()
    for extra in ({}, {"mask": mask}, {"bias": bias, "softcap": 4.0}):
        whole = backend.sdpa_lse(q, k, v, **params, **extra)
        with monkeypatch.context() as patch:
            patch.setattr(numpy_backend, "BLOCKED_ABOVE", 0)
            patch.setattr(numpy_backend, "BLOCK_ELEMENTS", 3000)
            blocked = backend.sdpa_lse(q, k, v, **params, **extra)
        for a, b in zip(whole, blocked):
            np.testing.assert_allclose(b, a, atol=1e-12, rtol=0)


def test_an_op_that_materializes_the_scores_refuses_what_the_machine_cannot_hold():
    with pytest.raises(NotImplementedError, match="unsupported by size: 6 score matrices"):
        rules.check_size("numpy sdpa_vjp", (1, 8, 131072, 64), (1, 2, 131072, 64), copies=6,
                         memory=24 * 10 ** 9)
    rules.check_size("numpy", (1, 8, 1024, 64), (1, 2, 1024, 64), memory=24 * 10 ** 9)
    assert rules.score_shape((3, 8, 5, 4), (1, 2, 7, 4)) == (3, 8, 5, 7)


def test_a_scale_case_is_validated_from_its_shapes_alone(monkeypatch):
    scale = list(scale_cases().values())
    assert len(scale) >= 10 and all(c.profile == "scale" for c in scale)

    def refuse(*args, **kwargs):
        raise AssertionError("a scale case's inputs were made while validating it")
    monkeypatch.setattr(validation, "build_inputs", refuse)
    for case in scale:
        assert validation.static_errors(case, {"float32", "bfloat16", "float16"}) == []
    arrays = validation.stand_ins(scale[0], scale[0].variants[0])
    assert all(a.strides == (0,) * a.ndim for a in arrays.values())


def test_sampled_is_for_live_cases_of_sdpa_and_its_gradients():
    case = scale_cases()["scale-prefill-causal"]
    quick = type(case)(**{**case.__dict__, "profile": "quick"})
    assert "golden data are computed live" in validation._check_sampled(quick)[0]
    weights = type(case)(**{**case.__dict__, "op": "attention_weights"})
    assert "not of attention_weights" in validation._check_sampled(weights)[0]
    vjp = scale_cases()["scale-vjp-prefill-causal"]
    assert validation._check_sampled(vjp) == []
    biased = type(vjp)(**{**vjp.__dict__, "inputs": {**vjp.inputs, "bias": {}}})
    assert "takes no bias or sink" in validation._check_sampled(biased)[0]


@pytest.mark.parametrize("params,q_shape,k_shape", CALLS + [
    ({"causal": "top_left"}, (4, 300, 8), (2, 300, 8)),            # no batch dim
    ({"causal": "top_left"}, (2, 4, 300, 8), (1, 2, 300, 8))])     # a broadcast batch
def test_the_sampled_backward_is_the_reference_at_its_rows_and_columns(params, q_shape,
                                                                        k_shape):
    """dq at the rows, dk and dv at the columns: reference.sdpa_vjp's values there, and
    under rounded_to a plain error of the reference's own size (its roundings are a
    subset of the reference's: 0.05 to 1.5 times its error over whole outputs; a
    maximum over a few positions varies more, either way)."""
    rng = np.random.RandomState(11)
    q, k, v, d_out = rng.randn(*q_shape), rng.randn(*k_shape), rng.randn(*k_shape), rng.randn(*q_shape)
    mask = rng.rand(q_shape[-2], k_shape[-2]) > 0.2
    rows, columns = np.array([0, 1, 63, 64, q_shape[-2] - 1]), np.array([0, 5, 64, k_shape[-2] - 1])
    for extra in ({}, {"mask": mask}, {"softcap": 4.0}):
        want = reference.sdpa_vjp(q, k, v, d_out, **params, **extra)
        got = sampled_vjp.sdpa_vjp(q, k, v, d_out, rows=rows, columns=columns, **params, **extra)
        np.testing.assert_allclose(got[0], want[0][..., rows, :], atol=1e-12, rtol=0)
        for gradient, whole in zip(got[1:], want[1:]):
            np.testing.assert_allclose(gradient, whole[..., columns, :], atol=1e-12, rtol=0)
        every = np.arange(q_shape[-2]), np.arange(k_shape[-2])
        with reference.rounded_to("float16"):
            plain = reference.sdpa_vjp(q, k, v, d_out, **params, **extra)
            ours = sampled_vjp.sdpa_vjp(q, k, v, d_out, rows=every[0], columns=every[1],
                                        **params, **extra)
        for a, b, gold in zip(plain, ours, want):
            theirs, mine = np.max(np.abs(a - gold)), np.max(np.abs(b - gold))
            assert theirs / 100 < mine < theirs * 2, (extra, theirs, mine)


def test_the_sampled_columns_are_the_rows_rule_over_the_keys():
    case = scale_cases()["scale-vjp-decode-gqa"]
    variant = case.variants[0]
    arrays = {"q": np.empty((1, 8, 16, 1)), "k": np.empty((1, 2, 262144, 1))}
    columns, lk = sampled.positions_for(case, variant, "dk", arrays)
    rows, lq = sampled.positions_for(case, variant, "dq", arrays)
    assert (lk, lq) == (262144, 16) and {0, 1023, 1024, 65535, 65536, 65537, 262143} <= set(columns)
    assert np.array_equal(rows, sampled.rows_for(case, variant, 16))
    assert "sampled key columns of 262,144 (0, " in sampled.describe("dv", columns, lk)


def test_a_case_larger_than_the_machine_is_unsupported_by_size(monkeypatch):
    case = scale_cases()["scale-gpu-mask-past-2-31"]
    monkeypatch.setattr(compute, "machine_memory_gb", lambda: 24.0)
    with pytest.raises(Unsupported, match=r"unsupported by size: case scale-gpu-mask-past-2-31 "
                       r"needs 64 GB of memory \(min_memory_gb\), this machine has 24.0 GB"):
        compute.generated_inputs(case, case.variants[0])


def test_a_sized_adapter_method_takes_the_keywords_it_took():
    import inspect

    class Adapter:
        name = "sized"

        @rules.sized()
        @rules.lengths_as_mask
        def sdpa(self, q, k, v, *, mask=None, causal=None, window=None):
            return np.zeros(np.shape(q))

    method = Adapter.sdpa
    assert "q_lengths" in inspect.signature(method, follow_wrapped=False).parameters
    assert "softcap" not in inspect.signature(method, follow_wrapped=False).parameters
    q = np.zeros((1, 1, 4, 2))
    assert Adapter().sdpa(q, q, q, causal="top_left").shape == q.shape
    big = np.broadcast_to(np.float32(0), (1, 1, 400_000, 2))
    with pytest.raises(NotImplementedError, match="sized sdpa: unsupported by size"):
        Adapter().sdpa(big, big, big)
