"""Faulty but correct: every sdpa call leaves processes behind that try to outlive the
run: a child in its own process group, one in a new session, and a grandchild whose
parent exits at once (a double fork). Each sleeps for an hour."""

import os
import subprocess
import sys

from attention_conformance.backends.numpy import NumpyBackend

SLEEP = [sys.executable, "-c", "import time; time.sleep(3600)"]


class LeavesChildren(NumpyBackend):
    name = "faulty-leaves-children"

    def sdpa(self, q, k, v, **kw):
        subprocess.Popen(SLEEP)
        subprocess.Popen(SLEEP, start_new_session=True)
        if os.fork() == 0:                          # the double fork: this child's child
            if os.fork() == 0:                      # is left to whoever adopts orphans
                os.setsid()
                os.execv(sys.executable, SLEEP)
            os._exit(0)
        return super().sdpa(q, k, v, **kw)
