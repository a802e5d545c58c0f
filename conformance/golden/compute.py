"""Golden data, computed: the float64 reference's outputs for a case's dtype-rounded
inputs, and the error of the plain same-dtype computation that sets each tolerance."""

from __future__ import annotations

import math

import numpy as np

from . import reference
from ..model.dtypes import UNIT_ROUNDOFF, round_to
from .inputs import build_inputs
from ..model.ops import OPS
from ..model.policies import CONVENTION_POLICIES, DEFAULT_POLICIES, POLICIES
from ..model.tolerances import Tolerances


def entry_key(case_id, variant, dtype, policy=None, convention=None) -> str:
    """The name of one golden entry: case/variant/dtype[/policy=choice][/convention=choice]
    (a convention other than the reference's default: lse_base=2)."""
    parts = [case_id, variant or "_", dtype]
    for chosen in (policy, convention):
        if chosen:
            parts.append("{}={}".format(*chosen))
    return "/".join(parts)


def conventions(op) -> list:
    """None (the reference's defaults), then (policy, choice) for each other choice of a
    convention the op's golden data depend on (lse_base 2 for sdpa_lse, merge_states)."""
    return [None] + [(name, choice) for name, ops in CONVENTION_POLICIES.items() if op in ops
                     for choice in POLICIES[name] if choice != DEFAULT_POLICIES[name]]


_GENERATED: dict = {}


def generated_inputs(case, variant) -> dict[str, np.ndarray]:
    """The case's float64 inputs, generated once per variant (read-only, shared by dtypes)."""
    key = (repr(case.inputs), repr(variant.dims))
    if key not in _GENERATED:
        if len(_GENERATED) >= 256:
            _GENERATED.clear()
        arrays = build_inputs(case.inputs, variant.dims)
        for array in arrays.values():
            array.setflags(write=False)
        _GENERATED[key] = arrays
    return _GENERATED[key]


def rounded_inputs(case, variant, dtype) -> dict[str, np.ndarray]:
    """The case's inputs as the backend sees them, in float64 (bool masks unchanged)."""
    arrays = generated_inputs(case, variant)
    return {n: a.copy() if a.dtype == bool else round_to(a, dtype) for n, a in arrays.items()}


def golden_entries(case):
    """(policy or None) for every golden a case needs: the plain one and per choice."""
    if case.expect.get("golden"):
        yield None
    for name, choices in case.expect.get("policy", {}).items():
        for choice, outcome in choices.items():
            if outcome.get("golden"):
                yield (name, choice)


#: dtypes with a second tolerance tier, products and sums accumulated in float32
#: (spec/tolerances.yaml); for float32 and float64 the two tiers coincide
ACCUMULATION_DTYPES = ("float16", "bfloat16")
#: the suffix of the float32-accumulation tier's plain error in a golden file
FLOAT32_TIER = ".plain_error_float32"


def compute(case, variant, dtype, tolerances: Tolerances,
            policy=None, accumulation=None, convention=None) -> dict[str, tuple[np.ndarray, float]]:
    """output name -> (golden float64 array, plain same-dtype error). With
    accumulation="float32" (float16 and bfloat16 only) the plain computation accumulates
    its products and sums in float32, and a sum in another order costs float32 roundings.
    convention: (policy, choice) of CONVENTION_POLICIES, or None for the default."""
    arrays = rounded_inputs(case, variant, dtype)
    policies = dict([c for c in (policy, convention) if c]) or None
    source = tolerances.plain_error_from.get(dtype, dtype)
    wide = accumulation == "float32" and dtype in ACCUMULATION_DTYPES
    # NaN, inf and overflow are expected here: policies, poisoned inputs, plain float16
    with np.errstate(all="ignore"):
        exact = reference.run(case.op, arrays, case.params, policies)
        with reference.rounded_to(source, "float32" if wide else None):
            plain = reference.run(case.op, arrays, case.params, policies)
    factor = UNIT_ROUNDOFF[dtype] / UNIT_ROUNDOFF[source]
    roundings = math.sqrt(longest_reduction(arrays))
    order = UNIT_ROUNDOFF["float32" if wide else dtype]
    result = {}
    for name, gold, approx in zip(OPS[case.op].outputs_for(arrays), exact, plain):
        both = np.isfinite(gold) & np.isfinite(approx)
        error = float(np.max(np.abs(gold[both] - approx[both]), initial=0.0)) * factor
        largest = float(np.max(np.abs(gold[np.isfinite(gold)]), initial=0.0))
        result[name] = (gold, max(error, roundings * order * largest))
    return result


def longest_reduction(arrays) -> int:
    """The longest sum an op can make over these inputs: their largest trailing dim."""
    dims = [max(a.shape[-2:]) for a in arrays.values() if a.ndim and a.dtype != bool]
    return max(dims, default=1)


def compute_case(case, tolerances: Tolerances):
    """Every golden array of a case: {key/output: array, key/output.plain_error: scalar},
    and for float16 and bfloat16 key/output.plain_error_float32 (the float32 tier)."""
    arrays = {}
    for variant in case.variants:
        for dtype in case.dtypes:
            for policy in golden_entries(case):
                for convention in conventions(case.op):
                    arrays.update(_entry(case, variant, dtype, tolerances, policy, convention))
    return arrays


def _entry(case, variant, dtype, tolerances, policy, convention) -> dict:
    """The golden arrays of one entry (entry_key) and their plain errors in each tier."""
    arrays = {}
    key = entry_key(case.id, variant.label, dtype, policy, convention)
    for name, (gold, error) in compute(case, variant, dtype, tolerances, policy, None,
                                       convention).items():
        arrays[f"{key}/{name}"] = gold
        arrays[f"{key}/{name}.plain_error"] = np.array(error)
    if dtype in ACCUMULATION_DTYPES:
        for name, (_, error) in compute(case, variant, dtype, tolerances, policy, "float32",
                                        convention).items():
            arrays[f"{key}/{name}{FLOAT32_TIER}"] = np.array(error)
    return arrays
