"""One test run and judged: its inputs, its calls, the contract of its outputs, every
expectation of its case, and its outcome as plain data (a verdict), whichever process
judged it: the runner's own (--in-process), or the judge's, ahead of the runner (process/).

A verdict is a dict: ``status`` (one of STATUSES), ``message`` (the first line is the
reason), ``seconds`` (the time inside the case), ``ratio`` (the worst error over
tolerance of a pass) and ``cause`` (the end of a traceback behind a failure, or "").
Nothing a backend or a case does makes verdict_of() raise: a hang, a crash, an exception of
the backend's or of the suite's own code each end in a status.
"""

from __future__ import annotations

import time
import traceback

from ..backend.calling import cast_inputs, checked_outputs
from ..golden.compute import generated_inputs, rounded_inputs, shares_rounded
from ..golden.store import GoldenError
from ..model.errors import BackendCrashed, BackendRaised, CaseTimeout, CheckFailure, Unsupported
from ..model.case import timeout_factor
from ..model.dtypes import rounded_and_cast
from ..model.layout import call_params
from ..model.text import printable
from . import invariance
from .context import Context
from .expectations import Result, check_case

#: status -> what it means (pytest_cases.py turns each into the test's outcome)
STATUSES = {
    "pass": "every expectation met",
    "fail": "an expectation broken, or the backend raised",
    "unsupported": "the backend lacks the op, a parameter or the dtype",
    "crash": "the backend's process died",
    "timeout": "no answer within the case's time limit",
    "error": "the suite's own code failed on the case, or its golden data are missing or "
             "broken: never blamed on the backend",
}


def case_inputs(case, variant, dtype) -> tuple[dict, dict]:
    """(the exact float64 inputs, the inputs as the backend receives them): rounded_inputs
    and their cast, made from one cast of each input (bit for bit the same)."""
    dtypes = case.input_dtypes(dtype)
    if shares_rounded(case):
        exact_inputs = rounded_inputs(case, variant, dtype)
        return exact_inputs, cast_inputs(exact_inputs, dtype, dtypes)
    return rounded_and_cast(generated_inputs(case, variant), dtypes)


def run_case(caller, case, variant, dtype, golden, prepared=None, called=None) -> Result:
    """Run and judge; raises Unsupported or CheckFailure, returns Result on a pass.

    caller: the backend for this test (.declaration, .call(op, arrays, params)).
    golden: the GoldenStore of the spec folder (it carries the folder's tolerances).
    prepared: case_inputs() of this very test, if they were built already (for a call
    sent ahead: the same array objects are how that call is matched).
    called: called once the backend has answered the test's first call, before its
    outputs are checked (the judge sends the next tests' calls ahead then)."""
    if dtype not in caller.declaration.dtypes:
        why = caller.declaration.dtype_notes.get(dtype)
        raise Unsupported(f"backend does not declare dtype {dtype}" + (f": {why}" if why else ""))
    undeclared = invariance.undeclared(case, caller.declaration)
    if undeclared:
        raise Unsupported(undeclared)
    exact_inputs, arrays = prepared or case_inputs(case, variant, dtype)
    raw = caller.call(case.op, arrays, call_params(case))   # with the case's layout, if any
    if called is not None:
        called()
    outputs = checked_outputs(case.op, raw, arrays, case.params, dtype)
    return check_case(Context(caller, case, variant, dtype, arrays, exact_inputs, outputs,
                              golden, golden.tolerances))


def verdict_of(backend, case, variant, dtype, golden, prepared=None, called=None) -> dict:
    """Run one case variant in one dtype and judge it (run_case, which takes prepared and
    called), to a verdict. backend: what runs one test's calls under --case-timeout
    (backend/in_process.InProcess, or the judge's process/backend_proxy.BackendProxy)."""
    start = time.perf_counter()
    try:
        with backend.test(timeout_factor(case)) as caller:
            result = run_case(caller, case, variant, dtype, golden, prepared, called)
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
    except GoldenError as exc:     # the spec folder's golden data: never the backend's
        return _verdict("error", f"golden data: {exc}", start)
    except Exception as exc:       # the suite's own code: never blamed on the backend
        message = (f"suite error on case {case.id} ({case.where()}): "
                   f"{type(exc).__name__}: {exc}")
        return _verdict("error", message, start, cause=exc, frames=None)
    return _verdict("pass", "", start, ratio=result.worst_ratio)


def _verdict(status, message, start, ratio=0.0, cause=None, frames=-3) -> dict:
    """A verdict; its texts hold what a backend said, shown safe for a terminal."""
    return {"status": status, "message": printable(message),
            "seconds": time.perf_counter() - start, "ratio": float(ratio),
            "cause": printable(_traceback(cause, frames))}


def _traceback(exc, frames) -> str:
    """The frames behind a failure (the last `frames`, or all: None), as text: a verdict
    crosses processes."""
    if exc is None:
        return ""
    try:
        return "".join(traceback.format_exception(exc, limit=frames))
    except Exception:
        return f"{type(exc).__name__}: <its traceback could not be formatted>"
