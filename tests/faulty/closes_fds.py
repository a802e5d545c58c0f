"""Faulty: sdpa closes every file descriptor above stderr (the suite's socket among
them), then answers as if nothing happened."""

import os

from attention_conformance.backends.numpy import NumpyBackend


class ClosesFds(NumpyBackend):
    name = "faulty-closes-fds"

    def sdpa(self, q, k, v, **kw):
        os.closerange(3, 4096)
        return super().sdpa(q, k, v, **kw)
