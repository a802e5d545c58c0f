"""Calls sent ahead, in the judge: the first calls of the next tests (and the calls their
properties will make) go to the backend's process while the judge checks the test
before, so that the process computes while the judge checks. A call sent ahead answers
only the call that is the very same (Pending.matches); one that hangs or crashes is
blamed on no other test (backend_proxy.py: its own test makes it again)."""

from __future__ import annotations

from itertools import islice

import numpy as np

from ..checking.context import Context
from ..checking.expectations import planned_calls
from ..checking.verdict import case_inputs
from ..model.layout import call_params

#: how many tests' first calls the judge keeps sent ahead to the backend's process: it
#: computes them while the judge checks, and seldom waits idle for a message (waking a
#: sleeping process costs the sender ~50-100 us on a virtual machine)
AHEAD = 4
#: how many calls of a test's properties may be sent ahead beyond AHEAD
PLANNED_ROOM = 2


class Pending:
    """A call sent ahead: it answers a later call with the same op, the same array objects
    (identity: comparing contents would cost what the call saves) and equal params; one
    sent by_content (a property's, whose arrays are built again) any arrays of the same
    dtype, shape and bytes."""

    def __init__(self, call_id, op, arrays, params, size=0, by_content=False):
        self.id, self.op, self.arrays, self.params = call_id, op, dict(arrays), dict(params)
        self.size, self.by_content = size, by_content

    def matches(self, op, arrays, params) -> bool:
        same = _same_bytes if self.by_content else _same
        return (op == self.op and arrays.keys() == self.arrays.keys()
                and all(same(arrays[k], self.arrays[k]) for k in arrays)
                and params.keys() == self.params.keys()
                and all(_same(params[k], self.params[k]) for k in params))


def _same_bytes(a, b) -> bool:
    """Arrays of one dtype, shape and bytes (NaN payloads included); else _same."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a is b or (a.dtype == b.dtype and a.shape == b.shape
                          and a.tobytes() == b.tobytes())
    return _same(a, b)


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return a is b
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def send_first_call(proxy, case, variant, dtype):
    """Send a test's first call ahead, and then the calls its properties will make
    (checks.planned_calls, matched by their inputs' bytes), as far as the proxy takes
    them. What run_case is then given as `prepared` (the same array objects, which is
    how the first call is matched), or None when nothing was sent. A test of the scale
    profile is never sent ahead: its inputs are made when it runs, so that the memory of
    a run is that of one such test."""
    declaration = proxy.declaration
    if dtype not in declaration.dtypes or case.op not in declaration.ops \
            or case.profile == "scale":
        return None
    prepared = case_inputs(case, variant, dtype)
    if not proxy.send_ahead(case.op, prepared[1], call_params(case)):
        return None
    planning = Context(proxy, case, variant, dtype, prepared[1], prepared[0], None, None, None)
    try:
        planned = planned_calls(planning)
    except Exception:            # each property meets the same error when it is checked
        return prepared
    for op, arrays, params in planned:
        if op in declaration.ops and not proxy.send_ahead(op, arrays, params, by_content=True):
            break
    return prepared


class Ahead:
    """The first calls of the tests next in the judge's queue, kept sent ahead as far as
    the proxy takes them, and what each of those tests is given (`prepared`)."""

    def __init__(self, proxy, tests: dict, queue):
        self.proxy, self.tests, self.queue = proxy, tests, queue
        self.prepared = {}          # test id -> send_first_call()'s inputs, or None

    def top_up(self) -> None:
        """Top up once at most one call is left ahead, in one write (a process that sleeps
        is woken once for them all)."""
        if self.proxy.sent_ahead() > 1:
            return
        for test_id in islice(self.queue, self.proxy.ahead + 1):
            if not self.proxy.can_send_ahead():
                break
            if test_id in self.prepared or test_id not in self.tests:
                continue
            try:
                self.prepared[test_id] = send_first_call(self.proxy, *self.tests[test_id])
            except Exception:        # that test meets the same error again, and reports it
                self.prepared[test_id] = None
        self.proxy.flush_ahead()

    def take(self, test_id):
        return self.prepared.pop(test_id, None)
