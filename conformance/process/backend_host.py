"""A backend in its own process: ``python -m attention_conformance.process.backend_host
FD REFERENCE [DEVICE]`` (with DEVICE, the backend is built with ``device=DEVICE``).

The judge (backend_proxy.py) starts it with one end of a socket pair as FD. It loads
the backend, answers with its declaration, then serves calls until told to stop: each
call is an op with its arrays and params, each answer carries the call's id and the
outputs, or what went wrong (unsupported, the exception raised, an input written into,
outputs over the size limit). Nothing is judged here: the judge checks every output in
its own process. A process that the adapter forks never answers: its child closes the
socket at once, and leaves if it ever returns here.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import time
import traceback

try:
    import resource
except ImportError:             # not on Windows
    resource = None

from ..backend.distributed import RankCrashed, dispatch
from ..backend.interface import declare
from ..backend.resolve import BackendLoadError, load_backend
from ..model.errors import BackendRaised, CheckFailure, Unsupported
from . import protocol
from .spawn import SPILL_ENV, end_with_parent
from .wire import MAX_ANSWER_BYTES, Channel, WireError, array_bytes


def _text(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:
        return f"{type(exc).__name__}: <its __str__ raised>"


@functools.cache
def _statm() -> tuple[int, float] | None:
    """This process's /proc/self/statm, opened once, and the MiB of a page (Linux)."""
    try:
        return os.open("/proc/self/statm", os.O_RDONLY), os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, AttributeError, ValueError):
        return None


def memory_mib() -> float | None:
    """The memory this process holds now (resident), in MiB: the runner restarts a
    process that has grown too much. Where /proc is missing (macOS), the most it has
    held; None where neither is known (or the adapter closed the file it is read from)."""
    statm = _statm()
    if statm is not None:
        fd, page_mib = statm
        try:
            return int(os.pread(fd, 128, 0).split()[1]) * page_mib
        except (OSError, ValueError, IndexError):
            return None
    if resource is None:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss   # KiB; bytes on macOS
    return peak / (2**20 if sys.platform == "darwin" else 2**10)


#: the exit status of a backend's process whose sharded call lost a rank (backend/distributed.py)
RANK_CRASHED = 70
MAPS_EVERY = 0.2        # seconds at least between two counts of the process's memory maps
MAPS_BUDGET = 0.05      # and at most this share of the time spent counting them


class MapCounter:
    """How many memory maps this process holds (the lines of /proc/self/maps; Linux), for
    the runner to replace a process before it holds all the kernel allows one
    (vm.max_map_count), past which it cannot map memory and crashes: XLA keeps ~20 maps
    for each program it compiled. Counting 60,000 maps takes ~70 ms, so count() counts
    at most every MAPS_EVERY seconds, and at most MAPS_BUDGET of the time."""

    def __init__(self):
        self.due = 0.0          # monotonic time of the next count

    def count(self, force: bool = False) -> int | None:
        """The number of maps now, or None when no count is due (or /proc is missing)."""
        started = time.monotonic()
        if not force and started < self.due:
            return None
        try:
            with open("/proc/self/maps", "rb") as f:
                lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
        except OSError:
            self.due = float("inf")
            return None
        cost = time.monotonic() - started
        self.due = started + max(MAPS_EVERY, cost / MAPS_BUDGET)
        return lines


def answer(adapter, call, holdings):
    """The answer to one call; holdings() gives (memory_mib, maps) of this process once
    the call is done."""
    try:
        outputs = dispatch(adapter, call.op, call.arrays, call.params)
    except RankCrashed as exc:         # a crash of this test: this process ends as its rank did
        sys.stderr.write(f"{exc}\n")
        sys.stderr.flush()
        os._exit(RANK_CRASHED)
    except BaseException as exc:
        return _failure(exc, (call.id, *holdings()))
    head = (call.id, *holdings())
    size = array_bytes(outputs)
    if size > MAX_ANSWER_BYTES:
        return protocol.TooLarge(*head, nbytes=size)
    return protocol.Outputs(*head, outputs=outputs)


def _failure(exc, head):
    """The answer to a call that raised exc."""
    if isinstance(exc, Unsupported):
        return protocol.Unsupported(*head, text=str(exc))
    if isinstance(exc, CheckFailure):
        return protocol.WroteInput(*head, text=str(exc))
    if isinstance(exc, BackendRaised):
        return protocol.Raised(*head, text=str(exc), traceback=_traceback(exc.__cause__))
    return protocol.Raised(*head, text=_text(exc), traceback=_traceback(exc))   # KeyboardInterrupt


def _traceback(exc) -> str:
    return "".join(traceback.format_exception(exc, limit=-4))[-4000:] if exc else ""


def serve(channel, adapter, counter) -> int:
    """Answer calls until told to stop (or the judge has gone)."""
    pid = os.getpid()
    while True:
        try:
            call = channel.receive()
        except (EOFError, OSError, WireError):
            return 0
        if not isinstance(call, protocol.Call):
            return 0
        reply = answer(adapter, call, lambda: (memory_mib(), counter.count()))
        if os.getpid() != pid:          # a child the adapter forked, returned here
            os._exit(0)
        try:
            channel.send(reply)
        except (OSError, EOFError):
            return 0
        except Exception as exc:        # outputs that cannot be encoded at all
            channel.send(protocol.Raised(reply.call, reply.memory_mib, reply.maps,
                                         text=f"the outputs could not be sent: {_text(exc)}",
                                         traceback=""))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    end_with_parent()                   # its judge
    sock = socket.socket(fileno=int(argv[0]))
    sock.set_inheritable(False)
    os.register_at_fork(after_in_child=sock.close)
    channel = Channel(sock, spill_from=os.environ.get(SPILL_ENV))      # spill.py
    try:
        adapter = load_backend(argv[1], argv[2] if len(argv) > 2 else None)
    except BackendLoadError as exc:
        channel.send(protocol.LoadError(str(exc)))
        return 2
    except BaseException as exc:
        channel.send(protocol.LoadError(f"backend {argv[1]!r} failed to load: {_text(exc)}"))
        return 2
    counter = MapCounter()
    channel.send(protocol.Declared(declare(adapter).as_dict(), memory_mib(),
                                   counter.count(force=True)))
    return serve(channel, adapter, counter)


if __name__ == "__main__":
    sys.exit(main())
