"""Meta-tests of the checkers: each one can fail.

For every property, every statistic, the exact, golden and policy checkers (and judge,
which runs them all), a right output passes and a wrong one raises CheckFailure with a
message that says what is wrong. The table SCENARIOS drives it; test_every_checker_has_
a_scenario fails when a property or statistic is registered without one.

Right outputs are the float64 reference's (golden_compute.compute, rounded to the dtype),
or a correct backend's own; wrong outputs are a tampered copy of a right one, or the own
output of a backend with a planted bug (for the properties that call the backend again).
Golden data come from the reference too: the cases below are frozen into a temporary
spec folder by golden_freeze (tests/_cli_support.make_spec). scripts/mutate_checkers.py
turns each checker into a no-op in turn and shows that these tests then fail.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest

from attention_conformance.checking import expectations as checks
from attention_conformance.backends import rules
from attention_conformance.backends.numpy import NumpyBackend
from attention_conformance.backend.calling import cast_inputs, checked_outputs
from attention_conformance.backend.in_process import InProcess
from attention_conformance.checking.context import Context
from attention_conformance.model.dtypes import round_to
from attention_conformance.golden.compute import compute, rounded_inputs
from attention_conformance.golden.store import GoldenStore
from attention_conformance.model.errors import CheckFailure
from attention_conformance.checking.properties import PROPERTIES
from attention_conformance.model.folder import SpecFolder, default_folder
from attention_conformance.specs.loader import load_file, load_spec
from attention_conformance.checking.statistics import STATISTICS

from _cli_support import make_spec

META = """\
topic: meta
description: Small cases for the meta-tests of the checkers (tests/meta/test_checkers.py).
cases:
  - id: meta-weights-causal
    description: causal weights; the first query sees only itself
    source: tests/meta/test_checkers.py
    op: attention_weights
    inputs:
      q: {normal: {shape: [4, 8], seed: 1}}
      k: {normal: {shape: [4, 8], seed: 2}}
    params: {causal: top_left, scale: 0.5}
    dtypes: [float64, float32]
    expect:
      golden: true
      exact: {"[0]": [1, 0, 0, 0]}
      properties: [rows_sum_to_one, masked_weights_zero]
  - id: meta-softmax
    description: a softmax of spread scores
    source: tests/meta/test_checkers.py
    op: softmax
    inputs:
      x: {normal: {shape: [3, 6], seed: 3, std: 2.0}}
    dtypes: [float64, float32]
    expect:
      golden: true
      properties: [rows_sum_to_one, softmax_shift_invariant]
  - id: meta-sdpa-masked
    description: batched sdpa under a boolean mask that keeps key 0
    source: tests/meta/test_checkers.py
    op: sdpa
    inputs:
      q: {normal: {shape: [2, 5, 4], seed: 4}}
      k: {normal: {shape: [2, 6, 4], seed: 5}}
      v: {normal: {shape: [2, 6, 3], seed: 6}}
      mask: {bernoulli: {shape: [5, 6], seed: 7, p: 0.6, keep_first: true}}
    dtypes: [float64, float32]
    expect:
      golden: true
      properties: [permutation_equivariant, output_in_value_hull, finite]
  - id: meta-invariance
    description: a batch of two, to check the declared bitwise invariants
    source: tests/meta/test_checkers.py
    op: sdpa
    inputs:
      q: {normal: {shape: [2, 2, 6, 4], seed: 41}}
      k: {normal: {shape: [2, 2, 5, 4], seed: 42}}
      v: {normal: {shape: [2, 2, 5, 4], seed: 43}}
    params: {causal: bottom_right}
    dtypes: [float32]
    expect: {properties: [deterministic, batch_invariant, {split_invariant: {split: 3}}]}
  - id: meta-sdpa-causal
    description: causal sdpa, square
    source: tests/meta/test_checkers.py
    op: sdpa
    inputs:
      q: {normal: {shape: [6, 4], seed: 8}}
      k: {normal: {shape: [6, 4], seed: 9}}
      v: {normal: {shape: [6, 3], seed: 10}}
    params: {causal: top_left}
    dtypes: [float64]
    expect:
      golden: true
      properties: [causal_future_independent]
  - id: meta-identical-tokens
    description: queries 0 and 2 are the same token
    source: tests/meta/test_checkers.py
    op: sdpa
    inputs:
      q: {values: [[1.0, 2.0, 0.5], [0.3, -1.0, 2.0], [1.0, 2.0, 0.5], [-0.7, 0.2, 1.0]]}
      k: {normal: {shape: [5, 3], seed: 11}}
      v: {normal: {shape: [5, 2], seed: 12}}
    dtypes: [float64]
    expect:
      golden: true
      properties: [identical_tokens_identical_outputs]
  - id: meta-key-value-plain
    description: key-value attention with v = k
    source: tests/meta/test_checkers.py
    op: sdpa
    inputs:
      q: {normal: {shape: [4, 3], seed: 13}}
      k: {normal: {shape: [5, 3], seed: 14}}
      v: {same_as: k}
    dtypes: [float64]
    expect:
      golden: true
      properties: [key_value_equals_plain]
  - id: meta-column-form
    description: the row form equals the column form
    source: tests/meta/test_checkers.py
    op: sdpa
    inputs:
      q: {normal: {shape: [4, 3], seed: 15}}
      k: {normal: {shape: [5, 3], seed: 16}}
      v: {normal: {shape: [5, 2], seed: 17}}
    dtypes: [float64]
    expect:
      golden: true
      properties: [column_form_equals_row_form]
  - id: meta-exact-from-input
    description: under a causal mask the first output is v[0]
    source: tests/meta/test_checkers.py
    op: sdpa
    inputs:
      q: {normal: {shape: [4, 3], seed: 18}}
      k: {normal: {shape: [4, 3], seed: 19}}
      v: {normal: {shape: [4, 2], seed: 20}}
    params: {causal: top_left}
    dtypes: [float64, float32]
    expect:
      golden: true
      exact: {"[0]": {input: v, at: "[0]"}}
  - id: meta-close-softmax
    description: softmax of (5, 2, 1, 2) is about (0.8945, 0.0445, 0.0164, 0.0445)
    source: tests/meta/test_checkers.py
    op: softmax
    inputs:
      x: {values: [[5, 2, 1, 2]]}
    dtypes: [float64, float16]
    expect:
      golden: true
      close: {"[0]": {value: [0.8945, 0.0445, 0.0164, 0.0445], digits: 4}, "[0, 1]": {value: 0.04454, atol: 1.0e-4}}
  - id: meta-nan-row
    description: a NaN score makes its whole row NaN
    source: tests/meta/test_checkers.py
    op: softmax
    inputs:
      x: {normal: {shape: [3, 4], seed: 21}, set: [{at: "[1, 2]", value: .nan}]}
    dtypes: [float64]
    expect:
      golden: true
      exact: {"[1]": .nan}
  - id: meta-inf-scores
    description: an infinite query gives scores of +inf and -inf
    source: tests/meta/test_checkers.py
    op: scores
    inputs:
      q: {values: [[.inf, 1.0], [1.0, 2.0]]}
      k: {values: [[1.0, 0.5], [-2.0, 1.0], [0.5, -1.0]]}
    params: {kind: dot}
    dtypes: [float64]
    expect:
      golden: true
  - id: meta-empty-row-policy
    description: the second query may see no key
    source: tests/meta/test_checkers.py
    op: sdpa
    inputs:
      q: {normal: {shape: [3, 4], seed: 22}}
      k: {normal: {shape: [4, 4], seed: 23}}
      v: {normal: {shape: [4, 2], seed: 24}}
      mask: {values: [[true, true, false, true], [false, false, false, false], [true, false, true, true]]}
    dtypes: [float64]
    expect:
      policy:
        fully_masked_rows:
          zeros: {golden: true, exact: {"[1]": 0}}
          uniform: {golden: true}
          nan: {golden: true}
  - id: meta-nan-masked-key
    description: a NaN in key 3, masked for every query
    source: tests/meta/test_checkers.py
    op: sdpa
    inputs:
      q: {normal: {shape: [3, 4], seed: 25}}
      k: {normal: {shape: [4, 4], seed: 26}, set: [{at: "[3, :]", value: .nan}]}
      v: {normal: {shape: [4, 2], seed: 27}}
      mask: {full: {shape: [3, 4], value: true}, set: [{at: "[:, 3]", value: false}]}
    dtypes: [float64]
    expect:
      policy:
        masked_key_nan:
          ignored: {golden: true}
          propagates: {golden: true, exact: {"[...]": .nan}}
  - id: meta-nan-masked-key-vjp
    description: gradients with a NaN in element 1 of key 3, masked for every query
    source: tests/meta/test_checkers.py
    op: sdpa_vjp
    inputs:
      q: {normal: {shape: [3, 4], seed: 25}}
      k: {normal: {shape: [4, 4], seed: 26}, set: [{at: "[3, 1]", value: .nan}]}
      v: {normal: {shape: [4, 2], seed: 27}}
      d_out: {normal: {shape: [3, 2], seed: 28}}
      mask: {full: {shape: [3, 4], value: true}, set: [{at: "[:, 3]", value: false}]}
    dtypes: [float64]
    expect:
      policy:
        masked_key_nan:
          ignored: {golden: true}
          propagates: {exact: {"dq[:, 1]": .nan}}
  - id: meta-sdpa-long-half
    description: float16 sdpa over 256 keys, whose two tolerance tiers differ
    source: tests/meta/test_checkers.py
    op: sdpa
    inputs:
      q: {normal: {shape: [2, 8], seed: 29, std: 0.3}}
      k: {normal: {shape: [256, 8], seed: 30, std: 0.3}}
      v: {normal: {shape: [256, 4], seed: 31, mean: 4.0}}
    dtypes: [float16]
    expect:
      golden: true
  - id: meta-empty-row-policy-no-nan
    description: the second query may see no key; NaN is not allowed here
    source: tests/meta/test_checkers.py
    op: sdpa
    inputs:
      q: {normal: {shape: [3, 4], seed: 22}}
      k: {normal: {shape: [4, 4], seed: 23}}
      v: {normal: {shape: [4, 2], seed: 24}}
      mask: {values: [[true, true, false, true], [false, false, false, false], [true, false, true, true]]}
    dtypes: [float64]
    expect:
      policy:
        fully_masked_rows:
          zeros: {golden: true}
          uniform: {golden: true}
  - id: meta-sdpa-lse
    description: sdpa_lse with a sink; query 1 sees no key of the second half
    source: tests/meta/test_checkers.py
    op: sdpa_lse
    inputs:
      q: {normal: {shape: [2, 3, 4], seed: 31}}
      k: {normal: {shape: [2, 6, 4], seed: 32}}
      v: {normal: {shape: [2, 6, 3], seed: 33}}
      sink: {values: [0.5, -1.0]}
      mask: {values: [[true, true, true, true, true, true], [true, false, true, false, false, false], [false, true, false, true, true, false]]}
    dtypes: [float64]
    expect: {golden: true}
  - id: meta-cascade
    description: sdpa_lse of 2 requests over 6 keys, the first 4 a shared prefix
    source: tests/meta/test_checkers.py
    op: sdpa_lse
    inputs:
      q: {normal: {shape: [2, 2, 1, 4], seed: 34}}
      k: {normal: {shape: [2, 1, 6, 4], seed: 35}}
      v: {normal: {shape: [2, 1, 6, 3], seed: 36}}
    dtypes: [float64]
    expect: {golden: true}
  - id: meta-weights-mean
    description: weights over 8 keys have a mean of 1/8
    source: tests/meta/test_checkers.py
    op: attention_weights
    inputs:
      q: {normal: {shape: [4, 3], seed: 25}}
      k: {normal: {shape: [8, 3], seed: 26}}
    dtypes: [float64]
    expect:
      statistic:
        - name: mean
          expected: 0.125
          band: 1.0e-9
          why: "every row sums to 1 over 8 keys, so the mean is 1/8 up to rounding"
  - id: meta-varlen-padded-rows
    description: query lengths 4 and 2 of 4; padded query rows follow padded_query_rows
    source: tests/meta/test_checkers.py
    op: sdpa
    inputs:
      q: {normal: {shape: [2, 4, 3], seed: 27}}
      k: {normal: {shape: [2, 5, 3], seed: 28}}
      v: {normal: {shape: [2, 5, 2], seed: 29}}
    params: {q_lengths: [4, 2], kv_lengths: [5, 3]}
    dtypes: [float64]
    expect:
      policy:
        padded_query_rows:
          zeros: {golden: true}
          unspecified: {golden: true}
"""

#: the spec's own statistic cases (expected values and bands derived over seeds there)
SPEC_STATISTIC_CASES = ("statistics-dot-std-dk16", "statistics-unscaled-softmax-saturates-dk16",
                        "statistics-unscaled-gradient-shrinks-dk16")


# --- backends: a correct one, one per declared policy, and planted bugs --------------

class Declares(NumpyBackend):
    """The NumPy backend declaring the given policies (missing ones undeclared)."""

    def __init__(self, **policy):
        super().__init__()
        self.policy = dict(policy)


class DeclaresPerOp(Declares):
    """Declares `policy`, and op_policy overriding it for sdpa."""

    def __init__(self, op_policy, **policy):
        super().__init__(**policy)
        self.op_policy = op_policy


class PositionalLeak(NumpyBackend):
    """Adds a term that depends on the query's position: not permutation equivariant."""

    def sdpa(self, q, k, v, **kw):
        out = super().sdpa(q, k, v, **kw)
        return (out + 0.01 * np.arange(out.shape[-2])[:, None]).astype(out.dtype)


class LeaksFuture(NumpyBackend):
    """Ignores the causal mask: later keys reach earlier queries."""

    def sdpa(self, q, k, v, *, causal=None, **kw):
        return super().sdpa(q, k, v, **kw)


class SoftmaxPlusOne(NumpyBackend):
    """exp(x) / (1 + sum exp(x)): an implicit zero logit, not shift invariant."""

    def softmax(self, x, axis=-1):
        e = np.exp(np.asarray(x, dtype=np.float64))
        return (e / (1.0 + np.sum(e, axis=axis, keepdims=True))).astype(x.dtype)


class ScaleTwiceInSdpa(NumpyBackend):
    """sdpa applies the default scale twice; attention_weights is right."""

    def sdpa(self, q, k, v, *, scale=None, **kw):
        return super().sdpa(q, k, v, scale=1.0 / q.shape[-1], **kw)


class IgnoresScale(NumpyBackend):
    """A dot that scales, and weights and gradients under the default scale whatever
    scale the case gives."""

    def scores(self, q, k, *, kind, **kw):
        return super().scores(q, k, kind="scaled_dot" if kind == "dot" else kind, **kw)

    def attention_weights(self, q, k, *, scale=None, **kw):
        return super().attention_weights(q, k, **kw)

    def sdpa_vjp(self, q, k, v, d_out, *, scale=None, **kw):
        return super().sdpa_vjp(q, k, v, d_out, **kw)


class NoNormalisation(NumpyBackend):
    """Weights exp(s - max s), never divided by their sum."""

    def attention_weights(self, q, k, **kw):
        w = super().attention_weights(q, k, **kw)
        return (w / np.max(w, axis=-1, keepdims=True)).astype(w.dtype)


class LseZeroWhenEmpty(NumpyBackend):
    """A row without allowed keys gets lse 0 (as torch's CPU flash kernel), not -inf."""

    def sdpa_lse(self, q, k, v, **kw):
        out, lse = super().sdpa_lse(q, k, v, **kw)
        return out, np.where(np.isneginf(lse), 0.0, lse).astype(lse.dtype)


class MergesInBase2(NumpyBackend):
    """Declares lse_base e but merges states as if their lse were log2."""

    def merge_states(self, outs, lses):
        out, lse = rules.merge_states(outs, lses, "2")
        return out.astype(outs.dtype), lse.astype(lses.dtype)


def _one_ulp_up(out, times=1):
    """out with its first element moved up by `times` units in the last place."""
    for _ in range(times):
        out.flat[0] = np.nextafter(out.flat[0], np.inf)
    return out


class Nondeterministic(NumpyBackend):
    """Declares deterministic, yet each sdpa call moves its first output one ulp further."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def sdpa(self, q, k, v, **kw):
        self.calls += 1
        return _one_ulp_up(super().sdpa(q, k, v, **kw), self.calls)


class BatchDependent(NumpyBackend):
    """Declares batch_invariant, yet sdpa of a batch of more than one differs by one ulp."""

    def sdpa(self, q, k, v, **kw):
        out = super().sdpa(q, k, v, **kw)
        return _one_ulp_up(out) if np.shape(q)[0] > 1 else out


class RowCountDependent(NumpyBackend):
    """Declares split_invariant, yet sdpa of an odd number of queries differs by one ulp."""

    def sdpa(self, q, k, v, **kw):
        out = super().sdpa(q, k, v, **kw)
        return _one_ulp_up(out) if np.shape(q)[-2] % 2 else out


# --- runs and scenarios -----------------------------------------------------------------

@dataclass(frozen=True)
class Run:
    """One run to judge: a case in a dtype on a backend. Its outputs are the reference's
    (under `policy`, rounded to the dtype), or the backend's own when `own`; `tamper`
    then changes them: tamper(ctx, outputs) -> outputs."""

    case: str
    dtype: str = "float64"
    backend: object = field(default_factory=NumpyBackend)
    own: bool = False
    policy: tuple | None = None
    tamper: Callable | None = None


@dataclass(frozen=True)
class Scenario:
    target: str              # the checker: "property:NAME", "statistic:NAME", "check_exact", ...
    check: Callable          # check(ctx): returns (passes) or raises CheckFailure
    right: Run
    wrong: Run
    message: tuple           # fragments the wrong run's message must contain


def prop(name):
    return lambda ctx: checks.check_properties(ctx, [name])


def stat(name):
    def check(ctx):
        chosen = [s for s in ctx.case.expect["statistic"] if s["name"] == name]
        assert chosen, f"case {ctx.case.id} has no statistic {name}"
        return checks.check_statistics(ctx, chosen)
    return check


def exact(ctx):
    return checks.check_exact(ctx, ctx.case.expect["exact"])


def close(ctx):
    return checks.check_close(ctx, ctx.case.expect["close"])


def golden(ctx):
    return checks.check_golden(ctx)


def ignoring_key_nan(ctx):
    return checks.check_golden(ctx, ("masked_key_nan", "ignored"))


def policy(ctx):
    return checks.policy_outcome(ctx, ctx.case.expect["policy"])


def setting(index, value):
    """Tamper: out[index] = value (value may be a function of the context)."""
    def tamper(ctx, outputs):
        out = outputs["out"]
        out[index] = value(ctx) if callable(value) else value
        return outputs
    return tamper


def scaling(index, factor):
    def tamper(ctx, outputs):
        outputs["out"][index] *= factor
        return outputs
    return tamper


def adding(index, amount):
    def tamper(ctx, outputs):
        outputs["out"][index] += amount(ctx) if callable(amount) else amount
        return outputs
    return tamper


def in_dq(index, value, add=False):
    """Tamper: dq[index] = value (or += value)."""
    def tamper(ctx, outputs):
        if add:
            outputs["dq"][index] += value
        else:
            outputs["dq"][index] = value
        return outputs
    return tamper


def tolerance_of(ctx, name="out"):
    gold, plain_error = ctx.golden.get(ctx.case, ctx.variant, ctx.dtype)[name]
    return ctx.tolerances.output(ctx.dtype, plain_error, gold)


def between_tiers(ctx, name="out"):
    """An error above the float32 tier's tolerance and below the input tier's."""
    gold, tight = ctx.golden.get(ctx.case, ctx.variant, ctx.dtype, None, "float32")[name]
    _, loose = ctx.golden.get(ctx.case, ctx.variant, ctx.dtype, None, "input")[name]
    low = ctx.tolerances.output(ctx.dtype, tight, gold)
    high = ctx.tolerances.output(ctx.dtype, loose, gold)
    assert 2 * low < high, (low, high)
    return (low + high) / 2


def above_hull(ctx):
    return float(np.max(ctx.exact_inputs["v"][0, :, 0])) + 1.0


ONE_ULP_BELOW_ONE = float(np.nextafter(np.float32(1), np.float32(0)))

SCENARIOS = {
    # --- properties -----------------------------------------------------------------
    "rows_sum_to_one (weights)": Scenario(
        "property:rows_sum_to_one", prop("rows_sum_to_one"),
        Run("meta-weights-causal"), Run("meta-weights-causal", tamper=scaling((2,), 1.01)),
        ("property rows_sum_to_one: row sums: differs by 0.01 at [2]", "expected 1")),
    "rows_sum_to_one (softmax)": Scenario(
        "property:rows_sum_to_one", prop("rows_sum_to_one"),
        Run("meta-softmax"), Run("meta-softmax", tamper=scaling((1,), 0.9)),
        ("property rows_sum_to_one: row sums: differs by 0.1 at [1]",)),
    "masked_weights_zero": Scenario(
        "property:masked_weights_zero", prop("masked_weights_zero"),
        Run("meta-weights-causal"), Run("meta-weights-causal", tamper=setting((1, 3), 1e-3)),
        ("property masked_weights_zero: masked weight at [1, 3] is 0.001, not 0",)),
    "permutation_equivariant": Scenario(
        "property:permutation_equivariant", prop("permutation_equivariant"),
        Run("meta-sdpa-masked"), Run("meta-sdpa-masked", backend=PositionalLeak(), own=True),
        ("property permutation_equivariant: output of permuted tokens vs permuted output:"
         " differs by",)),
    "identical_tokens_identical_outputs": Scenario(
        "property:identical_tokens_identical_outputs", prop("identical_tokens_identical_outputs"),
        Run("meta-identical-tokens"),
        Run("meta-identical-tokens", tamper=adding((2, 1), 0.01)),
        ("property identical_tokens_identical_outputs: outputs of identical tokens 0 and 2:"
         " differs by 0.01 at [1]",)),
    "identical_tokens_identical_outputs (none to compare)": Scenario(
        "property:identical_tokens_identical_outputs", prop("identical_tokens_identical_outputs"),
        Run("meta-identical-tokens"), Run("meta-sdpa-causal"),
        ("the case has no identical tokens in 'q' to compare",)),
    "causal_future_independent": Scenario(
        "property:causal_future_independent", prop("causal_future_independent"),
        Run("meta-sdpa-causal"), Run("meta-sdpa-causal", backend=LeaksFuture(), own=True),
        ("property causal_future_independent: outputs of queries 0..3 after changing keys"
         " from 4: differs by",)),
    "softmax_shift_invariant": Scenario(
        "property:softmax_shift_invariant", prop("softmax_shift_invariant"),
        Run("meta-softmax"), Run("meta-softmax", backend=SoftmaxPlusOne(), own=True),
        ("property softmax_shift_invariant: softmax of shifted input: differs by",)),
    "key_value_equals_plain": Scenario(
        "property:key_value_equals_plain", prop("key_value_equals_plain"),
        Run("meta-key-value-plain"),
        Run("meta-key-value-plain", backend=ScaleTwiceInSdpa(), own=True),
        ("property key_value_equals_plain: sdpa(q, k, k) vs weights(q, k) @ k: differs by",)),
    "key_value_equals_plain (v is not k)": Scenario(
        "property:key_value_equals_plain", prop("key_value_equals_plain"),
        Run("meta-key-value-plain"), Run("meta-column-form"),
        ("the case's k and v differ; this property needs v = k",)),
    "column_form_equals_row_form": Scenario(
        "property:column_form_equals_row_form", prop("column_form_equals_row_form"),
        Run("meta-column-form"), Run("meta-column-form", tamper=adding((2, 1), 0.01)),
        ("property column_form_equals_row_form: row-form output vs column-form reference:"
         " differs by 0.01 at [2, 1]",)),
    "finite": Scenario(
        "property:finite", prop("finite"),
        Run("meta-sdpa-masked"), Run("meta-sdpa-masked", tamper=setting((1, 2, 0), np.nan)),
        ("property finite: out holds nan at [1, 2, 0]",)),
    "output_in_value_hull": Scenario(
        "property:output_in_value_hull", prop("output_in_value_hull"),
        Run("meta-sdpa-masked"), Run("meta-sdpa-masked", tamper=setting((0, 1, 0), above_hull)),
        ("property output_in_value_hull: output", "at [0, 1, 0] lies outside the values' range")),
    "split_kv_merge": Scenario(
        "property:split_kv_merge", prop("split_kv_merge"),
        Run("meta-sdpa-lse"), Run("meta-sdpa-lse", backend=LseZeroWhenEmpty(), own=True),
        ("property split_kv_merge: lse of keys [0, 3) and [3, 6) merged vs lse of all keys:"
         " differs by",)),
    "cascade_merge": Scenario(
        "property:cascade_merge", lambda ctx: checks.check_properties(
            ctx, [{"cascade_merge": {"prefix": 4}}]),
        Run("meta-cascade", own=True), Run("meta-cascade", backend=MergesInBase2(), own=True),
        ("property cascade_merge: lse of the shared prefix and own keys merged vs lse of the"
         " whole keys: differs by",)),


    "deterministic": Scenario(
        "property:deterministic", prop("deterministic"),
        Run("meta-invariance", "float32", own=True),
        Run("meta-invariance", "float32", backend=Nondeterministic(), own=True),
        ("property deterministic: out of the same call again:", "not the same bits as",
         "(1 of 96 elements differ)")),
    "batch_invariant": Scenario(
        "property:batch_invariant", prop("batch_invariant"),
        Run("meta-invariance", "float32", own=True),
        Run("meta-invariance", "float32", backend=BatchDependent(), own=True),
        ("property batch_invariant: out of batch element 0 run alone:",
         "not the same bits as")),
    "split_invariant": Scenario(
        "property:split_invariant", prop("split_invariant"),
        Run("meta-invariance", "float32", own=True),
        Run("meta-invariance", "float32", backend=RowCountDependent(), own=True),
        ("property split_invariant: out of the queries [0, 3) and [3, 6) in two calls:",
         "not the same bits as")),
    # --- statistics -----------------------------------------------------------------
    "std": Scenario(
        "statistic:std", stat("std"),
        Run("statistics-dot-std-dk16"),
        Run("statistics-dot-std-dk16", backend=IgnoresScale(), own=True),
        ("statistic std = 0.9", "expected 4 +/- 0.79", "a dot that scales gives 0.951")),
    "mean": Scenario(
        "statistic:mean", stat("mean"),
        Run("meta-weights-mean"), Run("meta-weights-mean", backend=NoNormalisation(), own=True),
        ("statistic mean = ", "expected 0.125 +/- 1e-09", "every row sums to 1 over 8 keys")),
    "mean_row_entropy": Scenario(
        "statistic:mean_row_entropy", stat("mean_row_entropy"),
        Run("statistics-unscaled-softmax-saturates-dk16"),
        Run("statistics-unscaled-softmax-saturates-dk16", backend=IgnoresScale(), own=True),
        ("statistic mean_row_entropy = ", "expected 1.1489 +/- 0.504")),
    "mean_row_max": Scenario(
        "statistic:mean_row_max", stat("mean_row_max"),
        Run("statistics-unscaled-softmax-saturates-dk16"),
        Run("statistics-unscaled-softmax-saturates-dk16", backend=IgnoresScale(), own=True),
        ("statistic mean_row_max = ", "expected 0.6249 +/- 0.177")),
    "rms": Scenario(
        "statistic:rms", stat("rms"),
        Run("statistics-unscaled-gradient-shrinks-dk16"),
        Run("statistics-unscaled-gradient-shrinks-dk16", backend=IgnoresScale(), own=True),
        ("statistic rms = ", "expected 1.2251 +/- 0.567")),
    # --- exact ----------------------------------------------------------------------
    "exact value, one ulp off": Scenario(
        "check_exact", exact,
        Run("meta-weights-causal", dtype="float32"),
        Run("meta-weights-causal", dtype="float32", tamper=setting((0, 0), ONE_ULP_BELOW_ONE)),
        (f"exact [0]: got {ONE_ULP_BELOW_ONE:.9g} at [0] of the selection, expected exactly 1",)),
    "exact slice of an input": Scenario(
        "check_exact", exact,
        Run("meta-exact-from-input"), Run("meta-exact-from-input", tamper=adding((0, 1), 1e-3)),
        ("exact [0]: got", "at [1] of the selection, expected exactly",)),
    "exact NaN": Scenario(
        "check_exact", exact,
        Run("meta-nan-row"), Run("meta-nan-row", tamper=setting((1, 3), 0.25)),
        ("exact [1]: got 0.25 at [3] of the selection, expected exactly nan",)),
    # --- close ----------------------------------------------------------------------
    "close, digits": Scenario(
        "check_close", close,
        Run("meta-close-softmax"), Run("meta-close-softmax", tamper=adding((0, 0), 1e-4)),
        ("close [0]: got 0.8946425763", "at [0] of the selection, expected 0.8945 within 5e-05",)),
    "close, digits in float16": Scenario(
        "check_close", close,
        Run("meta-close-softmax", dtype="float16"),
        Run("meta-close-softmax", dtype="float16", tamper=adding((0, 2), 0.003)),
        ("close [0]: got", "at [2] of the selection, expected 0.0164 within 0.0018",)),
    "close, atol": Scenario(
        "check_close", close,
        Run("meta-close-softmax"), Run("meta-close-softmax", tamper=adding((0, 1), 2e-4)),
        ("close [0, 1]: got 0.0447366", "expected 0.04454 within 0.0001",)),
    "close NaN": Scenario(
        "check_close", close,
        Run("meta-close-softmax"), Run("meta-close-softmax", tamper=setting((0, 3), np.nan)),
        ("close [0]: got nan at [3] of the selection",)),
    # --- golden ---------------------------------------------------------------------
    "golden within / beyond its tolerance": Scenario(
        "check_golden", golden,
        Run("meta-sdpa-masked", tamper=adding((1, 2, 1), lambda ctx: 0.5 * tolerance_of(ctx))),
        Run("meta-sdpa-masked", tamper=adding((1, 2, 1), lambda ctx: 2.0 * tolerance_of(ctx))),
        ("golden out: worst abs error", "at [1, 2, 1]", "tolerance", "x max(plain float64 error")),
    "golden float32": Scenario(
        "check_golden", golden,
        Run("meta-softmax", dtype="float32", backend=NumpyBackend(), own=True),
        Run("meta-softmax", dtype="float32", backend=SoftmaxPlusOne(), own=True),
        ("golden out: worst abs error", "plain float32 error")),
    "golden float32 accumulation tier": Scenario(
        "check_golden", golden,
        Run("meta-sdpa-long-half", dtype="float16", backend=Declares(accumulation="input"),
            tamper=adding((1, 2), between_tiers)),
        Run("meta-sdpa-long-half", dtype="float16", backend=Declares(accumulation="float32"),
            tamper=adding((1, 2), between_tiers)),
        ("golden out: worst abs error", "at [1, 2]",
         "plain float16 error", "float32 accumulation, u x max|golden|)")),
    "golden: no accumulation declared is the input tier": Scenario(
        "check_golden", golden,
        Run("meta-sdpa-long-half", dtype="float16", backend=Declares(),
            tamper=adding((1, 2), between_tiers)),
        Run("meta-sdpa-long-half", dtype="float16", backend=Declares(),
            tamper=adding((1, 2), lambda ctx: 3 * between_tiers(ctx))),
        ("golden out: worst abs error", "at [1, 2]", "plain float16 error")),
    "golden: a plain dS K's 0 x NaN in dq (key_nan_columns)": Scenario(
        "check_golden", ignoring_key_nan,
        Run("meta-nan-masked-key-vjp", tamper=in_dq((slice(None), 1), np.nan)),
        Run("meta-nan-masked-key-vjp", tamper=in_dq((slice(None), 0), np.nan)),
        ("golden dq under masked_key_nan=ignored: NaN pattern differs at [0, 0]",)),
    "golden: a key_nan column without NaN is compared": Scenario(
        "check_golden", ignoring_key_nan,
        Run("meta-nan-masked-key-vjp"),
        Run("meta-nan-masked-key-vjp", tamper=in_dq((0, 1), 1.0, add=True)),
        ("golden dq under masked_key_nan=ignored: worst abs error 1 at [0, 1]",)),
    "golden NaN pattern (NaN where the golden is finite)": Scenario(
        "check_golden", golden,
        Run("meta-nan-row"), Run("meta-nan-row", tamper=setting((0, 0), np.nan)),
        ("golden out: NaN pattern differs at [0, 0] (got nan, expected",)),
    "golden NaN pattern (finite where the golden is NaN)": Scenario(
        "check_golden", golden,
        Run("meta-nan-row"), Run("meta-nan-row", tamper=setting((1, 1), 0.25)),
        ("golden out: NaN pattern differs at [1, 1] (got 0.25, expected nan)",)),
    "golden inf pattern (sign)": Scenario(
        "check_golden", golden,
        Run("meta-inf-scores"), Run("meta-inf-scores", tamper=scaling((0, 1), -1.0)),
        ("golden out: inf pattern differs at [0, 1] (got inf, expected -inf)",)),
    "golden inf pattern (finite where the golden is inf)": Scenario(
        "check_golden", golden,
        Run("meta-inf-scores"), Run("meta-inf-scores", tamper=setting((0, 0), 2.5)),
        ("golden out: inf pattern differs at [0, 0] (got 2.5, expected inf)",)),
    # --- policies -------------------------------------------------------------------
    "policy: the declared choice's golden": Scenario(
        "policy_outcome", policy,
        Run("meta-empty-row-policy", backend=Declares(fully_masked_rows="zeros"),
            policy=("fully_masked_rows", "zeros")),
        Run("meta-empty-row-policy", backend=Declares(fully_masked_rows="zeros"),
            policy=("fully_masked_rows", "uniform")),
        ("golden out under fully_masked_rows=zeros: worst abs error", "at [1, ",
         "exact [1] under fully_masked_rows=zeros: got")),
    "policy: NaN choice": Scenario(
        "policy_outcome", policy,
        Run("meta-empty-row-policy", backend=Declares(fully_masked_rows="nan"),
            policy=("fully_masked_rows", "nan")),
        Run("meta-empty-row-policy", backend=Declares(fully_masked_rows="nan"),
            policy=("fully_masked_rows", "zeros")),
        ("golden out under fully_masked_rows=nan: NaN pattern differs at [1, 0]",)),
    "policy: op_policy overrides policy for its op": Scenario(
        "policy_outcome", policy,
        Run("meta-empty-row-policy",
            backend=DeclaresPerOp({"sdpa": {"fully_masked_rows": "nan"}},
                                  fully_masked_rows="zeros"),
            policy=("fully_masked_rows", "nan")),
        Run("meta-empty-row-policy",
            backend=DeclaresPerOp({"sdpa": {"fully_masked_rows": "nan"}},
                                  fully_masked_rows="zeros"),
            policy=("fully_masked_rows", "zeros")),
        ("golden out under fully_masked_rows=nan: NaN pattern differs at [1, 0]",)),
    "policy: unspecified leaves padded query rows free": Scenario(
        "policy_outcome", policy,
        Run("meta-varlen-padded-rows", backend=Declares(padded_query_rows="unspecified"),
            tamper=setting((1, slice(2, None)), 123.0)),
        Run("meta-varlen-padded-rows", backend=Declares(padded_query_rows="unspecified"),
            tamper=adding((1, 1), 0.5)),
        ("golden out under padded_query_rows=unspecified: worst abs error", "at [1, 1, ")),
    "policy: zeros checks padded query rows": Scenario(
        "policy_outcome", policy,
        Run("meta-varlen-padded-rows", backend=Declares(padded_query_rows="zeros")),
        Run("meta-varlen-padded-rows", backend=Declares(padded_query_rows="zeros"),
            tamper=setting((1, slice(2, None)), 123.0)),
        ("golden out under padded_query_rows=zeros: worst abs error", "at [1, 2, ")),
    "policy: the backend declares no choice": Scenario(
        "policy_outcome", policy,
        Run("meta-empty-row-policy", backend=Declares(fully_masked_rows="uniform"),
            policy=("fully_masked_rows", "uniform")),
        Run("meta-empty-row-policy", backend=Declares(), policy=("fully_masked_rows", "uniform")),
        ("policy fully_masked_rows: the backend declares no choice"
         " (the case allows zeros, uniform, nan)",)),
    "policy: a choice the case does not allow": Scenario(
        "policy_outcome", policy,
        Run("meta-empty-row-policy-no-nan", backend=Declares(fully_masked_rows="uniform"),
            policy=("fully_masked_rows", "uniform")),
        Run("meta-empty-row-policy-no-nan", backend=Declares(fully_masked_rows="nan"),
            policy=("fully_masked_rows", "nan")),
        ("policy fully_masked_rows: the backend declares 'nan', which this case does not"
         " allow (zeros, uniform)",)),
    "policy: per_row, a row NaN or the ignored result": Scenario(
        "check_rows_or_nan", policy,
        Run("meta-nan-masked-key", backend=Declares(masked_key_nan="per_row"),
            policy=("masked_key_nan", "ignored"), tamper=setting((1, slice(None)), np.nan)),
        Run("meta-nan-masked-key", backend=Declares(masked_key_nan="per_row"),
            policy=("masked_key_nan", "ignored"), tamper=setting((1, 0), np.nan)),
        ("policy masked_key_nan=per_row: out row [1] is partly NaN (1 of 2): a row is NaN in"
         " every element or the ignored result",)),
    "policy: per_row, a row without NaN is off": Scenario(
        "check_rows_or_nan", policy,
        Run("meta-nan-masked-key", backend=Declares(masked_key_nan="per_row"),
            policy=("masked_key_nan", "ignored")),
        Run("meta-nan-masked-key", backend=Declares(masked_key_nan="per_row"),
            policy=("masked_key_nan", "ignored"), tamper=adding((2, 1), 0.5)),
        ("policy masked_key_nan=per_row: out (rows without NaN vs the ignored golden): worst"
         " abs error 0.5 at [2, 1]",)),
    "policy: per_row, gradients element by element": Scenario(
        "check_rows_or_nan", policy,
        Run("meta-nan-masked-key-vjp", backend=Declares(masked_key_nan="per_row"),
            policy=("masked_key_nan", "ignored"), tamper=in_dq((slice(None), 1), np.nan)),
        Run("meta-nan-masked-key-vjp", backend=Declares(masked_key_nan="per_row"),
            policy=("masked_key_nan", "ignored"), tamper=in_dq((0, 0), 1.0, add=True)),
        ("policy masked_key_nan=per_row: dq (rows without NaN vs the ignored golden): worst"
         " abs error 1 at [0, 0]",)),
}

#: checkers that are not registries, and the branches each must have a scenario for
NAMED_CHECKERS = ("check_exact", "check_close", "check_golden", "policy_outcome",
                  "check_rows_or_nan")
BRANCHES = ("golden NaN pattern (NaN where the golden is finite)",
            "golden NaN pattern (finite where the golden is NaN)",
            "golden inf pattern (sign)", "golden inf pattern (finite where the golden is inf)",
            "policy: the backend declares no choice", "policy: a choice the case does not allow",
            "policy: unspecified leaves padded query rows free",
            "policy: zeros checks padded query rows",
            "exact NaN", "exact slice of an input", "close NaN", "close, atol",
            "golden float32 accumulation tier",
            "golden: a plain dS K's 0 x NaN in dq (key_nan_columns)")


# --- building contexts ------------------------------------------------------------------

@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """case id -> (Case, GoldenStore): the META cases frozen into their own spec folder,
    and the spec's own statistic cases with the default golden store."""
    folder = SpecFolder.at(make_spec(tmp_path_factory.mktemp("meta"), META, topic="meta"))
    meta_store = GoldenStore.of(folder)
    found = {c.id: (c, meta_store) for c in load_spec(folder).cases}
    spec = default_folder()
    statistic_cases, errors = load_file(spec.cases_dir / "statistics.yaml")
    assert not errors
    spec_store = GoldenStore.of(spec)
    found.update({c.id: (c, spec_store) for c in statistic_cases if c.id in SPEC_STATISTIC_CASES})
    assert set(SPEC_STATISTIC_CASES) <= set(found)
    return found


def context(cases, run: Run) -> Context:
    case, store = cases[run.case]
    variant = case.variants[0]
    exact_inputs = rounded_inputs(case, variant, run.dtype)
    arrays = cast_inputs(exact_inputs, run.dtype)
    backend = InProcess(run.backend)
    if run.own:
        raw = backend.call(case.op, arrays, case.params)
        outputs = checked_outputs(case.op, raw, arrays, case.params, run.dtype)
    else:
        with np.errstate(all="ignore"):
            outputs = {name: round_to(gold, run.dtype) for name, (gold, _) in
                       compute(case, variant, run.dtype, store.tolerances, run.policy).items()}
    ctx = Context(backend, case, variant, run.dtype, arrays, exact_inputs, outputs, store,
                  store.tolerances)
    if run.tamper:
        ctx.outputs = run.tamper(ctx, {n: np.array(o, copy=True) for n, o in outputs.items()})
    return ctx


# --- the tests --------------------------------------------------------------------------

def test_every_checker_has_a_scenario():
    """A property or statistic registered without a meta-test fails here."""
    targets = {s.target for s in SCENARIOS.values()}
    needed = ({f"property:{name}" for name in PROPERTIES}
              | {f"statistic:{name}" for name in STATISTICS} | set(NAMED_CHECKERS))
    assert not needed - targets, f"checkers without a scenario: {sorted(needed - targets)}"
    assert not set(BRANCHES) - set(SCENARIOS), sorted(set(BRANCHES) - set(SCENARIOS))


@pytest.mark.parametrize("name", SCENARIOS)
def test_right_output_passes(cases, name):
    scenario = SCENARIOS[name]
    ctx = context(cases, scenario.right)
    try:
        ratio = scenario.check(ctx)
    except CheckFailure as exc:
        pytest.fail(f"{name}: a right output failed: {exc}")
    if scenario.target == "check_golden" or scenario.target == "policy_outcome":
        assert 0.0 <= ratio <= 1.0, f"{name}: worst error / tolerance {ratio} for a right output"


@pytest.mark.parametrize("name", SCENARIOS)
def test_wrong_output_fails_with_its_message(cases, name):
    scenario = SCENARIOS[name]
    ctx = context(cases, scenario.wrong)
    with pytest.raises(CheckFailure) as failure:
        scenario.check(ctx)
    message = str(failure.value)
    missing = [fragment for fragment in scenario.message if fragment not in message]
    assert not missing, f"{name}: the message lacks {missing}:\n{message}"


def test_a_wrong_run_really_differs_from_the_right_one(cases):
    """Guard of the table itself: every wrong run's outputs (or backend, or declared
    policy) differ from its right run's, so no scenario passes by accident."""
    for name, scenario in SCENARIOS.items():
        right, wrong = context(cases, scenario.right), context(cases, scenario.wrong)
        same_outputs = right.case.id == wrong.case.id and all(
            np.array_equal(right.outputs[n], wrong.outputs[n], equal_nan=True)
            for n in right.outputs)
        same_backend = type(right.caller.adapter) is type(wrong.caller.adapter) and \
            right.declaration.policy == wrong.declaration.policy
        assert not (same_outputs and same_backend), f"{name}: the wrong run is the right one"


def test_check_case_lists_every_broken_expectation(cases):
    """check_case() runs golden, exact and properties, and reports each one that breaks."""
    right = context(cases, Run("meta-weights-causal"))
    assert 0.0 <= checks.check_case(right).worst_ratio <= 1.0
    wrong = context(cases, Run("meta-weights-causal", tamper=setting((0, slice(None)),
                                                                     [0.5, 0.5, 0.0, 0.0])))
    with pytest.raises(CheckFailure) as failure:
        checks.check_case(wrong)
    message = str(failure.value)
    for fragment in ("golden out: worst abs error 0.5 at [0, 0]",
                     "exact [0]: got 0.5 at [0] of the selection, expected exactly 1",
                     "property masked_weights_zero: masked weight at [0, 1] is 0.5, not 0"):
        assert fragment in message, f"judge's message lacks {fragment!r}:\n{message}"
    assert "rows_sum_to_one" not in message    # rows still sum to one: no false alarm


def test_check_case_checks_the_policy_and_the_statistic(cases):
    policy_ctx = context(cases, Run("meta-empty-row-policy", backend=Declares(
        fully_masked_rows="zeros"), policy=("fully_masked_rows", "uniform")))
    with pytest.raises(CheckFailure, match="golden out under fully_masked_rows=zeros"):
        checks.check_case(policy_ctx)
    right = context(cases, Run("meta-empty-row-policy", backend=Declares(
        fully_masked_rows="uniform"), policy=("fully_masked_rows", "uniform")))
    assert checks.check_case(right).worst_ratio <= 1.0
    stat_ctx = context(cases, Run("meta-weights-mean", backend=NoNormalisation(), own=True))
    with pytest.raises(CheckFailure, match=r"statistic mean = .*expected 0\.125"):
        checks.check_case(stat_ctx)
    assert checks.check_case(context(cases, Run("meta-weights-mean"))).failures == []


def test_check_outcome_checks_every_part_even_after_one_fails(cases):
    ctx = context(cases, Run("meta-empty-row-policy", backend=Declares(fully_masked_rows="zeros"),
                             policy=("fully_masked_rows", "nan")))
    outcome = ctx.case.expect["policy"]["fully_masked_rows"]["zeros"]
    with pytest.raises(CheckFailure) as failure:
        checks.check_outcome(ctx, outcome, ("fully_masked_rows", "zeros"))
    lines = str(failure.value).splitlines()
    assert any(line.startswith("golden out under fully_masked_rows=zeros: NaN pattern")
               for line in lines), lines
    assert any(line.startswith("exact [1] under fully_masked_rows=zeros: got nan")
               for line in lines), lines
