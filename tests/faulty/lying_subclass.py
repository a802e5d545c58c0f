"""Faulty: sdpa returns an ndarray subclass whose arithmetic lies (every difference 0)."""

import numpy as np

from attention_conformance.backends.numpy import NumpyBackend


class Liar(np.ndarray):
    def __sub__(self, other):
        return np.zeros(self.shape)

    __rsub__ = __sub__

    def astype(self, *args, **kwargs):
        return self


class LyingSubclass(NumpyBackend):
    name = "faulty-lying-subclass"

    def sdpa(self, q, k, v, **kw):
        return np.zeros_like(super().sdpa(q, k, v, **kw)).view(Liar)
