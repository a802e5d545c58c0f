"""torch's masked_key_nan follows the call path, and its declaration says so (issue 37).

Through attn_mask (a mask, a window, lengths or a bias folded into one) and on the math
kernel a NaN in a masked key reaches every row: `propagates`. Under causal alone torch
picks its CPU flash kernel for 4-D inputs with Dk == Dv, which skips the causally hidden
key blocks: `per_row`. TorchBackend declares the first as its policy and the second by
condition (`policy_when`); the judge picks the branch per test, and a wrong condition
makes the right case fail. Runs where torch is installed (tox's torch-math environment).
"""

import pytest

torch = pytest.importorskip("torch")

from attention_conformance.backend.in_process import InProcess  # noqa: E402
from attention_conformance.backend.interface import declare, policy_for  # noqa: E402
from attention_conformance.backends.torch import TorchBackend  # noqa: E402
from attention_conformance.backends.torch_kernels import (TorchFlashBackend,  # noqa: E402
                                                          TorchMathBackend)
from attention_conformance.checking.verdict import run_case  # noqa: E402
from attention_conformance.golden.store import GoldenStore  # noqa: E402

from _real_spec import real_spec  # noqa: E402

#: causal alone (the flash kernel skips the hidden key), and an explicit mask
CAUSAL_ALONE = "policies-causal-hidden-key-nan-square-sdpa"
WITH_A_MASK = "policies-masked-key-nan-sdpa"
QKV = {"q": (2, 2, 4, 4), "k": (2, 2, 4, 4), "v": (2, 2, 4, 4)}


def _failures(backend, case_id):
    case = real_spec().by_id()[case_id]
    failures = []
    for variant in case.variants:
        for dtype in case.dtypes:
            try:
                run_case(InProcess(backend), case, variant, dtype, GoldenStore())
            except AssertionError as exc:
                failures.append(str(exc))
    return failures


@pytest.mark.parametrize("backend", [TorchBackend, TorchFlashBackend])
def test_the_condition_names_the_call_path(backend):
    declared = declare(backend())
    choice = lambda shapes, **params: policy_for(declared, "sdpa", shapes, params)["masked_key_nan"]  # noqa: E731
    assert choice(QKV, causal="top_left") == "per_row"
    assert choice(QKV, causal="bottom_right") == "per_row"
    assert choice(dict(QKV, mask=(4, 4)), causal="top_left") == "propagates"
    assert choice(QKV, causal="top_left", window=[2, 0]) == "propagates"
    assert choice(dict(QKV, mask=(4, 4))) == "propagates"
    assert policy_for(declare(TorchMathBackend()), "sdpa", QKV,
                      {"causal": "top_left"})["masked_key_nan"] == "propagates"


@pytest.mark.parametrize("case_id", [CAUSAL_ALONE, WITH_A_MASK])
def test_torch_passes_the_nan_key_cases_under_its_conditional_policy(case_id):
    assert not _failures(TorchBackend(), case_id)


class WrongCondition(TorchBackend):
    """per_row declared where a mask is given, instead of where causal is alone."""

    policy_when = [{"when": {"causal": True, "mask": True},
                    "policy": {"masked_key_nan": "per_row"}}]


class NoCondition(TorchBackend):
    """propagates everywhere: the flash kernel's causal path is not declared."""

    policy_when = []


@pytest.mark.parametrize("backend", [WrongCondition, NoCondition])
def test_a_wrong_condition_makes_the_right_case_fail(backend):
    failures = _failures(backend(), CAUSAL_ALONE)
    assert failures and all("under masked_key_nan=propagates" in f for f in failures), failures
