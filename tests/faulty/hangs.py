"""Faulty: sdpa never returns (a deadlocked kernel); only the per-case timeout ends it.

With FAULTY_HANGS_MARKER=PATH in the environment it first creates PATH, so that a test
knows the call has started (and need not guess how long start-up takes)."""

import os
import time

from attention_conformance.backends.numpy import NumpyBackend


class Hangs(NumpyBackend):
    name = "faulty-hangs"

    def sdpa(self, q, k, v, **kw):
        marker = os.environ.get("FAULTY_HANGS_MARKER")
        if marker:
            open(marker, "w").close()
        time.sleep(1000)
