"""Faulty: sdpa waits forever with every signal blocked, as a deadlock in native code
does: no timer in its own process can interrupt it."""

import signal
import time

from attention_conformance.backends.numpy import NumpyBackend


class Deadlocks(NumpyBackend):
    name = "faulty-deadlocks"

    def sdpa(self, q, k, v, **kw):
        signal.pthread_sigmask(signal.SIG_BLOCK, set(signal.Signals) - {signal.SIGKILL, signal.SIGSTOP})
        while True:
            time.sleep(1000)
