"""Faulty: sdpa prints terminal escape sequences (clear the screen, red text, a bell)
and then segfaults: its last output reaches the crash's message."""

import ctypes
import sys

from attention_conformance.backends.numpy import NumpyBackend


class PrintsEscapes(NumpyBackend):
    name = "faulty-prints-escapes"

    def sdpa(self, q, k, v, **kw):
        sys.stdout.write("\x1b[2J\x1b[31mred alert\x07\x1b]0;title\x07 after\n")
        sys.stdout.flush()
        ctypes.string_at(0)
