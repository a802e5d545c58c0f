"""A backend called in the suite's own process: `--in-process` (for a debugger), fuzzing,
and the suite's own tests. Not isolated: a crash ends the process, and the adapter can
reach the checks. An isolated run calls the backend through process/ instead, with the
same two methods: test() (one test's calls, under --case-timeout) and call()."""

from __future__ import annotations

import contextlib
import signal
import threading

from ..model.errors import CaseTimeout
from .calling import output_tuple
from .distributed import dispatch
from .interface import declare


class InProcess:
    def __init__(self, adapter, timeout: float = 0.0):
        """timeout: --case-timeout, the seconds all the calls of one test may take (0: none)."""
        self.adapter, self.timeout = adapter, timeout
        self.declaration = declare(adapter)

    @contextlib.contextmanager
    def test(self, factor: float = 1.0):
        """One test's calls: CaseTimeout once they have taken `timeout` seconds together
        (`factor` times that: a case of the scale profile, model/case.py)."""
        with time_limit(self.timeout * factor):
            yield self

    def call(self, op: str, arrays: dict, params: dict) -> tuple:
        """The op's raw outputs, as a tuple (the errors of calling.invoke; a sharded
        call's, distributed.dispatch, and RankCrashed)."""
        return output_tuple(op, arrays, dispatch(self.adapter, op, arrays, params))


def timeout_text(seconds: float) -> str:
    return (f"the backend did not finish this test's calls within {seconds:g} s "
            "(--case-timeout bounds all the calls of one test together)")


@contextlib.contextmanager
def time_limit(seconds: float):
    """A timer in this process (SIGALRM), where one can run: the main thread of a Unix
    process. It cannot interrupt native code that holds the interpreter: only an
    isolated run (process/) can kill a backend stuck there."""
    usable = seconds and hasattr(signal, "setitimer") and \
        threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise CaseTimeout(timeout_text(seconds))

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
