"""Faulty adapters for calls sent ahead (isolation.py's prefetch).

Counts: sdpa answers with the number of sdpa calls its process has computed (so a test
sees which call was computed when), hangs when q starts with 42 and segfaults when it
starts with 13. CrashesOnD8: a correct NumPy backend whose process segfaults in sdpa
when the head dimension is 8 (the D8 variants of a worked example), wherever the call is
in the order the judge sends calls ahead.
"""

import ctypes
import time

import numpy as np

from attention_conformance.backends.numpy import NumpyBackend


class Counts(NumpyBackend):
    name = "faulty-counts"
    calls = 0

    def sdpa(self, q, k, v, **kw):
        if q.flat[0] == 42:
            while True:
                time.sleep(1000)
        if q.flat[0] == 13:
            ctypes.string_at(0)
        Counts.calls += 1
        return np.full(q.shape, Counts.calls, dtype=q.dtype)


class CrashesOnD8(NumpyBackend):
    name = "faulty-crashes-on-d8"

    def sdpa(self, q, k, v, **kw):
        if q.shape[-1] == 8:
            ctypes.string_at(0)
        return super().sdpa(q, k, v, **kw)
