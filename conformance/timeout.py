"""A per-case time limit, so that a hanging backend fails its case and the run goes on."""

from __future__ import annotations

import signal
import threading


class CaseTimeout(AssertionError):
    """The backend did not return within the case time limit."""


class time_limit:
    """``with time_limit(seconds):`` raises CaseTimeout in the block after `seconds`
    (SIGALRM; no limit for 0, off the main thread, or where there is no setitimer)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.usable = bool(seconds) and hasattr(signal, "setitimer") and \
            threading.current_thread() is threading.main_thread()

    def _expire(self, signum, frame):
        raise CaseTimeout(f"the backend did not return within {self.seconds:g} s (--case-timeout)")

    def __enter__(self):
        if self.usable:
            self.previous = signal.signal(signal.SIGALRM, self._expire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc):
        if self.usable:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)
        return False
