"""fp8 and mixed dtypes (docs/interface.md, "fp8 inputs and descale factors", "Mixed
dtypes"): the dtype table's rule, the reference's descales against values by hand, the
inputs as a backend receives them, the tolerance of an fp8 kernel (FA3's: P rounded to
the format) met by such a kernel, and the spec errors of a case that misuses them."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from attention_conformance.backend.calling import cast_inputs, checked_outputs
from attention_conformance.backend.in_process import InProcess
from attention_conformance.backends import rules
from attention_conformance.backends.numpy import NumpyBackend
from attention_conformance.checking.verdict import case_inputs, run_case
from attention_conformance.golden import reference as R
from attention_conformance.golden.store import GoldenStore
from attention_conformance.model.dtypes import (DTYPES, input_dtype, numpy_dtype, output_dtype,
                                                rounded_and_cast, round_to)
from attention_conformance.model.errors import CheckFailure

from _real_spec import real_spec


def test_quantizing_saturates_at_the_largest_finite_value_and_keeps_nan():
    x = np.array([1000.0, -500.0, 464.0, 0.3, np.nan])
    assert round_to(x, "float8_e4m3fn")[:4].tolist() == [448.0, -448.0, 448.0, 0.3125]
    assert np.isnan(round_to(x, "float8_e4m3fn")[4])
    assert round_to([1e6, -1e6], "float8_e5m2").tolist() == [57344.0, -57344.0]


def test_rounding_and_casting_at_once_gives_round_to_and_its_cast():
    """Saturation, overflow to inf, NaN of either sign, -0.0 and subnormals of every
    dtype: one cast (rounded_and_cast) gives the bits of round_to and a cast of it."""
    x = np.array([1000.0, -500.0, 464.0, 0.3, np.nan, -np.nan, np.inf, -np.inf, -0.0,
                  1e6, 70000.0, 3.5e38, 1e-8, -3e-41, 5e-324, 2.0**-20, 1 + 2.0**-9])
    for name in DTYPES:
        exact, cast = rounded_and_cast({"x": x, "m": x > 1}, {"x": name, "m": name})
        assert exact["x"].tobytes() == round_to(x, name).tobytes(), name
        assert cast["x"].dtype == numpy_dtype(name), name
        assert cast["x"].tobytes() == round_to(x, name).astype(numpy_dtype(name)).tobytes()
        assert exact["m"] is cast["m"] and exact["m"].tolist() == (x > 1).tolist()


def test_each_input_and_output_has_the_dtype_of_the_rule():
    assert input_dtype("float8_e4m3fn", "q") == "float8_e4m3fn"
    assert input_dtype("float8_e4m3fn", "k_pages") == "float8_e4m3fn"
    assert input_dtype("float8_e4m3fn", "bias") == "float32"
    assert input_dtype("bfloat16", "k_descale") == "float32"
    assert input_dtype("bfloat16", "bias", "float32") == "float32"
    assert input_dtype("float8_e5m2", "q", "bfloat16") == "bfloat16"
    assert output_dtype("float8_e5m2") == "float32" and output_dtype("float16") == "float16"


def test_descales_per_batch_and_kv_head_scale_each_head_by_hand():
    """k[b, h] and v[b, h] times their descale; query head h of a group of 2 reads column
    h // 2 of q_descale (FA3's convention)."""
    rng = np.random.RandomState(3)
    q, k, v = rng.randn(2, 4, 3, 5), rng.randn(2, 2, 6, 5), rng.randn(2, 2, 6, 4)
    dq, dk, dv = (rng.uniform(0.5, 2, (2, 2)) for _ in range(3))
    got = R.sdpa(q, k, v, q_descale=dq, k_descale=dk, v_descale=dv)
    q_heads = np.repeat(dq, 2, axis=1)[..., None, None]
    want = R.sdpa(q * q_heads, k * dk[..., None, None], v * dv[..., None, None])
    assert np.allclose(got, want, atol=1e-14)
    one = R.sdpa(q, k, v, q_descale=[0.5], k_descale=[2.0], v_descale=[3.0])
    assert np.allclose(one, 3.0 * R.sdpa(q, k, v), atol=1e-13)


def test_paged_descales_apply_to_each_sequence_as_read_from_the_pages():
    rng = np.random.RandomState(4)
    q, pages = rng.randn(2, 2, 1, 4), rng.randn(3, 2, 1, 4)
    dk = np.array([[2.0], [0.5]])
    got = R.paged_sdpa(q, pages, pages, block_table=[[0, 1], [2]], kv_lengths=[3, 2],
                       k_descale=dk, v_descale=dk)
    for b, (row, n) in enumerate((([0, 1], 3), ([2], 2))):
        k = R.read_pages(pages, [row], [n])[0] * dk[b, 0]
        assert np.allclose(got[b], R.sdpa(q[b], k, k), atol=1e-14)


def test_rules_dequantize_matches_the_reference():
    x = round_to(np.random.RandomState(5).randn(2, 4, 3, 8) * 40, "float8_e4m3fn")
    d = np.array([[0.25, 0.5], [1.0, 2.0]])
    stored = x.astype(ml_dtypes.float8_e4m3fn)
    assert np.allclose(rules.dequantize(stored, d), R.dequantized(x, d), rtol=1e-7)


@pytest.fixture(scope="module")
def spec():
    return real_spec()


def _items(spec, topic):
    return [(c, v, d) for c in spec.cases if c.topic == topic and c.profile == "quick"
            for v in c.variants for d in c.dtypes]


def test_the_backend_receives_fp8_operands_float32_descales_and_a_bfloat16_query(spec):
    case = next(c for c in spec.cases if c.id == "fp8-kv-cache-half-query")
    _, arrays = case_inputs(case, case.variants[0], "float8_e4m3fn")
    kinds = {name: a.dtype.name for name, a in arrays.items()}
    assert kinds == {"q": "bfloat16", "k_pages": "float8_e4m3fn", "v_pages": "float8_e4m3fn",
                     "k_descale": "float32", "v_descale": "float32"}
    mixed = next(c for c in spec.cases if c.id == "float32-bias-half-inputs")
    _, arrays = case_inputs(mixed, mixed.variants[0], "bfloat16")
    assert arrays["bias"].dtype == np.float32 and arrays["q"].dtype == ml_dtypes.bfloat16
    assert cast_inputs({"x": np.ones(2)}, "float16")["x"].dtype == np.float16


def test_an_fp8_output_must_be_float32(spec):
    case = next(c for c in spec.cases if c.id == "fp8-descale-per-tensor")
    _, arrays = case_inputs(case, case.variants[0], "float8_e5m2")
    out = NumpyBackend().sdpa(**arrays)
    assert out.dtype == np.float32
    checked_outputs("sdpa", (out,), arrays, {}, "float8_e5m2")
    with pytest.raises(CheckFailure, match="expected float32"):
        checked_outputs("sdpa", (out.astype(ml_dtypes.float8_e5m2),), arrays, {}, "float8_e5m2")


class _PRoundedToFp8(NumpyBackend):
    """An fp8 kernel as FA3 computes: float32, the weights P rounded to the format."""

    name = "p-rounded-to-fp8"

    def sdpa(self, q, k, v, *, q_descale=None, k_descale=None, v_descale=None, o_scale=None,
             **params):
        fmt = next((x.dtype for x in (k, q) if x.dtype.name in rules.FP8), None)
        q, k, v = (rules.dequantize(x, d) for x, d in
                   zip((q, k, v), (q_descale, k_descale, v_descale)))
        probe = np.eye(k.shape[-2], dtype=np.float32)
        p = NumpyBackend.sdpa(self, q, k, np.broadcast_to(probe, k.shape[:-1] + probe.shape[-1:]),
                              **params)
        p = np.nan_to_num(p).astype(fmt).astype(np.float32)
        heads = q.shape[-3] // v.shape[-3]
        out = (p @ np.repeat(v, heads, axis=-3)).astype(np.float32)
        return out if o_scale is None else rules.scaled_output(out, o_scale, fmt.name)


def test_a_kernel_that_rounds_p_to_the_format_passes_every_fp8_sdpa_case(spec):
    golden, backend = GoldenStore(), InProcess(_PRoundedToFp8())
    for case, variant, dtype in _items(spec, "fp8"):
        if case.op == "sdpa":
            run_case(backend, case, variant, dtype, golden)
