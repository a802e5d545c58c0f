"""Running one case variant in one dtype on one backend, and judging the result."""

from __future__ import annotations

from ..backend.calling import call_arguments, call_checked, cast_inputs, checked_outputs
from .expectations import Result, check_case, planned_calls
from .context import Context
from ..golden.compute import rounded_inputs
from ..model.errors import Unsupported

__all__ = ["Result", "run_case", "send_ahead"]


def run_case(backend, case, variant, dtype, golden, prepared=None, called=None) -> Result:
    """Run and judge; raises Unsupported or CheckFailure, returns Result on a pass.

    golden: the GoldenStore of the spec folder (it carries the folder's tolerances).
    prepared: what send_ahead returned for this very test, if anything.
    called: called once the backend has answered the test's first call, before its
    outputs are checked (the judge sends the next test's first call ahead then)."""
    if dtype not in set(getattr(backend, "dtypes", ())):
        raise Unsupported(f"backend does not declare dtype {dtype}")
    exact_inputs, arrays = prepared or _inputs(case, variant, dtype)
    raw = call_checked(backend, case.op, arrays, case.params)
    if called is not None:
        called()
    outputs = checked_outputs(case.op, raw, arrays, case.params, dtype)
    ctx = Context(backend, case, variant, dtype, arrays, exact_inputs, outputs, golden,
                  golden.tolerances)
    return check_case(ctx)


def send_ahead(backend, case, variant, dtype):
    """Send the first call of a test to an isolated backend before the test runs, so that
    its process computes it while the test before is checked, and the calls its
    properties will make after it (matched by their inputs' bytes), as far as the
    backend takes them. What run_case is then given as `prepared` (the same array
    objects, which is how the first call is matched), or None when nothing was sent."""
    if dtype not in set(backend.dtypes) or getattr(backend, case.op, None) is None:
        return None
    prepared = _inputs(case, variant, dtype)
    positional, keywords = call_arguments(case.op, prepared[1])
    if not backend.prefetch(case.op, positional, {**keywords, **case.params}):
        return None
    _send_planned(backend, Context(backend, case, variant, dtype, prepared[1], prepared[0],
                                   None, None, None))
    return prepared


def _send_planned(backend, ctx) -> None:
    """Send the calls the test's properties will make (checks.planned_calls) after its
    first, as far as the backend takes them."""
    try:
        planned = planned_calls(ctx)
    except Exception:            # each property meets the same error when it is checked
        return
    for op, arrays, params in planned:
        if getattr(backend, op, None) is None:
            continue
        positional, keywords = call_arguments(op, arrays)
        if not backend.prefetch(op, positional, {**keywords, **params}, by_content=True):
            return


def _inputs(case, variant, dtype):
    exact_inputs = rounded_inputs(case, variant, dtype)
    return exact_inputs, cast_inputs(exact_inputs, dtype)
