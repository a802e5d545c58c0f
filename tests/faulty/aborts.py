"""Faulty: sdpa calls abort() (a failed assertion in native code)."""

import os

from attention_conformance.backends.numpy import NumpyBackend


class Aborts(NumpyBackend):
    name = "faulty-aborts"

    def sdpa(self, q, k, v, **kw):
        os.abort()
