"""Record every call a certification run makes to a backend, and replay them outside the
suite: the framework's own floor for the same work (see docs/benchmarks.md, "Targets").

Recording is an adapter that wraps a built-in backend and saves each call's arrays and
params before passing it on (one .npz and one JSON line per call):

    BENCH_RECORD_BACKEND=jax BENCH_RECORD_DIR=/tmp/rec \\
        pytest spec/cases --backend benchmarks/recording.py:Recording

It declares what the wrapped backend declares (name, dtypes, policy, expected failures),
so the run is the backend's own run. With JAX loaded it also counts the programs XLA
compiles and their seconds (jax.monitoring's backend-compile event) into the folder.

Replaying (`python benchmarks/recording.py replay NAME DIR`) loads the backend in a
fresh interpreter and calls it once per recorded call, on the same inputs, nothing
checked: framework import, adapter construction, compiling (or building a session for)
each program and running it. It prints one JSON line: seconds (reading the recorded
inputs, the load, the calls), calls, and for JAX the programs compiled and their
compile seconds. The floor (targets.py) is this program's time from its start (the
interpreter's included) to its last call's return, less its seconds reading the inputs.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def _plain(value):
    """params as JSON (tuples kept as tuples)."""
    if isinstance(value, tuple):
        return {"__tuple__": [_plain(v) for v in value]}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    return value


def _unplain(value):
    if isinstance(value, dict):
        if "__tuple__" in value:
            return tuple(_unplain(v) for v in value["__tuple__"])
        return {k: _unplain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unplain(v) for v in value]
    return value


class CompileCounter:
    """Programs XLA compiles in this process, and their seconds (JAX only)."""

    def __init__(self):
        self.programs, self.seconds = 0, 0.0
        if "jax" in sys.modules:
            import jax

            jax.monitoring.register_event_duration_secs_listener(self._event)

    def _event(self, event, duration, **_):
        if event == COMPILE_EVENT:
            self.programs += 1
            self.seconds += duration


class Recording:
    """The backend named by $BENCH_RECORD_BACKEND, each call saved under $BENCH_RECORD_DIR."""

    def __init__(self, device=None):
        from attention_conformance.specs.expected import BUILTIN_DIR
        from attention_conformance.backend.resolve import load_backend
        from attention_conformance.model.ops import OPS

        name = os.environ["BENCH_RECORD_BACKEND"]
        self._real = load_backend(name, device) if device else load_backend(name)
        self._dir = Path(os.environ["BENCH_RECORD_DIR"])
        self._dir.mkdir(parents=True, exist_ok=True)
        self._prefix = f"{os.getpid()}-"
        self._count = 0
        self._compiles = CompileCounter()
        for key in ("name", "dtypes", "policy", "versions", "paths"):
            setattr(self, key, getattr(self._real, key))
        builtin = BUILTIN_DIR / f"{self.name}.yaml"
        self.expected_failures_file = getattr(self._real, "expected_failures_file", None) or (
            str(builtin) if builtin.exists() else None)
        for op, spec in OPS.items():
            method = getattr(self._real, op, None)
            if callable(method):
                setattr(self, op, self._recorder(op, spec.positional, method))

    def _recorder(self, op, positional, method):
        def call(*args, **kwargs):
            arrays = dict(zip(positional, args))
            params = {}
            for key, value in kwargs.items():
                (arrays if isinstance(value, np.ndarray) else params)[key] = value
            stem = f"{self._prefix}{self._count:06d}"
            self._count += 1
            np.savez(self._dir / f"{stem}.npz", **arrays)
            line = {"file": f"{stem}.npz", "op": op, "positional": list(positional),
                    "dtypes": {n: str(a.dtype) for n, a in arrays.items()},
                    "params": _plain(params)}
            with open(self._dir / "calls.jsonl", "a") as f:
                f.write(json.dumps(line) + "\n")
            try:
                return method(*args, **kwargs)
            finally:
                if self._compiles.programs:
                    (self._dir / f"compiles-{os.getpid()}.json").write_text(json.dumps(
                        {"programs": self._compiles.programs,
                         "seconds": self._compiles.seconds}))
        call.__name__ = op
        return call


def load_calls(directory: Path) -> list[dict]:
    """The recorded calls, with their arrays (bfloat16 restored from the dtype names)."""
    from attention_conformance.model.dtypes import NUMPY_DTYPES

    calls = []
    for raw in (directory / "calls.jsonl").read_text().splitlines():
        line = json.loads(raw)
        with np.load(directory / line["file"]) as data:
            arrays = {}
            for name, dtype in line["dtypes"].items():
                array = data[name]
                wanted = NUMPY_DTYPES.get(dtype, np.dtype(dtype))
                arrays[name] = array.view(wanted) if array.dtype != wanted else array
        calls.append({**line, "arrays": arrays, "params": _unplain(line["params"])})
    return calls


def suite_compiles(directory: Path) -> dict:
    """Programs compiled in the recorded run, summed over its backend processes."""
    found = [json.loads(p.read_text()) for p in directory.glob("compiles-*.json")]
    return {"programs": sum(f["programs"] for f in found),
            "seconds": sum(f["seconds"] for f in found)}


class MapsKept:
    """Keeps the replaying process under the memory maps the kernel allows it: XLA keeps
    ~20 maps for each program it compiled, and one process compiling the whole spec's
    ~3,500 programs runs out ("Cannot allocate memory"). The suite replaces its backend's
    process at the same limit; the replay drops JAX's compiled programs instead
    (jax.clear_caches), which costs less than a new process, so the floor is not raised."""

    def __init__(self):
        from attention_conformance.process.backend_proxy import maps_limit
        from attention_conformance.process.backend_host import MapCounter

        self.limit, self.counter, self.cleared = maps_limit(), MapCounter(), 0

    def keep_under_limit(self):
        if "jax" not in sys.modules or not self.limit:     # nothing to drop, or no limit
            return
        count = self.counter.count()
        if not count or count <= self.limit:
            return
        import gc

        import jax

        jax.clear_caches()
        gc.collect()
        self.cleared += 1


def replay(name: str, directory: Path) -> dict:
    """Call the backend once per recorded call (loaded before the clock starts: the
    import is timed apart). Exceptions are what the suite saw too: counted, not fatal.
    inputs_seconds: reading the recorded calls from disk, the one part of this program
    that is not the work (the suite builds its inputs in another process); ended_at: the
    clock's time when the last call returned (the interpreter's exit, which can take a
    framework a second and which no run waits for, is not the work either)."""
    started = time.perf_counter()
    calls = load_calls(directory)
    inputs = time.perf_counter() - started
    started = time.perf_counter()
    from attention_conformance.backend.resolve import load_backend

    backend = load_backend(name)
    loaded = time.perf_counter() - started
    compiles = CompileCounter()
    maps = MapsKept()
    raised = 0
    started = time.perf_counter()
    for call in calls:
        maps.keep_under_limit()
        arrays = dict(call["arrays"])
        args = [arrays.pop(n) for n in call["positional"] if n in arrays]
        try:
            with np.errstate(all="ignore"):
                getattr(backend, call["op"])(*args, **arrays, **call["params"])
        except Exception:  # noqa: BLE001 - the suite saw the same exception
            raised += 1
    calls_seconds = time.perf_counter() - started
    return {"ended_at": time.time(), "calls": len(calls), "inputs_seconds": inputs,
            "load_seconds": loaded, "calls_seconds": calls_seconds,
            "raised": raised, "programs": compiles.programs,
            "compile_seconds": compiles.seconds, "caches_cleared": maps.cleared}


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "replay":
        sys.exit("usage: python benchmarks/recording.py replay NAME DIR")
    print(json.dumps(replay(sys.argv[2], Path(sys.argv[3]))))
