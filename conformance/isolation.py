"""A backend run in a process of its own, behind an object with the interface's methods.

The runner calls an IsolatedBackend as it would the adapter; each call is sent to the
backend's process (worker.py) and its outputs come back as base ndarrays (wire.py), to be
checked here, in the runner's process, where nothing the adapter does to its own
interpreter can reach. A call that does not return by the deadline kills the process;
a process that dies is reported with its signal or exit code and the end of its output.
Either way the next call starts a fresh process, and so does every `restart_every`-th
call, so that a backend that leaks (compiled programs, memory maps) cannot exhaust one.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection

import numpy as np

from . import wire
from .loading import BackendLoadError
from .ops import OPS
from .outcomes import BackendCrashed, BackendRaised, CheckFailure
from .timeout import CaseTimeout

LOAD_SECONDS = 600.0        # importing a framework (and a first compile) can be slow


class IsolatedBackend:
    def __init__(self, reference: str, *, restart_every: int = 0, load_timeout=LOAD_SECONDS,
                 device: str | None = None):
        self.reference, self.restart_every, self.load_timeout = reference, restart_every, load_timeout
        self.device = device            # the backend is built with device=DEVICE, if given
        self.deadline: float | None = None       # monotonic time by which a call must end
        self.timeout_text = ""
        self.isolated = True
        self._proc = self._conn = None
        self._calls = 0
        self._log = tempfile.NamedTemporaryFile(prefix="attention-conformance-backend-",
                                                suffix=".log", delete=False)
        self._declared = self._start()
        for key in ("name", "dtypes", "policy", "versions", "paths"):
            setattr(self, key, self._declared[key])
        self.dtypes = frozenset(self.dtypes)
        if self._declared.get("op_policy"):
            self.op_policy = self._declared["op_policy"]
        self.origin_module = self._declared["module"]
        self.expected_failures_file = self._declared["expected_failures_file"] or None
        for op in OPS:
            if op not in self._declared["ops"]:
                setattr(self, op, None)

    # --- the process ------------------------------------------------------------------
    def _start(self) -> dict:
        ours, theirs = socket.socketpair()
        self._log.seek(0)
        self._log.truncate()
        command = [sys.executable, "-m", "attention_conformance.worker",
                   str(theirs.fileno()), self.reference]
        if self.device is not None:
            command.append(self.device)
        self._proc = subprocess.Popen(command, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                      stdout=self._log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        theirs.close()
        self._conn = Connection(ours.detach())
        self._calls = 0
        answer = self._receive(time.monotonic() + self.load_timeout, "loading the backend")
        if "load_error" in answer:
            self.close()
            raise BackendLoadError(answer["load_error"])
        declared = answer.get("declared")
        if not isinstance(declared, dict):
            self.close()
            raise BackendLoadError(f"backend {self.reference!r}: its process sent no declaration")
        return declared

    def _receive(self, deadline: float | None, doing: str):
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            ready = self._conn.poll(remaining)
        except (EOFError, OSError):
            ready = True
        if not ready:
            self._kill()
            raise CaseTimeout(self.timeout_text or f"the backend did not return while {doing}")
        try:
            return wire.receive(self._conn)
        except (EOFError, OSError, wire.WireError) as exc:
            raise BackendCrashed(self._death(doing, exc)) from None

    def _death(self, doing: str, exc) -> str:
        try:
            code = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._kill()
            code = None
        self._proc = None
        if code is None:
            how = f"its process stopped answering ({type(exc).__name__}) and was killed"
        elif code < 0:
            how = f"its process was killed by signal {_signal_name(-code)} ({-code})"
        else:
            how = f"its process exited with code {code}"
        return f"the backend crashed while {doing}: {how}{self._tail()}"

    def _tail(self) -> str:
        try:
            with open(self._log.name, "rb") as f:
                text = f.read()[-1500:].decode(errors="replace").strip()
        except OSError:
            return ""
        return f"; its last output:\n{text}" if text else ""

    def _kill(self):
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self._proc.wait()
        self._proc = None

    def close(self):
        """Stop the process (killed if it does not stop within two seconds)."""
        if self._proc is not None:
            try:
                wire.send(self._conn, {"stop": True})
                self._proc.wait(timeout=2)
            except Exception:
                pass
            self._kill()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # --- calls -------------------------------------------------------------------------
    def call(self, op: str, args, kwargs):
        if self._proc is None or (self.restart_every and self._calls >= self.restart_every):
            started = time.monotonic()
            self.close()
            self._start()
            if self.deadline is not None:       # starting a process is not the call's time
                self.deadline += time.monotonic() - started
        self._calls += 1
        spec = OPS[op]
        arrays = dict(zip(spec.positional, args))
        params = {}
        for key, value in kwargs.items():
            (arrays if isinstance(value, np.ndarray) else params)[key] = value
        try:
            wire.send(self._conn, {"op": op, "arrays": arrays, "params": params})
        except (OSError, EOFError) as exc:
            raise BackendCrashed(self._death(f"receiving {op}", exc)) from None
        answer = self._receive(self.deadline, f"computing {op}")
        return _result(op, answer)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "?"


def _result(op: str, answer: dict):
    if "outputs" in answer:
        return answer["outputs"]
    if "unsupported" in answer:
        raise NotImplementedError(answer["unsupported"])
    if "wrote_input" in answer:
        raise CheckFailure(answer["wrote_input"])
    if "raised" in answer:
        raise BackendRaised.remote(answer["raised"], answer.get("traceback", ""))
    raise BackendCrashed(f"the backend's process answered {op} with {sorted(answer)}")


def _method(op):
    def method(self, *args, **kwargs):
        return self.call(op, args, kwargs)
    method.__name__ = op
    return method


for _op in OPS:
    setattr(IsolatedBackend, _op, _method(_op))
