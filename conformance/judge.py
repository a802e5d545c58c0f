"""The runner's side of the judge (judge_process.py): start it, take its backend's
declaration, ask it for the tests the run will make, in their order, and take each
test's verdict when pytest runs that test; by then the judge has usually judged it.

The judge is the suite's own code, but the backend's process is its child and can
signal it: a judge that dies costs the test it was judging, which ends as a crash that
says so, and a fresh judge (with a fresh backend process) judges the rest.
"""

from __future__ import annotations

import subprocess
import threading

from . import wire
from .isolation import declare
from .launch import EARLY_ATTR, ending, kill_group, launch_judge, log_file, log_tail, remove_log, stop
from .loading import BackendLoadError


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
        log = log_file()
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
        while test_id not in self._answers:
            try:
                message = wire.receive(self._conn)
            except (EOFError, OSError, wire.WireError):
                return self._replace(test_id, timeout)
            for answered, verdict in message["verdicts"]:
                self._asked.pop(answered, None)
                self._answers[answered] = verdict
        return self._answers.pop(test_id)

    def _replace(self, test_id: str, timeout: float) -> dict:
        """The judge died judging test_id: that test's verdict, and a fresh judge asked for
        every other test that was asked."""
        death = (f"the judge's process (the suite's own: it runs the backend's process and "
                 f"checks its outputs) died while judging this test: {self._death()}")
        rest = [t for t in self._asked if t != test_id]
        self._asked = {}
        try:
            self._proc, self._conn, self._log = self._launch()
            self.wait_loaded()
        except BackendLoadError as exc:
            self._broken = f"no judge could be started again after one died: {exc}"
            self._proc = None
            return _crash(death)
        self.ask(rest, timeout)
        return _crash(death + "; a fresh one judges the tests after it")

    def _death(self) -> str:
        try:
            code = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            kill_group(self._proc)
            code = None
        text = ending(code) + log_tail(self._log)
        self._conn.close()
        remove_log(self._log)
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
        remove_log(self._log)


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
