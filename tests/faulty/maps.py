"""Faulty but correct: every call maps memory it never unmaps (as a JIT compiler keeps
the code of each program it compiled), slowly (a compile takes a while)."""

import mmap
import time

from attention_conformance.backends.numpy import NumpyBackend

MAPS_A_CALL = 1000
SECONDS_A_CALL = 0.25


class LeaksMaps(NumpyBackend):
    name = "faulty-leaks-maps"
    kept = []

    def softmax(self, x, **kw):
        for i in range(MAPS_A_CALL):      # private, two protections in turn: none merge
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if i % 2 else 0)
            LeaksMaps.kept.append(mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE,
                                            prot=prot))
        time.sleep(SECONDS_A_CALL)
        return super().softmax(x, **kw)
