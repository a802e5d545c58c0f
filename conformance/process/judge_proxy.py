"""The runner's side of the judge (judge_host.py): start it, take its backend's
declaration, ask it for the tests the run will make, in their order, and take each
test's verdict when pytest runs that test; by then the judge has usually judged it.

The judge is the suite's own code, but the backend's process is its child and can
signal it. A judge that dies, or sends nothing (not even its heartbeat) for
STALLED_SECONDS (stopped, or stuck), is ended with every process of its run; the test
the run waits for is judged again, alone, by a fresh judge (a call sent ahead for a
later test may have killed the first one); a test on which two judges end is a crash
that says how, and a fresh judge (with a fresh backend process) judges the rest.
"""

from __future__ import annotations

import time

from ..backend.interface import Declaration
from ..backend.resolve import BackendLoadError
from . import protocol, spawn
from .backend_proxy import LOAD_SECONDS
from .wire import Channel, WireError, WireTimeout

#: a judge that sends nothing for this long (its heartbeat comes every second) is taken
#: for stopped or stuck, and is replaced
STALLED_SECONDS = 10.0


class JudgeProxy:
    def __init__(self, options: protocol.JudgeOptions, *, launched=None):
        """launched: spawn.start_judge() of a judge already started (the plugin starts it
        as early as it can)."""
        self.options = options
        self._asked: dict[str, None] = {}       # asked and not yet answered, in order
        self._answers: dict[str, dict] = {}
        self._broken = ""                       # why no judge could be started again
        self.declaration: Declaration | None = None
        self._start(launched)

    def _start(self, launched=None) -> None:
        self._proc, sock, self._log, self._tag = launched or spawn.start_judge(self.options)
        self._channel = Channel(sock)

    def wait_loaded(self) -> Declaration:
        """The backend's declaration (BackendLoadError if it, or the spec, failed to load
        in the judge's process)."""
        deadline = time.monotonic() + LOAD_SECONDS
        while True:
            try:
                answer = self._channel.receive(min(deadline, time.monotonic() + STALLED_SECONDS))
            except (EOFError, OSError, WireError, WireTimeout) as exc:
                raise BackendLoadError(f"backend {self.options.reference!r}: the judge's process "
                                       f"ended while loading it: {self._end(exc)}") from None
            if isinstance(answer, protocol.Declared):
                self.declaration = Declaration.from_dict(answer.declaration)
                return self.declaration
            if isinstance(answer, protocol.LoadError):
                self.close()
                raise BackendLoadError(answer.text)

    def ask(self, test_ids) -> None:
        """Have the judge judge these tests next (those not asked yet), in this order."""
        new = [t for t in test_ids if t not in self._asked and t not in self._answers]
        if not new or self._proc is None:
            return
        self._asked.update(dict.fromkeys(new))
        try:
            self._channel.send(protocol.Run(new))
        except OSError:
            pass                                # verdict() finds the judge gone

    def verdict(self, test_id: str) -> dict:
        """The verdict of one test (checking/verdict.py), asking for it if it was not."""
        if self._broken:
            return _crash(self._broken)
        self.ask([test_id])
        ended = self._await(test_id)
        if ended:
            return self._replace(test_id, ended)
        return self._answers.pop(test_id)

    def _await(self, test_id: str) -> str:
        """Take verdicts until test_id's; '' then, else how the judge ended first (it died,
        broke the protocol, or sent nothing for STALLED_SECONDS, and was ended)."""
        while test_id not in self._answers:
            try:
                message = self._channel.receive(time.monotonic() + STALLED_SECONDS)
            except (EOFError, OSError, WireError, WireTimeout) as exc:
                return self._end(exc)
            if isinstance(message, protocol.Verdicts):
                for answered, verdict in message.verdicts:
                    self._asked.pop(answered, None)
                    self._answers[answered] = verdict
            elif not isinstance(message, protocol.Alive):
                return self._end(WireError(f"an unexpected {message.KIND} message"))
        return ""

    def _replace(self, test_id: str, ended: str) -> dict:
        """The judge ended before test_id's verdict: a call sent ahead for a later test may
        have ended it, so test_id is judged again, alone, by a fresh judge; only if that
        one ends as well is the test a crash. Then a fresh judge is asked for every
        other test that was asked."""
        rest = [t for t in self._asked if t != test_id]
        self._asked = {}
        if not self._restart():
            return _crash(self._broken)
        self.ask([test_id])
        again = self._await(test_id)
        if not again:
            self.ask(rest)
            return self._answers.pop(test_id)
        self._asked = {}
        if self._restart():
            self.ask(rest)
        return _crash(f"the judge's process (the suite's own: it runs the backend's process "
                      f"and checks its outputs) ended while judging this test, twice: "
                      f"{again}; the first time: {ended}; a fresh one judges the tests after it")

    def _restart(self) -> bool:
        try:
            self._start()
            self.wait_loaded()
            return True
        except BackendLoadError as exc:
            self._broken = f"no judge could be started again after one ended: {exc}"
            return False

    def _end(self, exc: BaseException) -> str:
        """End the judge and every process of its run; how it ended."""
        if self._proc is None:
            return "it had ended"
        code, stopped = None, spawn.state(self._proc.pid) == "T"
        if isinstance(exc, (EOFError, OSError)):
            try:
                code = self._proc.wait(timeout=5)
            except Exception:
                pass
        self._close_now()
        if stopped:
            return (f"it was stopped (SIGSTOP, by the backend's process most likely) and sent "
                    f"nothing for {STALLED_SECONDS:g} s: it was killed")
        if isinstance(exc, WireTimeout):
            return f"it sent nothing for {STALLED_SECONDS:g} s: it was killed"
        if isinstance(exc, WireError):
            return f"it broke the protocol ({exc}): it was killed"
        return spawn.ending(code)

    def _close_now(self) -> None:
        """Kill the judge and every process of its run, and remove its folder."""
        spawn.end_tree(self._proc, self._tag)
        self._channel.close()
        spawn.remove_folder(self._log)
        self._proc = None

    def close(self) -> None:
        """End the judge and everything of its run at once: nothing of a run is left to
        finish once its report is written."""
        if self._proc is not None:
            self._close_now()


def _crash(message: str) -> dict:
    return {"status": "crash", "message": message, "seconds": 0.0, "ratio": 0.0, "cause": ""}
