"""Faulty: sdpa returns nested Python lists (out.tolist()) instead of an array."""

from attention_conformance.backends.numpy import NumpyBackend


class PlainList(NumpyBackend):
    name = "faulty-plain-list"

    def sdpa(self, q, k, v, **kw):
        return super().sdpa(q, k, v, **kw).tolist()
