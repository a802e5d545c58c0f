"""Faulty: in the first sharded call of the whole run (a marker file says which came
first, across processes), rank 1 is killed by SIGKILL in the middle of the ring, while
rank 0 waits on it in a collective; every later call is correct."""

import os
import signal

from attention_conformance.backends.torch_ring import TorchRingBackend


class RankKilled(TorchRingBackend):
    name = "faulty-rank-killed"

    def _skips(self, ring, source, allowed):
        marker = os.path.join(os.environ["FAULTY_MARKERS"], "rank-killed")
        if ring["rank"] == 1 and source != 1 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return super()._skips(ring, source, allowed)
