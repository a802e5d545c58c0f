"""Faulty: importing this adapter takes two minutes (a framework that compiles at import);
a Ctrl-C meanwhile must end the run at once.

With FAULTY_MARKERS=FOLDER in the environment it first creates FOLDER/importing, so that
a test knows the import has started (and need not guess how long start-up takes)."""

import os
import time

from attention_conformance.backends.numpy import NumpyBackend

if os.environ.get("FAULTY_MARKERS"):
    open(os.path.join(os.environ["FAULTY_MARKERS"], "importing"), "w").close()
time.sleep(120)


class SlowImport(NumpyBackend):
    name = "faulty-slow-import"
