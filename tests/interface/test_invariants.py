"""Declared bitwise invariants (model/invariants.py): refused on load when unknown,
carried across the process boundary in the Declaration, and a backend that does not
declare one is unsupported on its cases, never failed (docs/interface.md)."""

from __future__ import annotations

import pytest

from attention_conformance.backend.in_process import InProcess
from attention_conformance.backend.interface import (Declaration, declaration_problems,
                                                     declare)
from attention_conformance.backends.numpy import NumpyBackend
from attention_conformance.checking.verdict import verdict_of
from attention_conformance.golden.store import GoldenStore
from attention_conformance.specs.loader import load_spec


class Claims(NumpyBackend):
    invariants = ("deterministic", "always_fast")


class ClaimsNothing(NumpyBackend):
    invariants = ()


def test_an_unknown_invariant_is_refused_on_load():
    assert declaration_problems(Claims()) == [
        "invariants names unknown invariant 'always_fast'; known: deterministic, "
        "batch_invariant, split_invariant"]
    not_a_set = NumpyBackend()
    not_a_set.invariants = "deterministic"
    assert declaration_problems(not_a_set)[0].startswith("invariants must be a set of names")


def test_the_declaration_carries_the_invariants_across_the_boundary():
    declared = declare(NumpyBackend())
    assert declared.invariants == ("batch_invariant", "deterministic", "split_invariant")
    assert Declaration.from_dict(declared.as_dict()) == declared
    forged = dict(declared.as_dict(), invariants=["bitwise_magic"])
    with pytest.raises(ValueError, match="not a declaration"):
        Declaration.from_dict(forged)


@pytest.fixture(scope="module")
def invariance_cases():
    return [c for c in load_spec().cases if c.topic == "invariance"]


def test_an_undeclared_invariant_is_unsupported_and_a_declared_one_passes(invariance_cases):
    golden = GoldenStore()
    for case in invariance_cases:
        variant, dtype = case.variants[0], case.dtypes[0]
        silent = verdict_of(InProcess(ClaimsNothing()), case, variant, dtype, golden)
        assert silent["status"] == "unsupported", silent
        assert "the backend does not declare" in silent["message"]
        assert verdict_of(InProcess(NumpyBackend()), case, variant, dtype, golden)["status"] \
            == "pass"
