"""The judge: ``python -m attention_conformance.process.judge_host FD OPTIONS`` (OPTIONS: the
JSON of launch.judge_options()).

An isolated certification run (pytest_cases.py) starts it as early as it starts
anything, and asks it for the tests it will run, in their order. The judge runs and
judges them ahead of the run, each as verdict.verdict_of does in-process, and answers
each with its verdict, while the run's own process reports the tests before: the checks
of one test and pytest's report of another take two cores. It is the suite's own code;
the backend runs in a process of the judge's own (isolation.py), started first thing,
before this process imports NumPy and loads the spec, so that the framework's import
overlaps both.

Messages (wire.py): runner -> judge {"run": [test id, ...], "timeout": seconds} and
{"stop": true}; judge -> runner {"declared": {...}} or {"load_error": "..."} once, then
{"verdicts": [[test id, {...}], ...]} for the tests asked, in the order asked
(_Answers). A test id is ``topic/`` + case.test_name().
"""

from __future__ import annotations

import gc
import json
import signal
import sys
import time
from collections import deque
from itertools import islice
from multiprocessing.connection import Connection

from .spawn import end_with_parent, kill_group, launch, log_file, remove_log
from ..model.errors import BackendCrashed        # standard library alone, as launch

#: how many tests' first calls the judge keeps sent ahead to the backend's process: it
#: computes them while the judge checks, and seldom waits idle for a message (waking a
#: sleeping process costs the sender ~50-100 us on a virtual machine)
AHEAD = 4


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, _ignore)   # Ctrl-C is the runner's (not SIG_IGN: the
    # backend's process would inherit that, and never see a KeyboardInterrupt)
    signal.signal(signal.SIGTERM, _exit)                # the runner's close(): clean up
    end_with_parent()
    conn, options = Connection(int(argv[0])), json.loads(argv[1])
    log = log_file(options.get("log_dir"))
    launched, backend = (*launch(options["reference"], options.get("device"), log), log), None
    try:
        from . import wire                              # the backend is loading meanwhile
        from .backend_proxy import IsolatedBackend
        backend = IsolatedBackend(options["reference"], device=options.get("device"), ahead=AHEAD,
                                  restart_every=options.get("restart_every") or 0,
                                  restart_above_mib=options.get("restart_above_mib") or 0,
                                  log_dir=options.get("log_dir"), wait=False, launched=launched)
        loaded = _load(backend, options.get("spec_dir"))
        wire.send(conn, loaded[0])
        if "declared" in loaded[0]:
            gc.freeze()         # the spec stays: collections need not walk it again
            serve(conn, backend, *loaded[1:])
    except (EOFError, OSError):                         # the runner has gone
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # nothing cuts the clean-up short
        if backend is not None:
            backend.close(wait=False)
        else:
            kill_group(launched[0])
            remove_log(log)
    return 0


def _ignore(signum, frame):
    pass


def _exit(signum, frame):
    """SIGTERM (the runner's close(), maybe mid-test): end through main's clean-up."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(0)


def _load(backend, spec_dir) -> tuple:
    """(the first message, the tests by id, the golden store): the spec loads while the
    backend's process imports its framework."""
    from ..golden.store import GoldenStore
    from ..backend.resolve import BackendLoadError
    from ..model.folder import SpecFolder
    from ..specs.loader import load_spec
    from ..backend.timeout import CaseTimeout
    try:
        folder = SpecFolder.from_option(spec_dir)
        tests, golden = tests_by_id(load_spec(folder, cache=True)), GoldenStore.of(folder)
    except Exception as exc:
        return ({"load_error": f"the judge could not load the spec: {type(exc).__name__}: {exc}"},)
    try:
        backend.wait_loaded()
    except (BackendLoadError, BackendCrashed, CaseTimeout) as exc:
        return ({"load_error": str(exc)},)
    return {"declared": backend.declared}, tests, golden


def tests_by_id(spec) -> dict:
    """test id -> (case, variant, dtype), for every test of every profile."""
    from ..model.case import test_name
    return {f"{case.topic}/{test_name(case, variant, dtype)}": (case, variant, dtype)
            for case in spec.cases for variant in case.variants for dtype in case.dtypes}


def serve(conn, backend, tests: dict, golden) -> None:
    """Judge the tests asked, in order, until told to stop. The first calls of the tests
    next in line are kept sent to the backend's process (_Ahead), so that it computes them
    while the judge checks the test before."""
    from . import wire
    from ..checking.verdict import verdict_of
    queue, timeout, answers = deque(), 0.0, _Answers(conn)
    ahead = _Ahead(backend, tests, queue)
    backend.before_wait = answers.flush         # no verdict waits on a slow backend
    while True:
        if not queue:
            answers.flush()                     # nor on the runner's next request
        while not queue or wire.ready(conn, 0):     # take what was asked, waiting if idle
            message = wire.receive(conn)
            if message.get("stop"):
                return
            queue.extend(message.get("run", ()))
            timeout = message.get("timeout", timeout)
        test_id = queue.popleft()
        prepared = ahead.take(test_id)
        if test_id in tests:
            verdict = verdict_of(backend, *tests[test_id], golden, timeout, prepared, ahead.send)
        else:
            verdict = _unknown(test_id)
        ahead.send()                # if the test made no call, or more were asked since
        answers.add(test_id, verdict)


class _Answers:
    """Verdicts sent in batches: after FLUSH_SECONDS of judging at most, whenever the judge
    waits for the runner's next request, and once the backend's answer has kept it
    waiting (isolation.WAIT_BRIEFLY). Each message wakes the runner's process, which
    costs the judge ~50-100 us on a virtual machine, and the judge's time is the run's."""

    FLUSH_SECONDS = 0.001

    def __init__(self, conn):
        from . import wire
        self.send = lambda message: wire.send(conn, message)
        self.batch, self.since = [], 0.0

    def add(self, test_id, verdict):
        if not self.batch:
            self.since = time.monotonic()
        self.batch.append([test_id, verdict])
        if time.monotonic() - self.since >= self.FLUSH_SECONDS:
            self.flush()

    def flush(self):
        if self.batch:
            batch, self.batch = self.batch, []
            self.send({"verdicts": batch})


class _Ahead:
    """The first calls of the tests next in the queue, sent ahead as far as the backend
    takes them (IsolatedBackend.ahead), and what each of those tests is given (`prepared`)."""

    def __init__(self, backend, tests, queue):
        from ..checking.run import send_ahead
        self.backend, self.tests, self.queue = backend, tests, queue
        self.send_ahead = send_ahead
        self.prepared = {}          # test id -> send_ahead()'s inputs, or None: nothing sent

    def send(self):
        """Top up once at most one call is left ahead, in one message (a process that
        sleeps is woken once for them all)."""
        if self.backend.sent_ahead() > 1:
            return
        for test_id in islice(self.queue, self.backend.ahead + 1):
            if not self.backend.can_prefetch():
                break
            if test_id in self.prepared or test_id not in self.tests:
                continue
            try:
                self.prepared[test_id] = self.send_ahead(self.backend, *self.tests[test_id])
            except Exception:        # that test meets the same error again, and reports it
                self.prepared[test_id] = None
        try:
            self.backend.flush()
        except BackendCrashed:       # the next call finds the process gone
            pass

    def take(self, test_id):
        return self.prepared.pop(test_id, None)


def _unknown(test_id: str) -> dict:
    return {"status": "error", "seconds": 0.0, "ratio": 0.0, "cause": "",
            "message": f"suite error: the judge's spec has no test {test_id} (did a case file "
                       "change during the run?)"}


if __name__ == "__main__":
    sys.exit(main())
