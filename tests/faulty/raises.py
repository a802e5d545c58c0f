"""Faulty: sdpa raises an error of its framework (a kernel that crashes)."""

from attention_conformance.backends.numpy import NumpyBackend


class Raises(NumpyBackend):
    name = "faulty-raises"

    def sdpa(self, q, k, v, **kw):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
