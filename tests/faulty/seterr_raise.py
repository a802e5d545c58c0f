"""Faulty but correct: sdpa leaves NumPy set to raise on every floating-point warning."""

import numpy as np

from attention_conformance.backends.numpy import NumpyBackend


class SetsErrRaise(NumpyBackend):
    name = "faulty-seterr-raise"

    def sdpa(self, q, k, v, **kw):
        out = super().sdpa(q, k, v, **kw)
        np.seterr(all="raise")
        return out
