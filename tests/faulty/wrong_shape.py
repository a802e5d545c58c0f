"""Faulty: sdpa drops the last query row (an off-by-one in the output slice)."""

from attention_conformance.backends.numpy import NumpyBackend


class WrongShape(NumpyBackend):
    name = "faulty-wrong-shape"

    def sdpa(self, q, k, v, **kw):
        return super().sdpa(q, k, v, **kw)[..., :-1, :]
