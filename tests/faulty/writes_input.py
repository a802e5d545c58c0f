"""Faulty: sdpa scales q in place (q *= scale, a tempting saving) and so changes its input."""

import numpy as np

from attention_conformance.backends.numpy import NumpyBackend


class WritesInput(NumpyBackend):
    name = "faulty-writes-input"

    def sdpa(self, q, k, v, *, scale=None, **kw):
        q *= q.dtype.type(1.0 / np.sqrt(q.shape[-1]) if scale is None else scale)
        return super().sdpa(q, k, v, scale=1.0, **kw)
