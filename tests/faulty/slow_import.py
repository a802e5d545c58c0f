"""Faulty: importing this adapter takes two minutes (a framework that compiles at import);
a Ctrl-C meanwhile must end the run at once."""

import time

from attention_conformance.backends.numpy import NumpyBackend

time.sleep(120)


class SlowImport(NumpyBackend):
    name = "faulty-slow-import"
