"""Faulty: sdpa dereferences a null pointer (a kernel that segfaults)."""

import ctypes

from attention_conformance.backends.numpy import NumpyBackend


class Segfaults(NumpyBackend):
    name = "faulty-segfaults"

    def sdpa(self, q, k, v, **kw):
        ctypes.string_at(0)
