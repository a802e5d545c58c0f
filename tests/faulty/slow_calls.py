"""Faulty but correct: every sdpa call takes 0.7 s (a slow kernel); with a test's
property calling again, a test makes two of them."""

import time

from attention_conformance.backends.numpy import NumpyBackend


class SlowCalls(NumpyBackend):
    name = "faulty-slow-calls"

    def sdpa(self, q, k, v, **kw):
        time.sleep(0.7)
        return super().sdpa(q, k, v, **kw)
