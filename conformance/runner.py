"""Running one case variant in one dtype on one backend, and judging the result."""

from __future__ import annotations

from .calling import call_checked, cast_inputs, checked_outputs
from .checks import Result, judge
from .context import Context
from .golden_compute import rounded_inputs
from .outcomes import Unsupported

__all__ = ["Result", "run_case"]


def run_case(backend, case, variant, dtype, golden) -> Result:
    """Run and judge; raises Unsupported or CheckFailure, returns Result on a pass.

    golden: the GoldenStore of the spec folder (it carries the folder's tolerances)."""
    if dtype not in set(getattr(backend, "dtypes", ())):
        raise Unsupported(f"backend does not declare dtype {dtype}")
    exact_inputs = rounded_inputs(case, variant, dtype)
    arrays = cast_inputs(exact_inputs, dtype)
    raw = call_checked(backend, case.op, arrays, case.params)
    outputs = checked_outputs(case.op, raw, arrays, case.params, dtype)
    ctx = Context(backend, case, variant, dtype, arrays, exact_inputs, outputs, golden,
                  golden.tolerances)
    return judge(ctx)
