"""Faulty but correct: loading starts a thread that never ends (not a daemon)."""

import threading
import time

from attention_conformance.backends.numpy import NumpyBackend


class StrayThread(NumpyBackend):
    name = "faulty-stray-thread"

    def __init__(self):
        super().__init__()
        threading.Thread(target=lambda: time.sleep(10**6), daemon=False).start()
