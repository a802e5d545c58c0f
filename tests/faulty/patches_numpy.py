"""Faulty: sdpa returns zeros and patches NumPy (np.abs gives zeros, so every error
looks like 0) and the suite's own comparison: checks in its process would pass it."""

import numpy as np

from attention_conformance.backends.numpy import NumpyBackend


class PatchesNumpy(NumpyBackend):
    name = "faulty-patches-numpy"

    def sdpa(self, q, k, v, **kw):
        out = super().sdpa(q, k, v, **kw)
        np.abs = lambda x, *a, **k: np.zeros_like(x)
        try:
            from attention_conformance.checking import comparison
            comparison.worst_error = lambda actual, expected: (0.0, (), "")
        except ImportError:
            pass
        return np.zeros_like(out)
