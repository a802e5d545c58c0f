"""A faulty adapter whose sdpa kills the process that started its own: the process
that runs it and checks its outputs (the judge's, in an isolated run)."""

import os
import signal

from attention_conformance.backends.numpy import NumpyBackend


class KillsItsRunner(NumpyBackend):
    name = "faulty-kills-its-runner"

    def sdpa(self, q, k, v, **kw):
        os.kill(os.getppid(), signal.SIGKILL)
        return super().sdpa(q, k, v, **kw)


class KillsItsRunnerInWeights(NumpyBackend):
    """Kills it in attention_weights: the weights tests run after the sdpa tests, so their
    first call, sent ahead, kills the judge while it checks the last sdpa test."""

    name = "faulty-kills-its-runner-in-weights"

    def attention_weights(self, q, k, **kw):
        os.kill(os.getppid(), signal.SIGKILL)
        return super().attention_weights(q, k, **kw)
