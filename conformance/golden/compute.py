"""Golden data, computed: the float64 reference's outputs for a case's dtype-rounded
inputs, and the error of the plain same-dtype computation that sets each tolerance."""

from __future__ import annotations

import functools
import math
import os

import numpy as np

from . import blocks, reference, sampled, sampled_vjp
from ..model.case import frozen
from ..model.dtypes import FP8_DTYPES, UNIT_ROUNDOFF, WIDE, output_dtype, round_to
from ..model.errors import Unsupported
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
_generated_bytes = 0        # of the arrays in _GENERATED (summing them per miss cost ms)
#: the generated inputs kept for the next test at most: 256 variants, and this many
#: bytes (a larger variant, a scale case's, is kept alone)
KEPT_BYTES = 1 << 30


def machine_memory_gb() -> float:
    """The memory of this machine, in GB (10**9 bytes)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):       # not a POSIX system: no limit known
        return float("inf")


def too_large(case) -> str | None:
    """Why a test of the case cannot run on this machine (its min_memory_gb), or None."""
    have = machine_memory_gb()
    if case.min_memory_gb <= have:
        return None
    return (f"unsupported by size: case {case.id} needs {case.min_memory_gb:g} GB of memory "
            f"(min_memory_gb), this machine has {have:.1f} GB")


def generated_inputs(case, variant) -> dict[str, np.ndarray]:
    """The case's float64 inputs, generated once per variant (read-only, shared by
    dtypes; a scale case's are not kept); Unsupported, before anything is made, on a
    machine too small for the case."""
    global _generated_bytes
    key = (repr(case.inputs), repr(variant.dims))
    if key not in _GENERATED:
        reason = too_large(case)
        if reason:
            raise Unsupported(reason)
        arrays = build_inputs(case.inputs, variant.dims)
        if case.profile == "scale":         # rounded_inputs keeps its test's rounded ones
            return arrays
        size = sum(a.nbytes for a in arrays.values())
        if len(_GENERATED) >= 256 or _generated_bytes + size > KEPT_BYTES:
            _GENERATED.clear()
            _generated_bytes = 0
        for array in arrays.values():
            array.setflags(write=False)
        _GENERATED[key] = arrays
        _generated_bytes += size
    return _GENERATED[key]


_ROUNDED: dict = {}


def shares_rounded(case) -> bool:
    """Are a test's rounded inputs made once and shared by its inputs and its golden
    (rounded_inputs)? A scale case's are."""
    return case.profile == "scale"


def rounded_inputs(case, variant, dtype) -> dict[str, np.ndarray]:
    """The case's inputs as the backend sees them, in float64 (bool masks unchanged). A
    scale case's are made once for its test and shared, read-only, by the test's inputs
    and its golden (the last test's alone are kept: a million keys are 1 GB a copy)."""
    key = (repr(case.inputs), repr(variant.dims), dtype) if shares_rounded(case) else None
    if key in _ROUNDED:
        return dict(_ROUNDED[key])
    arrays, dtypes = generated_inputs(case, variant), case.input_dtypes(dtype)
    rounded = {n: a.copy() if a.dtype == bool else round_to(a, dtypes[n])
               for n, a in arrays.items()}
    if key is not None:
        _ROUNDED.clear()
        for array in rounded.values():
            array.setflags(write=False)
        _ROUNDED[key] = rounded
    return dict(rounded)


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
    convention: (policy, choice) of CONVENTION_POLICIES, or None for the default.
    A case computed live (not frozen) runs blocks.py where it can; a sampled golden
    (sampled.py) holds its sampled rows (and columns: sampled_vjp.py) only, and its error
    is taken over them (live_reference)."""
    arrays = rounded_inputs(case, variant, dtype)
    policies = dict([c for c in (policy, convention) if c]) or None
    source, weights = plain_model(dtype, tolerances)
    wide = accumulation == "float32" and dtype in ACCUMULATION_DTYPES
    run = live_reference(case, variant, arrays, policy)
    # NaN, inf and overflow are expected here: policies, poisoned inputs, plain float16
    with np.errstate(all="ignore"), reference.output_format(dtype):
        exact = run(case.op, arrays, case.params, policies)
        with reference.rounded_to(source, "float32" if wide else None, weights):
            plain = run(case.op, arrays, case.params, policies)
    factor = 1.0 if weights else UNIT_ROUNDOFF[dtype] / UNIT_ROUNDOFF[source]
    roundings = math.sqrt(longest_reduction(arrays))
    order = UNIT_ROUNDOFF["float32" if wide or weights else dtype]
    result = {}
    for name, gold, approx in zip(OPS[case.op].outputs_for(arrays), exact, plain):
        both = np.isfinite(gold) & np.isfinite(approx)
        error = float(np.max(np.abs(gold[both] - approx[both]), initial=0.0)) * factor
        largest = float(np.max(np.abs(gold[np.isfinite(gold)]), initial=0.0))
        stored = output_dtype(dtype, name, case.params)      # an fp8 output: one rounding more
        written = UNIT_ROUNDOFF[stored] if stored in FP8_DTYPES else 0.0
        result[name] = (gold, max(error, roundings * order * largest, written * largest))
    return result


def live_reference(case, variant, arrays, policy=None):
    """The reference function of compute(): reference.run; for a case computed live (not
    frozen) blocks.run where it can, at the sampled rows of a sampled golden, and
    sampled_vjp.run for the sampled backward (dq at those rows, dk and dv at sampled
    key columns)."""
    if frozen(case):
        return reference.run
    chosen = sampled.is_sampled(case.expect) and policy is None
    if chosen and case.op == "sdpa_vjp":
        return functools.partial(
            sampled_vjp.run, rows=sampled.positions_for(case, variant, "dq", arrays)[0],
            columns=sampled.positions_for(case, variant, "dk", arrays)[0])
    if blocks.blocked(case.op, case.params):
        rows = sampled.rows_for(case, variant, arrays["q"].shape[-2]) if chosen else None
        return functools.partial(blocks.run, rows=rows)
    return reference.run


def plain_model(dtype, tolerances: Tolerances) -> tuple:
    """(the dtype the plain computation rounds its intermediate results to, the fp8 format
    it rounds the weights P to before P V, or None): an fp8 case computes in float32 from
    its dequantized inputs and rounds P to its format (spec/tolerances.yaml)."""
    if dtype in FP8_DTYPES:
        return WIDE, dtype
    return tolerances.plain_error_from.get(dtype, dtype), None


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
