"""The jax adapter's sdpa and sdpa_vjp show the keywords they take through its wrapper
for rank-3 inputs with lengths (_with_heads, which itself takes **params): a case with a
param they lack is unsupported, never called and failed on a TypeError."""

from __future__ import annotations

import pytest

pytest.importorskip("jax")

from attention_conformance.backend.calling import unaccepted  # noqa: E402
from attention_conformance.backends.jax import JaxBackend  # noqa: E402


@pytest.mark.parametrize("op", ["sdpa", "sdpa_vjp"])
def test_a_param_the_method_lacks_is_unaccepted(op):
    method = getattr(JaxBackend, op)
    assert unaccepted(method, ["not_a_param", "o_scale"]) == ["not_a_param", "o_scale"]
    assert unaccepted(method, ["mask", "causal", "q_lengths", "block_mask"]) == []
