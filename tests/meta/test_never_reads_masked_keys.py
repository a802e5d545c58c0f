"""A kernel that never reads a masked key passes every NaN-key case (issue 37, defect 1).

tests/known_good/never_reads_masked_keys.py computes each query row from its allowed
keys alone, as FlashAttention's tile skipping, transformers' key crop and varlen kernels
do: its gradients carry no NaN of a key no query reads. It declares
masked_key_nan: ignored and is certified on every case that names that policy, in
every variant and dtype, beside the plain NumPy backend (which reads every key and
multiplies a stored NaN by the exact zeros of dS: the other form `ignored` accepts).
"""

import sys
from pathlib import Path

import numpy as np
import pytest

from attention_conformance.backend.in_process import InProcess
from attention_conformance.backends.numpy import NumpyBackend
from attention_conformance.checking.verdict import run_case
from attention_conformance.golden.store import GoldenStore
from attention_conformance.model.errors import Unsupported

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "tests" / "known_good"))

from never_reads_masked_keys import NeverReadsMaskedKeys  # noqa: E402
from _real_spec import real_spec  # noqa: E402


def _nan_key_items():
    spec = real_spec()
    cases = [c for c in spec.cases if "masked_key_nan" in c.expect.get("policy", {})]
    return [(c, v, d) for c in cases for v in c.variants for d in c.dtypes]


@pytest.fixture(scope="module")
def golden():
    return GoldenStore()


def _failures(backend, golden):
    failures, unsupported = [], []
    for case, variant, dtype in _nan_key_items():
        label = f"{case.id}[{variant.label or ''}-{dtype}]"
        try:
            run_case(InProcess(backend), case, variant, dtype, golden)
        except Unsupported as exc:
            unsupported.append(f"{label}: {exc}")
        except AssertionError as exc:
            failures.append(f"{label}: {exc}")
    return failures, unsupported


def test_the_nan_key_cases_include_every_gradient_case():
    ops = {c.op for c, _, _ in _nan_key_items()}
    assert {"sdpa_vjp", "sdpa", "attention_weights", "multi_head_attention"} <= ops
    vjp = {c.id for c, _, _ in _nan_key_items() if c.op == "sdpa_vjp"}
    assert {"policies-masked-key-nan-vjp", "policies-causal-hidden-key-nan-vjp",
            "policies-masked-key-inf-vjp", "tiles-nan-masked-key-vjp"} <= vjp


@pytest.mark.parametrize("backend", [NeverReadsMaskedKeys, NumpyBackend],
                         ids=["never-reads-masked-keys", "numpy"])
def test_every_nan_key_case_passes_under_the_declared_policy(backend, golden):
    failures, unsupported = _failures(backend(), golden)
    assert not failures, "\n".join(failures[:5])
    assert not unsupported, "\n".join(unsupported[:5])


def test_the_never_read_gradients_are_finite_where_the_plain_ones_are_not():
    """The two exact forms differ: dq of a plain dS K holds NaN in the column of the NaN
    key entry; the never-reading backend's holds none."""
    rng = np.random.default_rng(0)
    q, k, v, d_out = (rng.standard_normal(s) for s in ((3, 4), (5, 4), (5, 2), (3, 2)))
    k[4, 1] = np.nan
    mask = np.ones((3, 5), bool)
    mask[:, 4] = False
    never = NeverReadsMaskedKeys().sdpa_vjp(q, k, v, d_out, mask=mask)
    plain = NumpyBackend().sdpa_vjp(q, k, v, d_out, mask=mask)
    assert all(np.isfinite(g).all() for g in never)
    assert np.isnan(plain[0][:, 1]).all() and np.isfinite(np.delete(plain[0], 1, 1)).all()
    np.testing.assert_allclose(np.delete(plain[0], 1, 1), np.delete(never[0], 1, 1))
