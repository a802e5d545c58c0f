"""Faulty: every sdpa call forks, and both processes return the (correct) outputs, as a
kernel that starts a worker by fork and forgets to end it in the child would."""

import os

from attention_conformance.backends.numpy import NumpyBackend


class Forks(NumpyBackend):
    name = "faulty-forks"

    def sdpa(self, q, k, v, **kw):
        os.fork()
        return super().sdpa(q, k, v, **kw)
