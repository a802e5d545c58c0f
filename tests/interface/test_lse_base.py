"""lse_base: a backend declares the base of its lse, and is judged in it. A NumPy backend
that writes and reads log2 (FlashInfer's kernels) passes every sdpa_lse and merge_states
case; one that writes log2 but declares e, or declares 2 and writes ln, fails them."""

from __future__ import annotations

import math

import pytest

from attention_conformance.backend.in_process import InProcess
from attention_conformance.backends import rules
from attention_conformance.backends.numpy import NumpyBackend
from attention_conformance.checking.verdict import run_case
from attention_conformance.golden.store import GoldenStore
from attention_conformance.model.errors import CheckFailure, Unsupported

from _real_spec import real_spec


class Base2(NumpyBackend):
    """The NumPy backend in base 2: lse / ln 2 out, exp2 in its merge."""

    def __init__(self, declared="2", writes="2"):
        super().__init__()
        self.policy = dict(self.policy, lse_base=declared)
        self.writes = writes

    def sdpa_lse(self, q, k, v, **params):
        out, lse = super().sdpa_lse(q, k, v, **params)
        factor = math.log(2.0) if self.writes == "2" else 1.0
        return out, (lse.astype(float) / factor).astype(lse.dtype)

    def merge_states(self, outs, lses):
        out, lse = rules.merge_states(outs, lses, self.writes)
        return out.astype(outs.dtype), lse.astype(lses.dtype)


def _tests(ops=("sdpa_lse", "merge_states")):
    return [(c, v, d) for c in real_spec().cases if c.op in ops and c.profile == "quick"
            for v in c.variants[:1] for d in c.dtypes[:2]]


def _failures(backend):
    golden, failed = GoldenStore(), []
    for case, variant, dtype in _tests():
        try:
            run_case(InProcess(backend), case, variant, dtype, golden)
        except CheckFailure:
            failed.append(case.id)
        except Unsupported:           # a form the NumPy backend lacks (a sharded case)
            pass
    return failed


def test_a_base_2_backend_that_declares_it_passes_every_lse_case():
    assert _failures(Base2()) == []


@pytest.mark.parametrize("declared, writes", [("e", "2"), ("2", "e")])
def test_a_backend_whose_lse_is_not_in_its_declared_base_fails(declared, writes):
    failed = _failures(Base2(declared, writes))
    assert "lse-plain" in failed and "merge-two-states" in failed
