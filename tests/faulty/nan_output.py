"""Faulty: sdpa returns NaN in its first output element (an uninitialised buffer)."""

from attention_conformance.backends.numpy import NumpyBackend


class NanOutput(NumpyBackend):
    name = "faulty-nan-output"

    def sdpa(self, q, k, v, **kw):
        out = super().sdpa(q, k, v, **kw)
        out[..., 0, 0] = float("nan")
        return out
