"""Not faulty: an adapter whose sdpa answers with what it received of q (its strides, its
first element's offset from 16-byte alignment, its values) and the names of the params
it was given, to show where a case's layout is made (tests/interface/test_layout.py)."""

import numpy as np

from attention_conformance.backends.numpy import NumpyBackend


class StridesEcho(NumpyBackend):
    name = "strides-echo"

    def sdpa(self, q, k, v, **params):
        return (list(q.strides), q.ctypes.data % 16, sorted(params), np.array(q))
