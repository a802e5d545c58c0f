"""Faulty: sdpa returns inf in its last output element (an overflow)."""

from attention_conformance.backends.numpy import NumpyBackend


class InfOutput(NumpyBackend):
    name = "faulty-inf-output"

    def sdpa(self, q, k, v, **kw):
        out = super().sdpa(q, k, v, **kw)
        out[..., -1, -1] = float("inf")
        return out
