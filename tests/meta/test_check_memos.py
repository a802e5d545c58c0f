"""What the checks work out once per case (model/case.py memo) or once per test
(Context) is what working it out afresh gives: keyed by everything it depends on."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest

from _real_spec import real_spec
from attention_conformance.checking import expectations
from attention_conformance.checking.context import Context
from attention_conformance.checking.verdict import case_inputs
from attention_conformance.golden.compute import longest_reduction
from attention_conformance.model.dtypes import output_dtype, round_to
from attention_conformance.model.indexing import split_target
from attention_conformance.model.ops import OPS


def _case(op="sdpa", **params):
    """A fresh copy of a real case (its own memo), with these params."""
    case = next(c for c in real_spec().cases if c.op == op)
    return type(case)(**{**case.__dict__, "params": {**case.params, **params}})


VALUES = [0.1, -0.0, 0.0, 1e-30, 70000.0, math.nan, -math.inf, [0.1, 0.2], [[1.0], [-0.0]], 3,
          True, 0.1000000001]


@pytest.mark.parametrize("op,params", [("sdpa", {}), ("sdpa", {"o_scale": 0.5}),
                                       ("sdpa_lse", {})])
def test_an_exact_value_is_its_value_rounded_to_its_outputs_dtype(op, params):
    case = _case(op, **params)
    for dtype in ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn"):
        ctx = types.SimpleNamespace(case=case, dtype=dtype, params=case.params)
        for output in OPS[op].outputs:
            for value in VALUES * 2:            # the second time from the memo
                got = expectations.exact_value(ctx, value, (2,) + np.shape(value), output)
                want = round_to(np.array(value, np.float64), output_dtype(dtype, output,
                                                                          case.params))
                assert got.tobytes() == np.broadcast_to(want, got.shape).tobytes()
                assert not got.flags.writeable and not got.base.flags.writeable


def test_a_target_is_parsed_as_split_target_parses_it():
    case = _case("sdpa_lse")
    ctx = types.SimpleNamespace(case=case, outputs={"out": np.arange(24.0).reshape(2, 3, 4),
                                                    "lse": np.arange(6.0).reshape(2, 3)})
    for text in ("[0]", "out[1, :, -1]", "lse[..., 2]", "[0]", "[...]", "lse[1:, 0]"):
        output, index, selected = expectations.target(ctx, text)
        assert (output, index) == split_target(text, "out")
        assert np.array_equal(selected, ctx.outputs[output][index])
    with pytest.raises(ValueError):
        expectations.target(ctx, "out[x]")


def test_the_longest_reduction_of_a_test_is_its_inputs():
    for case in real_spec().cases[:40]:
        exact_inputs, arrays = case_inputs(case, case.variants[0], case.dtypes[0])
        ctx = Context(None, case, case.variants[0], case.dtypes[0], arrays, exact_inputs,
                      None, None, None)
        assert ctx.longest_reduction() == longest_reduction(exact_inputs)
        assert ctx.longest_reduction() == longest_reduction(exact_inputs)
