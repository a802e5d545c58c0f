"""Faulty: sdpa swallows whatever interrupts it and returns zeros, then cancels any
timer it can find: a time limit kept in its own process would let it pass."""

import signal
import time


from attention_conformance.backends.numpy import NumpyBackend


class SwallowsTimeout(NumpyBackend):
    name = "faulty-swallows-timeout"

    def sdpa(self, q, k, v, **kw):
        try:
            time.sleep(1000)
        except BaseException:
            pass
        signal.setitimer(signal.ITIMER_REAL, 0)
        return super().sdpa(q, k, v, **kw)
