"""The judge: ``python -m attention_conformance.process.judge_host FD OPTIONS`` (OPTIONS:
protocol.JudgeOptions as JSON).

An isolated certification run starts it as early as it starts anything, and asks it for
the tests it will run, in their order. The judge runs and judges them ahead of the run,
each as checking.verdict.verdict_of does in-process, and answers each with its verdict,
while the run's own process reports the tests before: the checks of one test and
pytest's report of another take two cores. It is the suite's own code; the backend runs
in a process of the judge's own (backend_proxy.py), started first thing, before this
process imports NumPy and loads the spec, so that the framework's import overlaps both.

The judge sends the runner a heartbeat (protocol.Alive) every HEARTBEAT_SECONDS from a
thread of its own, so that a judge that is stopped or stuck is found within seconds
(judge_proxy.STALLED_SECONDS). It is a subreaper: whatever a backend process leaves
behind is re-parented to the judge, and the judge ends every process of the run when it
ends (its runner gone, SIGTERM or SIGHUP), and removes its folder once its runner has gone
(_leave_folder).
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from collections import deque

from . import spawn     # alone: protocol.py (its dataclasses import `inspect`) only once the
#                         backend's process is started, which that import would delay

HEARTBEAT_SECONDS = 1.0
#: a queue this short is topped up from the runner's requests before each test (the
#: calls of the next tests are sent ahead from it: ahead.AHEAD); a longer one is not
#: (a run asks for all its tests at once: a poll of the runner's socket per test is
#: wasted, and the tests asked later go to the queue's end all the same)
SHORT_QUEUE = 8


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, _ignore)   # Ctrl-C is the runner's (not SIG_IGN: the
    # backend's process would inherit that, and never see a KeyboardInterrupt)
    for ending in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(ending, _exit)
    run_tag = (spawn.RUN_TAG, os.environ.get(spawn.RUN_TAG, ""))
    fields = types.SimpleNamespace(**json.loads(argv[1]))   # protocol.JudgeOptions's
    runner_pid = int(argv[2]) if len(argv) > 2 else os.getppid()
    spawn.become_subreaper()
    spawn.end_with_parent(before_exit=lambda: _end_run(run_tag, fields.log_dir),
                          parent=runner_pid)
    launched, proxy = spawn.start_backend(fields), None
    try:                                                # the backend loads meanwhile
        from . import protocol
        from .ahead import AHEAD
        from .backend_proxy import BackendProxy
        from .wire import Channel
        options = protocol.JudgeOptions.from_json(argv[1])
        runner = _Runner(Channel(socket.socket(fileno=int(argv[0]))), protocol.Alive())
        proxy = BackendProxy(options, launched=launched, ahead=AHEAD)
        loaded = _load(proxy, options.spec_dir)
        runner.send(loaded[0])
        if isinstance(loaded[0], protocol.Declared):
            gc.freeze()         # the spec stays: collections need not walk it again
            serve(runner, proxy, *loaded[1:])
    except (EOFError, OSError):                         # the runner has gone (or ended it)
        pass
    finally:
        for ending in (signal.SIGTERM, signal.SIGHUP):  # nothing cuts the clean-up short
            signal.signal(ending, signal.SIG_IGN)
        if proxy is not None:
            proxy.close()
        spawn.end_tree(launched[0] if proxy is None else None, run_tag)
        _leave_folder(fields.log_dir, runner_pid)
    return 0


def _ignore(signum, frame):
    pass


def _exit(signum, frame):
    """SIGTERM or SIGHUP, maybe mid-test: end through main's clean-up."""
    raise SystemExit(0)


class _Runner:
    """The judge's end of the runner's socket: sends from the main thread and the
    heartbeat's, one at a time."""

    def __init__(self, channel, alive):
        self.channel, self.alive, self.lock = channel, alive, threading.Lock()
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()

    def send(self, message) -> None:
        with self.lock:
            self.channel.send(message)

    def _beat(self) -> None:
        while True:
            time.sleep(HEARTBEAT_SECONDS)
            try:
                self.send(self.alive)
            except Exception:           # the runner has gone: the main thread finds out
                return


def _end_run(run_tag, folder: str) -> None:
    """The runner has gone without ending the run (killed outright: no handler of its
    ran): the run's folder removed, then every process of the run ended (this one too:
    it carries the run's tag)."""
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
    spawn.end_tree(None, run_tag)


#: the janitor (argv: the judge's folder, its runner's pid, a pidfd of the runner or -1):
#: waits for the runner to end, then removes the folder. SIGTERM and SIGHUP stay ignored
#: (the judge's, as it ends): a second round of them does not leave the folder
_JANITOR = """
import os, select, shutil, sys, time
folder, runner, pidfd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if pidfd >= 0:
    select.select([pidfd], [], [])
else:
    while True:
        try:
            os.kill(runner, 0)
        except ProcessLookupError:
            break
        except PermissionError:
            pass
        time.sleep(0.5)
shutil.rmtree(folder, ignore_errors=True)
"""


def _leave_folder(folder: str, runner: int) -> None:
    """The judge's folder as the judge ends: removed now if its runner has gone (killed
    with the judge: no clean-up of the runner's ran), else left to the runner, which
    removes it as it ends the run or replaces the judge, and to a janitor process that
    removes it once the runner has ended, if the runner is killed before its clean-up.
    The janitor carries the run's tag: the runner ends it with the judge's run."""
    if not folder:
        return
    try:
        pidfd = os.pidfd_open(runner)           # before the check: no pid reused after it
    except (AttributeError, OSError):           # not Linux, or the runner already reaped
        pidfd = -1
    try:
        if os.getppid() != runner:
            shutil.rmtree(folder, ignore_errors=True)
            return
        subprocess.Popen([sys.executable, "-c", _JANITOR, folder, str(runner), str(pidfd)],
                         pass_fds=[pidfd] if pidfd >= 0 else [], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    except OSError:             # no janitor (no process to spare): the runner's to remove
        pass
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def _load(proxy, spec_dir) -> tuple:
    """(the first message, the tests by id, the golden store): the spec loads while the
    backend's process imports its framework."""
    from ..backend.resolve import BackendLoadError
    from ..golden.store import GoldenStore
    from ..model.folder import SpecFolder
    from ..specs.loader import load_spec
    from . import protocol
    try:
        folder = SpecFolder.from_option(spec_dir)
        tests, golden = tests_by_id(load_spec(folder, cache=True)), GoldenStore.of(folder)
    except Exception as exc:
        return (protocol.LoadError(f"the judge could not load the spec: "
                                   f"{type(exc).__name__}: {exc}"),)
    try:
        declaration = proxy.wait_loaded()
    except BackendLoadError as exc:
        return (protocol.LoadError(str(exc)),)
    process = proxy.process
    return (protocol.Declared(declaration.as_dict(), process.loaded_mib, process.loaded_maps),
            tests, golden)


def tests_by_id(spec) -> dict:
    """test id -> (case, variant, dtype), for every test of every profile."""
    from ..model.case import test_name
    return {f"{case.topic}/{test_name(case, variant, dtype)}": (case, variant, dtype)
            for case in spec.cases for variant in case.variants for dtype in case.dtypes}


def serve(runner, proxy, tests: dict, golden) -> None:
    """Judge the tests asked, in order, until the runner has gone. The first calls of the tests
    next in line are kept sent to the backend's process (ahead.Ahead), so that it
    computes them while the judge checks the test before."""
    from ..checking.verdict import verdict_of
    from . import protocol
    from .ahead import Ahead
    queue, answers = deque(), _Answers(runner)
    ahead = Ahead(proxy, tests, queue)
    proxy.before_wait = answers.flush           # no verdict waits on a slow backend
    while True:
        if not queue:
            answers.flush()                     # nor on the runner's next request
        while not queue or (len(queue) <= SHORT_QUEUE and runner.channel.ready(0)):
            message = runner.channel.receive()  # what was asked (waiting if idle); EOFError
            if isinstance(message, protocol.Run):       # once the runner has gone
                queue.extend(message.tests)
        test_id = queue.popleft()
        prepared = ahead.take(test_id)
        if test_id in tests:
            proxy.replaced = ""
            verdict = verdict_of(proxy, *tests[test_id], golden, prepared, ahead.top_up)
            if proxy.replaced:
                verdict["replaced"] = proxy.replaced
        else:
            verdict = _unknown(test_id)
        ahead.top_up()              # if the test made no call, or more were asked since
        answers.add(test_id, verdict)


class _Answers:
    """Verdicts sent in batches: after FLUSH_SECONDS of judging at most, whenever the judge
    waits for the runner's next request, and once the backend's answer has kept it
    waiting (backend_proxy.WAIT_BRIEFLY). Each message wakes the runner's process, which
    costs the judge ~25 us on a virtual machine (its frame, and the kernel's wake-up) and
    the runner as much again, and the judge's time is the run's: 5 ms of NumPy tests
    (~8) make a quarter of the messages 1 ms did, and the runner, which waits for the
    judge, reports each test a few ms later at most."""

    FLUSH_SECONDS = 0.005

    def __init__(self, runner):
        self.runner = runner
        self.batch, self.since = [], 0.0

    def add(self, test_id, verdict):
        if not self.batch:
            self.since = time.monotonic()
        self.batch.append([test_id, verdict])
        if time.monotonic() - self.since >= self.FLUSH_SECONDS:
            self.flush()

    def flush(self):
        if self.batch:
            from . import protocol
            batch, self.batch = self.batch, []
            self.runner.send(protocol.Verdicts(batch))


def _unknown(test_id: str) -> dict:
    return {"status": "error", "seconds": 0.0, "ratio": 0.0, "cause": "",
            "message": f"suite error: the judge's spec has no test {test_id} (did a case file "
                       "change during the run?)"}


if __name__ == "__main__":
    sys.exit(main())
