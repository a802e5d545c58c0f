"""Faulty: in the first sharded call of the whole run (a marker file says which came
first, across processes), rank 1 never joins the ring (it waits forever with every signal
blocked, as a deadlock in native code does) while rank 0 waits on it in a collective;
every later call is correct."""

import os
import signal
import time

from attention_conformance.backends.torch_ring import TorchRingBackend


class RankHangs(TorchRingBackend):
    name = "faulty-rank-hangs"

    def _skips(self, ring, source, allowed):
        marker = os.path.join(os.environ["FAULTY_MARKERS"], "rank-hung")
        if ring["rank"] == 1 and source != 1 and not os.path.exists(marker):
            open(marker, "w").close()
            signal.pthread_sigmask(signal.SIG_BLOCK, set(signal.Signals) - {signal.SIGKILL, signal.SIGSTOP})
            while True:
                time.sleep(1000)
        return super()._skips(ring, source, allowed)
