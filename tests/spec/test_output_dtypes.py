"""The dtype of each output (docs/interface.md, "Log-sum-exps beside half outputs"): an
lse, and merge_states' lses, float32 beside float16 and bfloat16; the check rejects an
lse returned in half precision, and the built-in NumPy and torch adapters return it so."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from attention_conformance.backend.calling import checked_outputs
from attention_conformance.backends import rules
from attention_conformance.backends.numpy import NumpyBackend
from attention_conformance.model.dtypes import input_dtype, output_dtype
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
