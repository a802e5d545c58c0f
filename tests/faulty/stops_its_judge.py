"""Faulty: sdpa stops the process that started its own (the judge, in an isolated run)
with SIGSTOP, as a kernel that signals its parent by mistake would; StopsItsJudgeOnce
does so on the run's first sdpa call only (a marker file says which, across processes)."""

import os
import signal

from attention_conformance.backends.numpy import NumpyBackend


class StopsItsJudge(NumpyBackend):
    name = "faulty-stops-its-judge"

    def sdpa(self, q, k, v, **kw):
        os.kill(os.getppid(), signal.SIGSTOP)
        return super().sdpa(q, k, v, **kw)


class StopsItsJudgeOnce(NumpyBackend):
    name = "faulty-stops-its-judge-once"

    def sdpa(self, q, k, v, **kw):
        marker = os.path.join(os.environ["FAULTY_MARKERS"], "stopped-once")
        if not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getppid(), signal.SIGSTOP)
        return super().sdpa(q, k, v, **kw)
