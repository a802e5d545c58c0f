"""Faulty: sdpa returns its (correct) values as an np.matrix, an ndarray subclass."""

import numpy as np

from attention_conformance.backends.numpy import NumpyBackend


class MatrixOutput(NumpyBackend):
    name = "faulty-matrix-output"

    def sdpa(self, q, k, v, **kw):
        return np.asmatrix(super().sdpa(q, k, v, **kw))
