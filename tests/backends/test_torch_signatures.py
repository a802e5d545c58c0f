"""The torch kernel backends' overrides (torch-math, torch-flash, torch-efficient,
torch-cudnn: softcap refused, the rest handed on as **params) show the keywords of torch's
own methods: a case with a param those lack is unsupported, never called and failed."""

from __future__ import annotations

import inspect

import pytest

pytest.importorskip("torch")

from attention_conformance.backend.calling import unaccepted  # noqa: E402
from attention_conformance.backends import torch_kernels  # noqa: E402
from attention_conformance.backends.torch import TorchBackend  # noqa: E402

KERNELS = [torch_kernels.TorchMathBackend, torch_kernels.TorchFlashBackend,
           torch_kernels.TorchEfficientBackend, torch_kernels.TorchCudnnBackend]


@pytest.mark.parametrize("op", ["attention_weights", "sdpa", "sdpa_vjp"])
@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.name)
def test_an_override_takes_the_keywords_of_torchs_own_method(kernel, op):
    method = getattr(kernel, op)
    assert inspect.signature(method) == inspect.signature(getattr(TorchBackend, op))
    assert unaccepted(method, ["not_a_param", "softcap", "mask"]) == ["not_a_param"]
