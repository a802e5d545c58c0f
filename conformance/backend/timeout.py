"""A per-case time limit, so that a hanging backend fails its case and the run goes on."""

from __future__ import annotations

import contextlib
import signal
import threading


class CaseTimeout(BaseException):
    """The backend did not return within the case time limit.

    A BaseException, as KeyboardInterrupt is: an adapter's `except Exception` must not
    swallow it and return as if it had finished."""


@contextlib.contextmanager
def time_limit(seconds: float):
    usable = seconds and hasattr(signal, "setitimer") and \
        threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise CaseTimeout(f"the backend did not return within {seconds:g} s (--case-timeout)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
