"""Faulty: sdpa ends its process at once (os._exit), as a library calling exit() does."""

import os

from attention_conformance.backends.numpy import NumpyBackend


class Exits(NumpyBackend):
    name = "faulty-exits"

    def sdpa(self, q, k, v, **kw):
        os._exit(3)
