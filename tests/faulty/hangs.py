"""Faulty: sdpa never returns (a deadlocked kernel); only the per-case timeout ends it."""

import time

from attention_conformance.backends.numpy import NumpyBackend


class Hangs(NumpyBackend):
    name = "faulty-hangs"

    def sdpa(self, q, k, v, **kw):
        time.sleep(1000)
