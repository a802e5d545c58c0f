"""Running one case variant in one dtype on one backend, and judging the result."""

from __future__ import annotations

from .calling import call_arguments, call_checked, cast_inputs, checked_outputs
from .checks import Result, judge
from .context import Context
from .golden_compute import rounded_inputs
from .outcomes import Unsupported

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
    return judge(ctx)


def send_ahead(backend, case, variant, dtype):
    """Send the first call of a test to an isolated backend before the test runs, so that
    its process computes it while the test before is checked. What run_case is
    then given as `prepared` (the same array objects, which is how the call is matched),
    or None when nothing was sent."""
    if dtype not in set(backend.dtypes) or getattr(backend, case.op, None) is None:
        return None
    prepared = _inputs(case, variant, dtype)
    positional, keywords = call_arguments(case.op, prepared[1])
    return prepared if backend.prefetch(case.op, positional, {**keywords, **case.params}) \
        else None


def _inputs(case, variant, dtype):
    exact_inputs = rounded_inputs(case, variant, dtype)
    return exact_inputs, cast_inputs(exact_inputs, dtype)
