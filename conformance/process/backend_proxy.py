"""The judge's side of the backend's process (backend_host.py): calls sent to it and
their answers taken, under each test's deadline.

A test's calls run through test(): a call that does not return by the test's deadline
(--case-timeout for all its calls together) kills the process; a process that dies, or
breaks the protocol (bytes that are no message, an answer to another call), is reported
with how it ended and the end of its output. Either way the calls sent ahead to it are
dropped (their tests send them again), and the next call starts a fresh process; so does
a process that has grown by more than `restart_above_mib` since it loaded (each answer
says how much memory it holds) or holds more than `restart_above_maps` memory maps (by
default 80 % of what the kernel allows a process), so that a backend that leaks cannot
exhaust the machine or crash; `restart_every` restarts every N calls as well.
Starting a process is never a test's time.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import time
from collections import deque

from ..backend.calling import output_tuple
from ..backend.in_process import timeout_text
from ..backend.interface import Declaration
from ..backend.resolve import BackendLoadError
from ..model.errors import BackendCrashed, BackendRaised, CaseTimeout, CheckFailure, Unsupported
from . import protocol, spawn
from .ahead import PLANNED_ROOM, Pending
from .wire import MAX_ANSWER_BYTES, Channel, WireError, WireTimeout

LOAD_SECONDS = 600.0        # importing a framework (and a first compile) can be slow
STANDBY_CALLS = 500         # a replacement process starts this many calls before a restart
MAPS_SHARE = 0.8            # a process holding this share of vm.max_map_count is replaced
#: no more than this many bytes of inputs in calls sent ahead (unless one call alone is
#: larger): the process writes each answer while this one may be writing the next calls,
#: and each way of the socket holds spawn.SOCKET_BYTES before a write waits
AHEAD_BYTES = 32 * 1024
#: seconds an answer may keep the judge waiting before before_wait() is called
WAIT_BRIEFLY = 0.001
#: seconds a process may take no bytes of calls sent ahead before it is taken for stuck
STALLED_WRITE = 10.0


class Deadline:
    """When one test's calls must have ended: --case-timeout after the test began, moved
    on by the time spent starting processes and waiting for other tests' calls."""

    def __init__(self, seconds: float):
        self.seconds, self.returned = seconds, 0
        self.at = time.monotonic() + seconds if seconds else None

    def extend(self, seconds: float) -> None:
        if self.at is not None:
            self.at += seconds

    def text(self, doing: str, stopped: bool) -> str:
        calls = "1 call" if self.returned == 1 else f"{self.returned} calls"
        return (f"{timeout_text(self.seconds)}: {doing} was still running ({calls} of this "
                "test had returned)" + ("; the backend's process had been stopped (SIGSTOP)"
                                        if stopped else "") + "; its process was killed")


class BackendProcess:
    """One process of the backend: started, its declaration taken, ended with its tree."""

    def __init__(self, options: protocol.JudgeOptions, launched=None):
        """launched: (process, socket, log, tag) of one spawn.start_backend() started."""
        self.proc, sock, self.log, self.tag = launched or spawn.start_backend(options)
        self.channel = Channel(sock, spill_to=options.log_dir or None)   # spill.py
        self.calls = 0
        self.loaded_mib = self.held_mib = self.loaded_maps = self.held_maps = None

    def declaration(self) -> Declaration:
        """Its declaration (BackendLoadError if it failed to load)."""
        try:
            answer = self.channel.receive(time.monotonic() + LOAD_SECONDS)
        except (EOFError, OSError, WireError, WireTimeout) as exc:
            raise BackendLoadError(f"the backend's process died while loading it: "
                                   f"{self.end(exc)}") from None
        if isinstance(answer, protocol.LoadError):
            self.end()
            raise BackendLoadError(str(answer.text))
        try:
            declared = Declaration.from_dict(answer.declaration)
        except (AttributeError, ValueError) as exc:
            self.end()
            raise BackendLoadError(f"the backend's process sent no declaration: {exc}") from None
        self.note(answer)
        self.loaded_mib, self.loaded_maps = self.held_mib, self.held_maps
        return declared

    def note(self, answer) -> None:
        """What the process holds, as an answer says (plain numbers only)."""
        mib, maps = answer.memory_mib, answer.maps
        if type(mib) in (int, float) and math.isfinite(mib):
            self.held_mib = float(mib)
        if type(maps) is int and maps >= 0:
            self.held_maps = maps

    def end(self, exc: BaseException | None = None) -> str:
        """Kill it and its tree; how it ended. exc: what the judge saw (EOFError, OSError:
        it died or is dying, and its exit status is waited for, 5 s at most)."""
        code = None
        if isinstance(exc, (EOFError, OSError)):
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self.proc.wait(timeout=5)
        self.close()
        if isinstance(exc, WireError):
            return f"it wrote what is no message on the suite's socket ({exc}): its process was killed"
        if code is None:
            return spawn.ending(None) if exc is not None else "its process was killed"
        return spawn.ending(code)

    def close(self) -> None:
        """End it and its tree, and remove its log (its last output is read before)."""
        spawn.end_tree(self.proc, self.tag)
        self.channel.close()

    def stop(self) -> None:
        """Ask it to stop; ended (with its tree) at close()."""
        with contextlib.suppress(Exception):
            self.channel.send(protocol.Stop(), deadline=time.monotonic() + 0.1)


class BackendProxy:
    """What the judge calls: test() for one test's calls, send_ahead() for calls it will
    make, and close()."""

    def __init__(self, options: protocol.JudgeOptions, *, launched=None, ahead: int = 1,
                 restart_above_maps: int | None = None):
        """launched: spawn.start_backend() of a process already started; ahead: how many calls
        send_ahead() may have out, not yet asked for; restart_above_maps None: MAPS_SHARE
        of the machine's limit (maps_limit()), 0: never."""
        self.options, self.ahead = options, ahead
        self.restart_above_maps = maps_limit() if restart_above_maps is None else restart_above_maps
        self.process: BackendProcess | None = BackendProcess(options, launched)
        self.standby: BackendProcess | None = None
        self.retired: list[BackendProcess] = []
        self.declaration: Declaration | None = None
        self.replaced = ""          # why the last fresh process was started (for reports)
        self.before_wait = None     # called once an answer has kept the judge waiting
        self._ids = 0
        self._pending: deque[Pending] = deque()     # calls sent ahead, in order
        self._parked: list = []     # (Pending, answer) of calls sent ahead that others overtook
        self._held: list = []       # calls sent ahead, not yet written (flush())

    def wait_loaded(self) -> Declaration:
        self.declaration = self.process.declaration()
        return self.declaration

    @contextlib.contextmanager
    def test(self, factor: float = 1.0):
        """One test's calls, under --case-timeout (`factor` times it: a case of the scale
        profile, model/case.py) for all of them together."""
        yield _TestCalls(self, Deadline(self.options.case_timeout * factor))

    # --- calls -------------------------------------------------------------------------
    def call(self, op: str, arrays: dict, params: dict, deadline: Deadline) -> tuple:
        for i, (sent, answer) in enumerate(self._parked):
            if sent.matches(op, arrays, params):
                del self._parked[i]
                return self._result(op, arrays, answer, deadline)
        while self._pending:                # the process answers in the order it was asked
            sent = self._pending.popleft()
            if sent.matches(op, arrays, params):
                return self._result(op, arrays, self._await(sent, deadline, op), deadline)
            self._park(sent, deadline)
        self._ready(deadline)
        sent = self._send(op, arrays, params)
        return self._result(op, arrays, self._await(sent, deadline, op), deadline)

    def send_ahead(self, op: str, arrays: dict, params: dict, by_content: bool = False) -> bool:
        """Send a call before it is made: the process computes it while the judge goes on,
        and call() with the very same arrays (the same objects; by_content: arrays of the
        same bytes, for a property's call, which builds them again) takes its answer.
        Held for flush(); False when nothing was sent (can_send_ahead())."""
        size = sum(a.nbytes for a in arrays.values())
        if not self.can_send_ahead(size, PLANNED_ROOM if by_content else 0):
            return False
        self._pending.append(self._send(op, arrays, params, size, by_content))
        return True

    def can_send_ahead(self, size: int = 0, room: int = 0) -> bool:
        """Would a call of `size` bytes of inputs be sent ahead now (the first at any size,
        the others within AHEAD_BYTES), with `room` more calls than `ahead` allowed?"""
        return len(self._pending) < self.ahead + room and self.process is not None \
            and not self._restart_due() \
            and (not self._pending or sum(p.size for p in self._pending) + size <= AHEAD_BYTES)

    def sent_ahead(self) -> int:
        return len(self._pending)

    def flush(self, deadline: float | None = None) -> None:
        """Write the calls held in one write (a sleeping process wakes once for them all);
        WireTimeout if the process takes no bytes by the deadline, OSError if it is gone.
        Calls that could not be written are no longer pending: their tests make them."""
        if self._held:
            held, self._held = self._held, []
            try:
                self.process.channel.send(*held, deadline=deadline)
            except BaseException:
                ids = {call.id for call in held}
                self._pending = deque(p for p in self._pending if p.id not in ids)
                raise

    def flush_ahead(self) -> None:
        """flush() the calls sent ahead: a process that takes no bytes of them for
        STALLED_WRITE seconds is ended (their tests make them again, in a fresh one)."""
        try:
            self.flush(time.monotonic() + STALLED_WRITE)
        except WireTimeout:
            self._lost()
        except Exception:           # a process gone (the next wait says how), or a call
            pass                    # that cannot be sent: its test meets that again

    def _send(self, op, arrays, params, size=0, by_content=False) -> Pending:
        """A call, held for the next flush()."""
        self._ids += 1
        self.process.calls += 1
        if self.options.restart_every and self.standby is None and \
                self.process.calls >= self.options.restart_every - STANDBY_CALLS:
            self.standby = BackendProcess(self.options)
        self._held.append(protocol.Call(self._ids, op, arrays, params))
        return Pending(self._ids, op, arrays, params, size, by_content)

    def _await(self, sent: Pending, deadline: Deadline, op: str):
        """The answer to one call sent; a timeout or a dead process ends the process."""
        doing = f"its call of {op}" if sent.op == op else f"a call of {sent.op} sent ahead"
        try:
            self.flush(deadline.at)
            answer = self._receive(deadline)
        except WireTimeout:
            stopped = spawn.state(self.process.proc.pid) == "T"
            self._lost()
            raise CaseTimeout(deadline.text(doing, stopped)) from None
        except (EOFError, OSError, WireError) as exc:
            raise BackendCrashed(f"the backend crashed during {doing}: "
                                 f"{self._lost(exc)}") from None
        if not isinstance(answer, protocol.ANSWERS) or answer.call != sent.id:
            got = f"call {answer.call}" if isinstance(answer, protocol.ANSWERS) else answer.KIND
            raise BackendCrashed(
                f"the backend's process answered {got} where call {sent.id} was due (a process "
                f"it forked answering, or bytes it wrote on the suite's socket): "
                f"{self._lost()}") from None
        self.process.note(answer)
        return answer

    def _receive(self, deadline: Deadline):
        channel = self.process.channel
        if not channel.ready(0) and self.before_wait is not None:
            if not channel.ready(WAIT_BRIEFLY):   # a longer wait: first what else is due
                self.before_wait()
        return channel.receive(deadline.at)

    def _park(self, sent: Pending, deadline: Deadline) -> None:
        """Another call overtakes a call sent ahead: wait for its answer, and keep it for
        the call it was sent for. A process that hangs or dies on it is ended, blamed on
        no test: the calls it was for are made again, in a fresh process, and meet the
        same end there, their own. Its time is not the overtaking call's."""
        started = time.monotonic()
        try:
            self._parked = [*self._parked[-2 * self.ahead:],
                            (sent, self._await(sent, deadline, sent.op))]
        except (CaseTimeout, BackendCrashed):
            pass
        deadline.extend(time.monotonic() - started)

    def _lost(self, exc: BaseException | None = None) -> str:
        """End the current process (after a timeout, a death, a broken protocol); the
        calls sent ahead to it are dropped. How it ended, with the end of its output."""
        process, self.process = self.process, None
        self._pending.clear()
        self._held = []
        how = process.end(exc) + spawn.log_tail(process.log)
        spawn.remove_log(process.log)
        return how

    def _result(self, op, arrays, answer, deadline: Deadline) -> tuple:
        deadline.returned += 1
        if isinstance(answer, protocol.Outputs):
            return output_tuple(op, arrays, answer.outputs)
        if isinstance(answer, protocol.Unsupported):
            raise Unsupported(str(answer.text))
        if isinstance(answer, protocol.WroteInput):
            raise CheckFailure(str(answer.text))
        if isinstance(answer, protocol.TooLarge):
            raise CheckFailure(f"the outputs of {op} are too large: {answer.nbytes} bytes, "
                               f"over the {MAX_ANSWER_BYTES} bytes the suite reads of one answer")
        raise BackendRaised.remote(str(answer.text), str(answer.traceback))

    # --- the process -------------------------------------------------------------------
    def _ready(self, deadline: Deadline) -> None:
        """A process to call: a fresh one if none is running or a restart is due."""
        why = "the last one ended" if self.process is None else self._restart_due()
        if not why:
            return
        started = time.monotonic()
        self._retire()
        self.process, self.standby = self.standby or BackendProcess(self.options), None
        self.replaced = why
        try:
            declared = self.process.declaration()
        except BackendLoadError as exc:
            self.process = None
            raise BackendCrashed(f"a fresh backend process could not be started: {exc}") from None
        if declared != self.declaration:
            self._lost()
            changed = [f for f in declared.__dataclass_fields__
                       if getattr(declared, f) != getattr(self.declaration, f)]
            raise BackendCrashed("the backend's fresh process declared another "
                                 f"{', '.join(changed)} than the first")
        deadline.extend(time.monotonic() - started)

    def _restart_due(self) -> str:
        """Why the current process is to be replaced now ('' if it is not)."""
        process, options = self.process, self.options
        grown = (process.held_mib or 0.0) - (process.loaded_mib or 0.0)
        if options.restart_every and process.calls >= options.restart_every:
            return f"--restart-every {options.restart_every}: it had made {process.calls} calls"
        if options.restart_above_mib and grown > options.restart_above_mib:
            return f"it had grown by {grown:.0f} MiB (--restart-above {options.restart_above_mib:g})"
        limit, held, loaded = self.restart_above_maps, process.held_maps, process.loaded_maps
        # over the limit, and grown by a tenth of it since load: a process loaded near or
        # over the limit is not replaced at every call (a new one would hold as many)
        if limit and held is not None and loaded is not None and held > limit \
                and held - loaded > limit / 10:
            return f"it held {held} memory maps (the limit is {limit})"
        return ""

    def _retire(self) -> None:
        """Tell the current process to stop; it is ended (with its tree) at close()."""
        self._pending.clear()
        self._held = []
        if self.process is not None:
            self.process.stop()
            self.retired.append(self.process)
        self.process = None
        for process in [p for p in self.retired if p.proc.poll() is not None]:
            self.retired.remove(process)            # ended by itself: what it left behind
            process.close()
            spawn.remove_log(process.log)

    def close(self) -> None:
        """End every process (with its tree) and remove its log."""
        self._retire()
        for process in [*self.retired, *([self.standby] if self.standby else [])]:
            process.close()
            spawn.remove_log(process.log)
        self.retired, self.standby = [], None


class _TestCalls:
    """The backend for one test: its declaration, and its calls under the test's deadline."""

    def __init__(self, proxy: BackendProxy, deadline: Deadline):
        self.proxy, self.deadline, self.declaration = proxy, deadline, proxy.declaration

    def call(self, op: str, arrays: dict, params: dict) -> tuple:
        return self.proxy.call(op, arrays, params, self.deadline)


def maps_limit(share: float = MAPS_SHARE) -> int:
    """`share` of the memory maps the kernel allows one process (vm.max_map_count; the
    kernel's default is 65,530); 0 (no limit) where that is not known."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(int(f.read().strip()) * share)
    except (OSError, ValueError):
        return 0
