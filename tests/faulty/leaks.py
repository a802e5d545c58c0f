"""Faulty but correct: every call keeps 64 MiB it never frees (a leak)."""

import numpy as np

from attention_conformance.backends.numpy import NumpyBackend

LEAK_MIB = 64


class Leaks(NumpyBackend):
    name = "faulty-leaks"
    kept = []

    def _keep(self):
        Leaks.kept.append(np.ones(LEAK_MIB * 2**20 // 8))    # written: resident memory

    def sdpa(self, q, k, v, **kw):
        self._keep()
        return super().sdpa(q, k, v, **kw)

    def attention_weights(self, q, k, **kw):
        self._keep()
        return super().attention_weights(q, k, **kw)

    def softmax(self, x, **kw):
        self._keep()
        return super().softmax(x, **kw)
