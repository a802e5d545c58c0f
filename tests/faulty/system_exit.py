"""Faulty: sdpa raises SystemExit (sys.exit deep in a library)."""

import sys

from attention_conformance.backends.numpy import NumpyBackend


class SystemExits(NumpyBackend):
    name = "faulty-system-exits"

    def sdpa(self, q, k, v, **kw):
        sys.exit("the kernel gave up")
