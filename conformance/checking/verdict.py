"""One test's outcome as plain data, whichever process judged it: the runner's own
(--in-process), or the judge's, ahead of the runner (judge_process.py).

A verdict is a dict: ``status`` (one of STATUSES), ``message`` (the first line is the
reason), ``seconds`` (the time inside the case), ``ratio`` (the worst error over
tolerance of a pass) and ``cause`` (the end of a traceback behind a failure, or "").
Nothing a backend or a case does makes verdict_of() raise: a hang, a crash, an exception of
the backend's or of the suite's own code each end in a status.
"""

from __future__ import annotations

import contextlib
import time
import traceback

from ..model.errors import BackendCrashed, BackendRaised, CheckFailure, Unsupported
from .run import run_case
from ..backend.timeout import CaseTimeout, time_limit

#: status -> what it means (pytest_cases.py turns each into the test's outcome)
STATUSES = {
    "pass": "every expectation met",
    "fail": "an expectation broken, or the backend raised",
    "unsupported": "the backend lacks the op, a parameter or the dtype",
    "crash": "the backend's process died",
    "timeout": "no answer within the case's time limit",
    "error": "the suite's own code failed on the case: never blamed on the backend",
}


def verdict_of(backend, case, variant, dtype, golden, timeout: float, prepared=None,
               called=None) -> dict:
    """Run one case variant in one dtype and judge it (runner.run_case, which takes
    prepared and called), to a verdict.

    timeout: seconds (0: none), kept by the backend's process when it is isolated (it is
    killed at the deadline, even inside native code), else by a timer in this process."""
    start = time.perf_counter()
    try:
        with _time_limit(backend, timeout):
            result = run_case(backend, case, variant, dtype, golden, prepared, called)
    except Unsupported as exc:
        return _verdict("unsupported", str(exc), start)
    except BackendCrashed as exc:
        return _verdict("crash", str(exc), start)
    except CaseTimeout as exc:
        return _verdict("timeout", str(exc), start)
    except CheckFailure as exc:
        return _verdict("fail", str(exc), start, cause=exc.__cause__)
    except BackendRaised as exc:
        message = f"the backend raised {exc}"
        if exc.remote_traceback:
            message += "\n" + exc.remote_traceback.rstrip()
        return _verdict("fail", message, start, cause=exc.__cause__)
    except Exception as exc:       # the suite's own code: never blamed on the backend
        message = (f"suite error on case {case.id} ({case.where()}): "
                   f"{type(exc).__name__}: {exc}")
        return _verdict("error", message, start, cause=exc, frames=None)
    return _verdict("pass", "", start, ratio=result.worst_ratio)


def _time_limit(backend, seconds: float):
    if not getattr(backend, "isolated", False):
        return time_limit(seconds)
    backend.deadline = time.monotonic() + seconds if seconds else None
    backend.timeout_text = f"the backend did not return within {seconds:g} s (--case-timeout)"
    return contextlib.nullcontext()


def _verdict(status, message, start, ratio=0.0, cause=None, frames=-3) -> dict:
    return {"status": status, "message": message, "seconds": time.perf_counter() - start,
            "ratio": float(ratio), "cause": _traceback(cause, frames)}


def _traceback(exc, frames) -> str:
    """The frames behind a failure (the last `frames`, or all: None), as text: a verdict
    crosses processes."""
    if exc is None:
        return ""
    try:
        return "".join(traceback.format_exception(exc, limit=frames))
    except Exception:
        return f"{type(exc).__name__}: <its traceback could not be formatted>"
