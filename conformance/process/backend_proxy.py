"""A backend run in a process of its own, behind an object with the interface's methods.

The runner calls an IsolatedBackend as it would the adapter; each call is sent to the
backend's process (worker.py) and its outputs come back as base ndarrays (wire.py), to be
checked here, in the runner's process, where nothing the adapter does to its own
interpreter can reach. A call that does not return by the deadline kills the process;
a process that dies is reported with its signal or exit code and the end of its output.
Either way the next call starts a fresh process, and so does a process that has grown
by more than `restart_above_mib` since it loaded (each answer says how much memory it
holds) or holds more than `restart_above_maps` memory maps (by default 80 % of what the
kernel allows a process), so that a backend that leaks (compiled programs, memory maps)
cannot exhaust the machine or crash; `restart_every` restarts every N calls as well.
"""

from __future__ import annotations

import math
import subprocess
import threading
import time
from collections import deque

import numpy as np

from . import wire
from .spawn import ending, kill_group, launch, log_file, log_tail, remove_log, stop
from ..backend.resolve import BackendLoadError
from ..model.ops import OPS
from ..model.errors import BackendCrashed, BackendRaised, CheckFailure
from ..backend.timeout import CaseTimeout

LOAD_SECONDS = 600.0        # importing a framework (and a first compile) can be slow
STANDBY_CALLS = 500         # a replacement process starts this many calls before a restart
MAPS_SHARE = 0.8            # a process holding this share of vm.max_map_count is replaced
#: no more than this many bytes of inputs in calls sent ahead (unless one call alone is
#: larger): the process writes each answer while this one may be writing the next calls,
#: and each way of the socket holds launch.SOCKET_BYTES before a write waits (two writes
#: waiting on each other: a hang)
AHEAD_BYTES = 32 * 1024
#: how many calls of a test's properties may be sent ahead beyond `ahead` (prefetch)
PLANNED_ROOM = 2
#: seconds an answer may keep this process waiting before before_wait() is called
WAIT_BRIEFLY = 0.001


class IsolatedBackend:
    def __init__(self, reference: str, *, restart_every: int = 0,
                 restart_above_mib: float = 0, restart_above_maps: int | None = None,
                 load_timeout=LOAD_SECONDS, ahead: int = 1, log_dir: str | None = None,
                 device: str | None = None, wait: bool = True, launched=None):
        """wait=False: return once the process is started, and take its declaration in
        wait_loaded(), so that the caller's own start-up overlaps the backend's import.
        restart_every, restart_above_mib, restart_above_maps: 0 turns that restart off;
        restart_above_maps None: MAPS_SHARE of the machine's limit (maps_limit()).
        launched: (process, connection, log) of a process launch.launch() already started.
        ahead: how many calls prefetch() may have sent ahead, not yet asked for.
        log_dir: the folder of the processes' logs (default: the temporary folder)."""
        self.log_dir = log_dir
        self.reference, self.restart_every, self.load_timeout = reference, restart_every, load_timeout
        self.restart_above_mib = restart_above_mib
        self.restart_above_maps = maps_limit() if restart_above_maps is None else restart_above_maps
        self._loaded_mib = self._held_mib = None    # the process's memory at load, and now
        self._loaded_maps = self.held_maps = None   # its memory maps at load, and when last counted
        self.device = device            # the backend is built with device=DEVICE, if given
        self.deadline: float | None = None       # monotonic time by which a call must end
        self.timeout_text = ""
        self.isolated = True
        self.ahead = ahead
        self._calls, self._sent_ahead = 0, deque()  # calls sent ahead (prefetch), in order
        self._parked = []           # (call, answer) of calls sent ahead that others overtook
        self._held = []             # calls sent ahead and not yet written (flush())
        self.before_wait = None     # called once an answer has kept this process waiting
        self._logs = [launched[2] if launched else log_file(log_dir)]   # a second: a standby
        self._log = self._logs[0]
        self._standby = None                    # (process, connection, log) started ahead
        self._retired = []                      # stopped processes not yet reaped
        self._proc, self._conn = launched[:2] if launched else self._launch(self._log)
        if wait:
            self.wait_loaded()

    def wait_loaded(self):
        """Take the backend's declaration (BackendLoadError if it failed to load)."""
        self.declared = self._declaration()
        declare(self, self.declared)

    # --- the process ------------------------------------------------------------------
    def _launch(self, log):
        return launch(self.reference, self.device, log)

    def _start(self) -> dict:
        """A fresh process: the standby if one was started ahead, else a new one."""
        if self._standby is not None:
            (self._proc, self._conn, self._log), self._standby = self._standby, None
        else:
            if self._log is None:                   # closed before: a new log
                self._log = log_file(self.log_dir)
                self._logs = [self._log]
            self._proc, self._conn = self._launch(self._log)
        return self._declaration()

    def _start_standby(self):
        if len(self._logs) == 1:
            self._logs.append(log_file(self.log_dir))
        log = self._logs[1] if self._log is self._logs[0] else self._logs[0]
        self._standby = (*self._launch(log), log)

    def _declaration(self) -> dict:
        self._calls, self._held = 0, []
        self._sent_ahead.clear()
        answer = self._receive(time.monotonic() + self.load_timeout, "loading the backend")
        if "load_error" in answer:
            self.close()
            raise BackendLoadError(answer["load_error"])
        declared = answer.get("declared")
        if not isinstance(declared, dict):
            self.close()
            raise BackendLoadError(f"backend {self.reference!r}: its process sent no declaration")
        self._loaded_mib = self._held_mib = _memory_mib(answer)
        self._loaded_maps = self.held_maps = _maps(answer)
        return declared

    def _receive(self, deadline: float | None, doing: str):
        self.flush()                # an answer can be waited for only once its call is out
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            ready = wire.ready(self._conn, 0)
            if not ready and self.before_wait is not None:
                ready = wire.ready(self._conn, min(WAIT_BRIEFLY, remaining or WAIT_BRIEFLY))
                if not ready:           # a longer wait: first what the caller would send
                    self.before_wait()
            if not ready:
                ready = wire.ready(self._conn, None if deadline is None
                                   else max(0.0, deadline - time.monotonic()))
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
        how = ending(code) if code is not None else \
            f"its process stopped answering ({type(exc).__name__}) and was killed"
        return f"the backend crashed while {doing}: {how}{log_tail(self._log)}"

    def _kill(self):
        if self._proc is not None:
            kill_group(self._proc)
        self._proc = None

    def close(self, wait: bool = True):
        """Stop every process (each killed if it does not stop within two seconds).
        wait=False: return at once and leave that to a daemon thread (a framework's own
        exit can take a second; should this process end first, each backend process
        ends itself when it sees its runner gone)."""
        self._retire()
        if self._standby is not None:
            self._retired.append(self._standby[:2])
            self._standby = None
        retired, self._retired = self._retired, []
        if wait:
            for proc, conn in retired:
                stop(proc, conn, wait=2)
        elif retired:
            threading.Thread(target=lambda: [stop(p, c, wait=2) for p, c in retired],
                             name="backend-reaper", daemon=True).start()
        for log in self._logs:                      # its last output is no longer asked for
            remove_log(log)
        self._logs, self._log = [], None

    def _retire(self):
        """Tell the current process to stop, and go on without waiting for it to end."""
        self._sent_ahead.clear()
        self._held = []
        if self._proc is not None:
            try:
                wire.send(self._conn, {"stop": True})
            except Exception:
                pass
            self._retired.append((self._proc, self._conn))
        elif self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None
        self._retired = [(p, c) for p, c in self._retired if not stop(p, c, wait=0)]

    # --- calls -------------------------------------------------------------------------
    def call(self, op: str, args, kwargs):
        for i, (sent, answer) in enumerate(self._parked):
            if sent.matches(op, args, kwargs):
                del self._parked[i]
                return _result(op, answer)
        while self._sent_ahead:             # the process answers in the order it was asked
            sent = self._sent_ahead.popleft()
            if sent.matches(op, args, kwargs):
                return self._answer(op)
            self._park(sent)
        if self._proc is None or self._restart_due():
            started = time.monotonic()
            self._retire()
            self._start()
            if self.deadline is not None:       # starting a process is not the call's time
                self.deadline += time.monotonic() - started
        self._send(op, args, kwargs)
        return self._answer(op)

    def _answer(self, op: str):
        answer = self._receive(self.deadline, f"computing {op}")
        self._note_holdings(answer)
        return _result(op, answer)

    def _note_holdings(self, answer: dict):
        self._held_mib = _memory_mib(answer, self._held_mib)
        self.held_maps = _maps(answer, self.held_maps)

    def prefetch(self, op: str, args, kwargs, by_content: bool = False) -> bool:
        """Send a call ahead of time: the backend's process computes it while this one goes
        on (checking the outputs of the test before), and call() with the very same
        arguments (the same array objects) takes its answer, even after other calls
        overtook it. Up to `ahead` calls, only into a running process; False when nothing
        was sent (can_prefetch() says whether another call would be). by_content: a
        call whose arrays a caller will build again (a property's): any call with
        arrays of the same bytes takes its answer, and it may go PLANNED_ROOM beyond
        `ahead`."""
        size = sum(a.nbytes for a in (*args, *kwargs.values()) if isinstance(a, np.ndarray))
        if not self.can_prefetch(size, PLANNED_ROOM if by_content else 0):
            return False
        self._send(op, args, kwargs, hold=True)   # written by flush(), or before any wait
        self._sent_ahead.append(_Pending(op, args, kwargs, size, by_content))
        return True

    def can_prefetch(self, size: int = 0, room: int = 0) -> bool:
        """Would a call of `size` bytes of inputs be sent ahead now (the first at any size,
        the others within AHEAD_BYTES), with `room` more calls than `ahead` allowed?"""
        return len(self._sent_ahead) < self.ahead + room and self._proc is not None \
            and not self._restart_due() \
            and (not self._sent_ahead or self._bytes_ahead() + size <= AHEAD_BYTES)

    def sent_ahead(self) -> int:
        """How many calls sent ahead are not yet asked for."""
        return len(self._sent_ahead)

    def _bytes_ahead(self) -> int:
        return sum(sent.size for sent in self._sent_ahead)

    def _restart_due(self) -> bool:
        return bool(self.restart_every and self._calls >= self.restart_every) \
            or self.grown_mib() > (self.restart_above_mib or math.inf) \
            or self._too_many_maps()

    def _too_many_maps(self) -> bool:
        """Over the limit, and grown by a tenth of it since load: a process loaded near or
        over the limit is not replaced at every call (a new one would hold as many)."""
        limit, held, loaded = self.restart_above_maps, self.held_maps, self._loaded_maps
        if not limit or held is None or loaded is None:
            return False
        return held > limit and held - loaded > limit / 10

    def grown_mib(self) -> float:
        """How much the process's memory has grown since it loaded, in MiB (0 if unknown)."""
        if self._loaded_mib is None or self._held_mib is None:
            return 0.0
        return self._held_mib - self._loaded_mib

    def _send(self, op, args, kwargs, hold: bool = False):
        """Write a call to the process; hold=True keeps it for flush() instead."""
        self._calls += 1
        if self.restart_every and self._standby is None and \
                self._calls >= self.restart_every - STANDBY_CALLS:
            self._start_standby()
        arrays = dict(zip(OPS[op].positional, args))
        params = {}
        for key, value in kwargs.items():
            (arrays if isinstance(value, np.ndarray) else params)[key] = value
        self._held.append({"op": op, "arrays": arrays, "params": params})
        if not hold:
            self.flush()

    def flush(self):
        """Write the calls held (prefetch) in one message: the process, which may be
        asleep, is woken once for all of them, and answers each on its own."""
        if not self._held:
            return
        held, self._held = self._held, []
        try:
            wire.send(self._conn, held[0] if len(held) == 1 else {"batch": held})
        except (OSError, EOFError) as exc:
            self._sent_ahead.clear()
            raise BackendCrashed(self._death(f"receiving {held[-1]['op']}", exc)) from None

    def _park(self, sent):
        """Another call overtakes a call sent ahead: wait for the answer of the one ahead,
        and keep it for the call it was sent for. A process that hangs or dies on it is
        replaced, blamed on no test, and the calls sent after it are lost (each call it
        was for asks again, in the fresh process, and meets the same end: that is its
        test's). Its time is not the overtaking call's."""
        started = time.monotonic()
        try:
            answer = self._receive(self.deadline, "computing a call sent ahead")
            self._note_holdings(answer)
            self._parked = [*self._parked[-2 * self.ahead:], (sent, answer)]
        except (CaseTimeout, BackendCrashed):
            self._kill()
            self._sent_ahead.clear()
        if self.deadline is not None:
            self.deadline += time.monotonic() - started


def declare(backend, declared: dict) -> None:
    """Give an object the attributes of a backend's declaration (worker.declaration()):
    name, dtypes, policy, versions, paths, op_policy; None for each op it lacks."""
    for key in ("name", "dtypes", "policy", "versions", "paths"):
        setattr(backend, key, declared[key])
    backend.dtypes = frozenset(backend.dtypes)
    if declared.get("op_policy"):
        backend.op_policy = declared["op_policy"]
    backend.origin_module = declared["module"]
    backend.expected_failures_file = declared["expected_failures_file"] or None
    for op in OPS:
        if op not in declared["ops"]:
            setattr(backend, op, None)


class _Pending:
    """A call sent ahead: it answers a later call with the same op, the same array objects
    (identity: comparing contents would cost what the call saves) and equal params; one
    sent by_content (a property's, whose arrays are built again) any arrays of the same
    dtype, shape and bytes."""

    def __init__(self, op, args, kwargs, size=0, by_content=False):
        self.op, self.args, self.kwargs, self.size = op, tuple(args), dict(kwargs), size
        self.by_content = by_content

    def matches(self, op, args, kwargs) -> bool:
        same = _same_bytes if self.by_content else _same
        return (op == self.op and len(args) == len(self.args)
                and all(same(a, b) for a, b in zip(args, self.args))
                and kwargs.keys() == self.kwargs.keys()
                and all(same(kwargs[k], self.kwargs[k]) for k in kwargs))


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


def _memory_mib(answer: dict, otherwise=None) -> float | None:
    """The memory an answer says its process holds, if it is a plain finite number."""
    value = answer.get("memory_mib")
    if type(value) in (int, float) and math.isfinite(value):
        return float(value)
    return otherwise


def _maps(answer: dict, otherwise=None) -> int | None:
    """The memory maps an answer says its process holds, if it counted them."""
    value = answer.get("maps")
    return value if type(value) is int and value >= 0 else otherwise


def maps_limit(share: float = MAPS_SHARE) -> int:
    """`share` of the memory maps the kernel allows one process (vm.max_map_count; the
    kernel's default is 65,530); 0 (no limit) where that is not known."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(int(f.read().strip()) * share)
    except (OSError, ValueError):
        return 0


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
