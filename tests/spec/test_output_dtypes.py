"""The dtype of each output (docs/interface.md, "Log-sum-exps beside half outputs", "The
output scale"): an lse, and merge_states' lses, float32 beside float16 and bfloat16 (the
check rejects one returned in half precision; the NumPy and torch adapters return it
so); with an o_scale, out in the case's fp8 format, out / o_scale saturated, in the
reference, rules.scaled_output and torch's own cast alike."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from attention_conformance.backend.calling import checked_outputs
from attention_conformance.backends import rules
from attention_conformance.backends.numpy import NumpyBackend
from attention_conformance.golden import reference as R
from attention_conformance.model.dtypes import input_dtype, output_dtype, round_to
from attention_conformance.model.errors import CheckFailure

HALVES = ("float16", "bfloat16")


@pytest.mark.parametrize("dtype", HALVES)
def test_an_lse_beside_half_outputs_is_float32(dtype):
    assert output_dtype(dtype, "lse") == "float32" and output_dtype(dtype, "out") == dtype
    assert input_dtype(dtype, "lses") == "float32" and input_dtype(dtype, "outs") == dtype
    assert output_dtype("float64", "lse") == "float64"
    assert output_dtype("float8_e4m3fn", "lse") == "float32"
    assert rules.lse_dtype(np.dtype(ml_dtypes.bfloat16)) == np.float32
    assert rules.lse_dtype("float16") == np.float32 and rules.lse_dtype(np.float64) == np.float64


def _inputs(dtype):
    rng = np.random.RandomState(0)
    return {n: rng.randn(1, 2, 3, 4).astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
            for n in ("q", "k", "v")}


@pytest.mark.parametrize("dtype", HALVES)
def test_an_lse_returned_in_half_precision_fails_the_check(dtype):
    arrays = _inputs(dtype)
    out, lse = NumpyBackend().sdpa_lse(*arrays.values())
    assert out.dtype == arrays["q"].dtype and lse.dtype == np.float32
    checked_outputs("sdpa_lse", (out, lse), arrays, {}, dtype)
    with pytest.raises(CheckFailure, match="output lse has dtype .*, expected float32"):
        checked_outputs("sdpa_lse", (out, lse.astype(arrays["q"].dtype)), arrays, {}, dtype)


def test_merge_states_takes_and_returns_a_float32_lse_beside_half_outputs():
    outs = np.ones((2, 1, 3, 4), np.float16)
    lses = np.array([[[0.0, 1.0, -np.inf]], [[0.0, np.inf, -np.inf]]], np.float32)
    out, lse = NumpyBackend().merge_states(outs, lses)
    assert out.dtype == np.float16 and lse.dtype == np.float32
    assert lse[0].tolist() == [pytest.approx(np.log(2.0)), 1.0, -np.inf]


def test_torch_returns_a_float32_lse_beside_bfloat16():
    pytest.importorskip("torch")
    from attention_conformance.backends.torch import TorchBackend

    arrays = _inputs("bfloat16")
    out, lse = TorchBackend().sdpa_lse(*arrays.values())
    assert out.dtype == arrays["q"].dtype and lse.dtype == np.float32
    _, merged = TorchBackend().merge_states(np.stack([out, out]), np.stack([lse, lse]))
    assert merged.dtype == np.float32


# ---------------------------------------------------------------- the fp8 output scale


def test_an_output_scale_makes_out_the_case_fp8_format():
    assert output_dtype("float8_e4m3fn", "out", {"o_scale": 0.5}) == "float8_e4m3fn"
    assert output_dtype("float8_e5m2", "out", {}) == "float32"
    assert output_dtype("float8_e5m2", "lse", {"o_scale": 0.5}) == "float32"


def test_the_reference_divides_by_o_scale_saturates_in_the_format_and_rounds_when_plain():
    """Dequantized semantics: out_q * o_scale is the attention; past 448 (e4m3fn) the
    golden saturates; the plain computation rounds out / o_scale once to the format."""
    rng = np.random.RandomState(5)
    q, k = rng.randn(2, 3, 4), rng.randn(2, 5, 4)
    v = rng.randn(2, 5, 4) * 8
    out = R.sdpa(q, k, v)
    np.testing.assert_allclose(R.sdpa(q, k, v, o_scale=0.25), out / 0.25, rtol=1e-15)
    with R.output_format("float8_e4m3fn"):
        tiny = R.sdpa(q, k, v, o_scale=2.0 ** -9)
        assert np.abs(tiny).max() == 448.0 and np.all(np.abs(tiny) <= 448.0)
        with R.rounded_to("float32", weights="float8_e4m3fn"):
            plain = R.sdpa(q, k, v, o_scale=0.25)
    assert np.array_equal(plain, round_to(plain, "float8_e4m3fn"))
    assert np.abs(plain - out / 0.25).max() > 0


def test_rules_scaled_output_divides_saturates_and_rounds_once():
    out = np.array([1.0, 100.0, -1000.0, np.nan], np.float32)
    e4m3 = rules.scaled_output(out, 0.5, "float8_e4m3fn")
    assert e4m3.dtype == ml_dtypes.float8_e4m3fn
    assert e4m3[:3].astype(float).tolist() == [2.0, 192.0, -448.0] and np.isnan(float(e4m3[3]))
    assert rules.scaled_output(out, 0.5, "float8_e5m2")[:3].astype(float).tolist() == [
        2.0, 192.0, -2048.0]


def test_torch_writes_the_scaled_output_with_its_own_cast_bit_for_bit():
    pytest.importorskip("torch")
    from attention_conformance.backends import _torch_serving

    out = np.random.RandomState(7).randn(64).astype(np.float32) * 300
    for fmt in ("float8_e4m3fn", "float8_e5m2"):
        mine = _torch_serving.scaled_output(out, 0.75, fmt)
        assert mine.dtype.name == fmt
        assert mine.view(np.uint8).tobytes() == rules.scaled_output(out, 0.75, fmt).view(
            np.uint8).tobytes()
