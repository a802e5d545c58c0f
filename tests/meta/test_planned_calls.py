"""The calls a test's properties will make are found before its outputs exist
(checks.planned_calls), so that an isolated run sends them with the test's first call;
they must be the very calls the properties then make, byte for byte."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from attention_conformance.backends.numpy import NumpyBackend
from attention_conformance.backend.calling import call_arguments
from attention_conformance.checking.expectations import planned_calls
from attention_conformance.checking.context import Context
from attention_conformance.golden.store import GoldenStore
from attention_conformance.model.ops import OPS
from attention_conformance.checking.properties import CALLS_BACKEND, FED_BY_ANSWERS, PROPERTIES, property_entry
from attention_conformance.backend.in_process import InProcess
from attention_conformance.checking.verdict import run_case, case_inputs
from attention_conformance.model.folder import default_folder

from _real_spec import real_spec


class Recording(NumpyBackend):
    """NumPy, each call's op, inputs and params kept."""

    def __init__(self):
        super().__init__()
        self.calls = []
        for op in OPS:
            if callable(getattr(NumpyBackend, op, None)):
                setattr(self, op, self._recorded(op, getattr(NumpyBackend, op).__get__(self)))

    def _recorded(self, op, method):
        def call(*args, **kwargs):
            self.calls.append((op, args, kwargs))
            return method(*args, **kwargs)
        return call


def _calling_tests():
    """One test (first variant, first dtype) of each quick case with a property that
    calls (the long-sequence cases use the same properties, at seconds a call)."""
    for case in real_spec().cases:
        if case.profile != "quick":
            continue
        names = {property_entry(p)[0] for p in case.expect.get("properties") or ()}
        if names & CALLS_BACKEND:
            yield pytest.param(case, id=f"{case.topic}/{case.id}")


def _bytes(call):
    op, args, kwargs = call
    arrays = [a for a in (*args, *kwargs.values()) if isinstance(a, np.ndarray)]
    params = {k: v for k, v in kwargs.items() if not isinstance(v, np.ndarray)}
    return op, [(a.dtype.str, a.shape, a.tobytes()) for a in arrays], params


@pytest.fixture(scope="module")
def golden():
    return GoldenStore.of(default_folder())


@pytest.mark.parametrize("case", list(_calling_tests()))
def test_the_calls_planned_without_outputs_are_the_calls_the_properties_make(case, golden):
    variant, dtype = case.variants[0], case.dtypes[0]
    backend = Recording()
    run_case(InProcess(backend), case, variant, dtype, golden)
    made = [_bytes(c) for c in backend.calls[1:]]           # after the test's own first
    exact_inputs, arrays = case_inputs(case, variant, dtype)
    ctx = Context(InProcess(backend), case, variant, dtype, arrays, exact_inputs, None, None, None)
    planned = []
    for op, planned_arrays, params in planned_calls(ctx):
        positional, keywords = call_arguments(op, planned_arrays)
        planned.append(_bytes((op, positional, {**keywords, **params})))
    fed = {property_entry(p)[0] for p in case.expect.get("properties") or ()} & FED_BY_ANSWERS
    # a property whose last call takes the answers of its others plans the others alone
    assert made and planned == made[:len(made) - len(fed)]


def test_a_property_is_marked_as_calling_the_backend_exactly_when_it_does():
    """planned_calls runs the marked properties alone: one that calls but is not marked
    would have its calls made one by one, waited for."""
    calling = {name for name, func in PROPERTIES.items()
               if "ctx.call(" in inspect.getsource(func)}
    assert calling == CALLS_BACKEND, calling ^ CALLS_BACKEND


def test_a_property_that_reads_the_outputs_before_its_call_plans_nothing():
    """Planning has no outputs: a call made after reading them is not found, only made."""
    case = next(c for c in real_spec().cases
                if "permutation_equivariant" in (c.expect.get("properties") or ()))
    variant, dtype = case.variants[0], case.dtypes[0]
    exact_inputs, arrays = case_inputs(case, variant, dtype)
    ctx = Context(InProcess(NumpyBackend()), case, variant, dtype, arrays, exact_inputs, None, None, None)
    assert planned_calls(ctx)
    original = PROPERTIES["permutation_equivariant"]

    def reads_first(ctx, **kwargs):
        next(iter(ctx.outputs.values()))
        return original(ctx, **kwargs)
    PROPERTIES["permutation_equivariant"] = reads_first
    try:
        assert not [c for c in planned_calls(ctx) if c[0] == case.op]
    finally:
        PROPERTIES["permutation_equivariant"] = original
