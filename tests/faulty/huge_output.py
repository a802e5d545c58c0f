"""Faulty: sdpa returns an output of 2 GiB (a view that holds 4 bytes: broadcast)."""

import numpy as np

from attention_conformance.backends.numpy import NumpyBackend


class HugeOutput(NumpyBackend):
    name = "faulty-huge-output"

    def sdpa(self, q, k, v, **kw):
        return np.broadcast_to(np.float32(0), (1 << 29,))
