"""What can come of running a case, besides a pass: the exceptions every layer shares."""

from __future__ import annotations


class Unsupported(NotImplementedError):
    """The backend lacks an op, a parameter or a dtype: the test is reported unsupported.

    A backend may raise any NotImplementedError; adapters that import the suite can
    raise this one to say so explicitly. The runner raises it for an undeclared dtype."""


class CheckFailure(AssertionError):
    """The backend's result breaks an expectation of the case (or the interface)."""


class SuiteError(Exception):
    """The suite's own code failed on a case that validation accepted: a suite bug,
    reported as such with the case, never blamed on the backend."""


class BackendCrashed(Exception):
    """The backend's own process died during a call (a signal, an exit), or broke the
    protocol (an answer to another call, bytes that are no message) and was killed."""


class CaseTimeout(BaseException):
    """The backend did not finish a test's calls within --case-timeout.

    A BaseException, as KeyboardInterrupt is: an adapter's `except Exception` must not
    swallow it and return as if it had finished."""


class BackendRaised(Exception):
    """The backend's own code raised (anything but NotImplementedError): the test fails
    with that exception, which is this one's __cause__."""

    def __init__(self, exc: BaseException | None = None):
        super().__init__(f"{type(exc).__name__}: {_text(exc)}" if exc is not None else "")
        self.remote_traceback = ""

    @classmethod
    def remote(cls, text: str, traceback: str = "") -> "BackendRaised":
        """What the backend's own process raised, as it described it."""
        raised = cls()
        raised.args = (text,)
        raised.remote_traceback = traceback
        return raised


def _text(exc: BaseException) -> str:
    """str(exc), even for an exception whose __str__ raises."""
    try:
        return str(exc)
    except Exception as inner:
        return f"<its __str__ raised {type(inner).__name__}>"
