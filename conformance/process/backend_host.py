"""A backend in its own process: ``python -m attention_conformance.process.backend_host FD REFERENCE
[DEVICE]`` (with DEVICE, the backend is built with ``device=DEVICE``).

The runner (isolation.py) starts it with one end of a socket pair as FD. It loads the
backend, answers with its declaration, then serves calls until told to stop: each
request is an op with its arrays and params (or a batch of such, answered one by one),
each answer the outputs, or what went wrong (unsupported, the exception raised, an input
written into). Nothing is judged
here: the runner checks every output in its own process.
"""

from __future__ import annotations

import functools
import os
import sys
import time
import traceback
from multiprocessing.connection import Connection

try:
    import resource
except ImportError:             # not on Windows
    resource = None

from . import wire
from ..backend.calling import assert_unchanged, call_arguments, snapshot, unaccepted, unaccepted_text
from ..backend.interface import op_policy
from .spawn import end_with_parent
from ..backend.resolve import BackendLoadError, load_backend
from ..model.ops import OPS
from ..model.errors import CheckFailure


def _text(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:
        return f"{type(exc).__name__}: <its __str__ raised>"


def declaration(backend) -> dict:
    def plain(value, kind):
        try:
            return kind(value)
        except Exception:
            return kind()
    return {
        "name": str(getattr(backend, "name", "")),
        "dtypes": sorted(str(d) for d in plain(getattr(backend, "dtypes", ()), list)),
        "policy": {str(k): str(v) for k, v in plain(getattr(backend, "policy", {}), dict).items()},
        "versions": {str(k): str(v) for k, v in plain(getattr(backend, "versions", {}), dict).items()},
        "paths": {str(k): str(v) for k, v in plain(getattr(backend, "paths", {}), dict).items()},
        "op_policy": {str(op): {str(k): str(v) for k, v in plain(chosen, dict).items()}
                      for op, chosen in op_policy(backend).items()},
        "module": type(backend).__module__,
        "expected_failures_file": str(getattr(backend, "expected_failures_file", "") or ""),
        "ops": [op for op in OPS if callable(getattr(backend, op, None))],
    }


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
    held; None where neither is known."""
    statm = _statm()
    if statm is not None:
        fd, page_mib = statm
        return int(os.pread(fd, 128, 0).split()[1]) * page_mib
    if resource is None:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss   # KiB; bytes on macOS
    return peak / (2**20 if sys.platform == "darwin" else 2**10)


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


def serve_one(backend, request: dict):
    op, arrays, params = request["op"], request["arrays"], request["params"]
    method = getattr(backend, op, None)
    if method is None:
        return {"unsupported": f"backend has no method {op!r}"}
    positional, keywords = call_arguments(op, arrays)
    missing = unaccepted(method, [*keywords, *params])
    if missing:
        return {"unsupported": unaccepted_text(op, missing)}
    before = snapshot(arrays)
    try:
        result = method(*positional, **keywords, **params)
    except NotImplementedError as exc:
        return {"unsupported": str(exc) or type(exc).__name__}
    except BaseException as exc:          # SystemExit or KeyboardInterrupt included
        return {"raised": _text(exc), "traceback": "".join(
            traceback.format_exception(exc, limit=-4))[-4000:]}
    try:
        assert_unchanged(before, arrays)
    except CheckFailure as exc:
        return {"wrote_input": str(exc)}
    return {"outputs": result}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    end_with_parent()          # its runner: the judge's process, or any IsolatedBackend's
    conn = Connection(int(argv[0]))
    try:
        backend = load_backend(argv[1], argv[2] if len(argv) > 2 else None)
    except BackendLoadError as exc:
        wire.send(conn, {"load_error": str(exc)})
        return 2
    except BaseException as exc:
        wire.send(conn, {"load_error": f"backend {argv[1]!r} failed to load: {_text(exc)}"})
        return 2
    counter = MapCounter()
    wire.send(conn, {"declared": declaration(backend), "memory_mib": memory_mib(),
                     "maps": counter.count(force=True)})
    while True:
        try:
            request = wire.receive(conn)
        except EOFError:
            return 0
        if request.get("stop"):
            return 0
        for one in request["batch"] if "batch" in request else [request]:
            answer = serve_one(backend, one)
            answer["memory_mib"] = memory_mib()
            answer["maps"] = counter.count()
            try:
                wire.send(conn, answer)
            except Exception as exc:           # outputs that cannot be sent at all
                wire.send(conn, {"raised": f"the outputs could not be sent: {_text(exc)}"})


if __name__ == "__main__":
    sys.exit(main())
