"""Faulty: sdpa always returns float64 (it never casts back to the input dtype)."""

import numpy as np

from attention_conformance.backends.numpy import NumpyBackend


class WrongDtype(NumpyBackend):
    name = "faulty-wrong-dtype"

    def sdpa(self, q, k, v, **kw):
        return super().sdpa(q, k, v, **kw).astype(np.float64)
