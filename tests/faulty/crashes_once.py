"""Faulty: the first sdpa call of the whole run segfaults (a marker file says which
call came first, across processes); every later call is correct."""

import ctypes
import os

from attention_conformance.backends.numpy import NumpyBackend


class CrashesOnce(NumpyBackend):
    name = "faulty-crashes-once"

    def sdpa(self, q, k, v, **kw):
        marker = os.path.join(os.environ["FAULTY_MARKERS"], "crashed-once")
        if not os.path.exists(marker):
            open(marker, "w").close()
            ctypes.string_at(0)
        return super().sdpa(q, k, v, **kw)
