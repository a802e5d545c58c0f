"""The runner's side of the judge (judge_process.py): start it, take its backend's
declaration, ask it for the tests the run will make, in their order, and take each
test's verdict when pytest runs that test; by then the judge has usually judged it.

The judge is the suite's own code, but the backend's process is its child and can
signal it: when a judge dies, the test the run waits for is judged again, alone, by a
fresh judge (a call sent ahead for a later test may have killed the first one); a test
on which two judges die is a crash that says so, and a fresh judge (with a fresh backend
process) judges the rest.
"""

from __future__ import annotations

import subprocess
import threading

from . import wire
from .backend_proxy import LOAD_SECONDS, declare
from .spawn import (EARLY_ATTR, ending, kill_group, launch_judge, log_file, log_folder,
                     log_tail, remove_folder, stop)
from ..backend.resolve import BackendLoadError

#: how long past --case-timeout the runner waits for the judge's next message before it
#: takes the judge for stalled: a test's deadline is extended by the starts of backend
#: processes it waits for (each up to isolation.LOAD_SECONDS)
STALLED_SECONDS = 2 * LOAD_SECONDS


class Judge:
    """Has the backend's declared attributes (name, dtypes, policy, ...) once loaded, as
    the adapter has them, for the run's report and expected failures."""

    isolated = True

    def __init__(self, options: dict, *, launched=None, wait: bool = True):
        """options: launch.judge_options(); launched: (process, connection, log) of a
        judge launch.start_early() started. wait=False: return once it is started, and
        take the declaration in wait_loaded()."""
        self.options = options
        self._asked: dict[str, None] = {}       # asked and not yet answered, in order
        self._answers: dict[str, dict] = {}
        self._broken = ""                       # why no judge could be started again
        self._proc, self._conn, self._log = launched or self._launch()
        if wait:
            self.wait_loaded()

    def _launch(self):
        log = log_file(log_folder())
        return (*launch_judge(self.options, log), log)

    def wait_loaded(self):
        """Take the backend's declaration (BackendLoadError if it, or the spec, failed
        to load in the judge's process)."""
        try:
            answer = wire.receive(self._conn)
        except (EOFError, OSError, wire.WireError):
            raise BackendLoadError(f"backend {self.options['reference']!r}: the judge's "
                                   f"process died while loading it: {self._death()}") from None
        if "load_error" in answer:
            self.close()
            raise BackendLoadError(answer["load_error"])
        self.declared = answer["declared"]
        declare(self, self.declared)

    def ask(self, test_ids, timeout: float) -> None:
        """Have the judge judge these tests next (those not asked yet), in this order."""
        new = [t for t in test_ids if t not in self._asked and t not in self._answers]
        if not new or self._proc is None:
            return
        self._asked.update(dict.fromkeys(new))
        try:
            wire.send(self._conn, {"run": new, "timeout": timeout})
        except (OSError, EOFError):
            pass                                # verdict() finds the judge gone

    def verdict(self, test_id: str, timeout: float) -> dict:
        """The verdict of one test (verdict.py), asking for it if it was not asked."""
        if self._broken:
            return _crash(self._broken)
        self.ask([test_id], timeout)
        if not self._await(test_id, timeout):
            return self._replace(test_id, timeout)
        return self._answers.pop(test_id)

    def _await(self, test_id: str, timeout: float) -> bool:
        """Take verdicts until test_id's; False if the judge died first, or sent nothing
        for longer than any one test may take (STALLED_SECONDS past --case-timeout: a
        judge stopped, or stuck in its own code), and was killed."""
        limit = timeout + STALLED_SECONDS if timeout else None
        while test_id not in self._answers:
            try:
                if not wire.ready(self._conn, limit):
                    kill_group(self._proc)
                    return False
                message = wire.receive(self._conn)
            except (EOFError, OSError, wire.WireError):
                return False
            for answered, verdict in message["verdicts"]:
                self._asked.pop(answered, None)
                self._answers[answered] = verdict
        return True

    def _replace(self, test_id: str, timeout: float) -> dict:
        """The judge died (or stalled) before test_id's verdict: a call sent ahead for a
        later test may have killed it, so test_id is judged again, alone, by a fresh
        judge; only if that one dies as well is the test a crash. Then a fresh judge is
        asked for every other test that was asked."""
        rest = [t for t in self._asked if t != test_id]
        self._death()
        self._asked = {}
        if not self._restart():
            return _crash(self._broken)
        self.ask([test_id], timeout)
        if self._await(test_id, timeout):
            self.ask(rest, timeout)
            return self._answers.pop(test_id)
        death = (f"the judge's process (the suite's own: it runs the backend's process and "
                 f"checks its outputs) died while judging this test, twice: {self._death()}")
        self._asked = {}
        if self._restart():
            self.ask(rest, timeout)
        return _crash(death + "; a fresh one judges the tests after it")

    def _restart(self) -> bool:
        try:
            self._proc, self._conn, self._log = self._launch()
            self.wait_loaded()
            return True
        except BackendLoadError as exc:
            self._broken = f"no judge could be started again after one died: {exc}"
            self._proc = None
            return False

    def _death(self) -> str:
        """How the judge ended (it is reaped, and its folder of logs removed)."""
        try:
            code = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            kill_group(self._proc)
            code = None
        text = ending(code) + log_tail(self._log)
        self._conn.close()
        remove_folder(self._log)
        self._proc = None
        return text

    def close(self, wait: bool = True):
        """Stop the judge (which stops the backend's process); killed if it has not ended
        two seconds later. wait=False: return at once, and leave that to a daemon thread
        (each of the two processes also ends itself when it sees its parent gone)."""
        proc, conn, self._proc = self._proc, self._conn, None
        if proc is None:
            return
        try:
            wire.send(conn, {"stop": True})
            proc.terminate()                # it may be judging a test ahead: no waiting
        except (OSError, EOFError):
            pass
        if wait:
            stop(proc, conn, wait=2)
        else:
            threading.Thread(target=stop, args=(proc, conn, 2), name="judge-reaper",
                             daemon=True).start()
        remove_folder(self._log)


def _crash(message: str) -> dict:
    return {"status": "crash", "message": message, "seconds": 0.0, "ratio": 0.0, "cause": ""}


def take_early(config) -> Judge | None:
    """The judge whose process launch.start_early() started for this config, once; None
    if none was."""
    early = config.__dict__.pop(EARLY_ATTR, None)
    if early is None:
        return None
    options, launched = early
    return Judge(options, wait=False, launched=launched)
