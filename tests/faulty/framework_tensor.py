"""Faulty: sdpa returns its framework's tensor instead of a NumPy array (no .numpy()).

`Tensor` stands in for torch.Tensor without importing torch: like the real one it
converts with np.asarray, which is exactly why the runner must refuse it explicitly.
"""

import numpy as np

from attention_conformance.backends.numpy import NumpyBackend


class Tensor:
    __module__ = "torch"

    def __init__(self, array):
        self._array = array

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self._array, dtype=dtype)


class FrameworkTensor(NumpyBackend):
    name = "faulty-framework-tensor"

    def sdpa(self, q, k, v, **kw):
        return Tensor(super().sdpa(q, k, v, **kw))
