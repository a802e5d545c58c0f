"""The framework's floor: every call a certification run makes to a backend, recorded,
then replayed outside the suite on the same inputs, nothing checked.

Recording is an adapter that wraps a built-in backend, declares what it declares (so the
run is the backend's own run) and saves each call's arrays and params:

    BENCH_RECORD_BACKEND=torch BENCH_RECORD_DIR=/tmp/rec \\
        pytest spec/cases --backend benchmarks/recording.py:Recording

`python benchmarks/recording.py replay NAME DIR` loads the backend in a fresh interpreter
and makes each recorded call once (import, construction, compiling or building a session
as the framework does, running), printing one JSON line. The floor is that program's
time from its start to its last call's return, less its reading of the recorded inputs
(floor_of): what the same work costs as a program of its own. Not its exit, which can
take a framework a second, and which a certification run does not wait for either.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np


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
            return method(*args, **kwargs)
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
    """Call the backend once per recorded call. Exceptions are what the suite saw too:
    counted, not fatal. inputs_seconds: reading the recorded calls, the one part of this
    program that is not the work (the suite builds its inputs in another process)."""
    started = time.perf_counter()
    calls = load_calls(directory)
    inputs = time.perf_counter() - started
    started = time.perf_counter()
    from attention_conformance.backend.resolve import load_backend

    backend = load_backend(name)
    loaded = time.perf_counter() - started
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
            "raised": raised, "caches_cleared": maps.cleared}


def floor_of(started_at: float, replay: dict) -> float:
    """The replaying program's seconds from its start (time.time() before it was started)
    to its last call's return, less its reading of the recorded inputs."""
    return replay["ended_at"] - started_at - replay["inputs_seconds"]


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "replay":
        sys.exit("usage: python benchmarks/recording.py replay NAME DIR")
    print(json.dumps(replay(sys.argv[2], Path(sys.argv[3]))))
