"""The scale profile on a backend (python benchmarks/bench.py scale): the wall time of
`attention-conformance certify BACKEND --profile scale` and the CPU seconds of every
process of the run, the peak memory of all of them together, each test's status and
seconds, and, for the first backend, what its golden data cost: the float64 reference's
and the plain same-dtype pass's CPU seconds, their share of the run's CPU seconds (and
of its wall), and the reference's achieved FLOP rate beside this machine's float64
matrix-product rate, measured in the same process before and after the run. On a shared
machine the CPU seconds are the figures: a wall time is the other users' as much as
the run's.

The golden data are computed again here, test by test, after the run (the judge's
process computed them during it, timed by nobody): the same code on the same inputs
(made first, untimed: the run makes them once for the backend's call and the golden),
right after, on the same machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")      # as certify sets it for the run

import numpy as np  # noqa: E402

from attention_conformance.golden import blocks, compute  # noqa: E402
from attention_conformance.golden.store import GoldenStore  # noqa: E402
from attention_conformance.model.folder import default_folder  # noqa: E402
from attention_conformance.specs.loader import load_file  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")


def _children() -> dict[int, list[int]]:
    """pid -> its child pids, from /proc."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(parent, []).append(int(entry.name))
    return tree


def tree_usage(pid: int) -> tuple[int, dict[int, float]]:
    """Resident bytes of a process and every process below it, together, and the CPU
    seconds (user and system) each of them has used so far."""
    tree, total, cpu, todo = _children(), 0, {}, [pid]
    while todo:
        current = todo.pop()
        try:
            total += int(Path(f"/proc/{current}/statm").read_text().split()[1]) * PAGE
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            cpu[current] = (int(fields[11]) + int(fields[12])) / TICKS
        except (OSError, IndexError, ValueError):
            pass
        todo += tree.get(current, [])
    return total, cpu


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and every process below it, together."""
    return tree_usage(pid)[0]


def certify(backend: str, report: Path) -> dict:
    """One certify run of the scale profile: wall, CPU seconds of all its processes (each
    one's last reading, four a second: a process that ends loses its last quarter
    second at most), peak memory (GB) and each test."""
    argv = [sys.executable, "-m", "attention_conformance", "certify", backend,
            "--profile", "scale", "--report", str(report), "-q"]
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    peak, out, cpu = [0], [], {}
    reader = threading.Thread(target=lambda: out.append(process.stdout.read()))
    reader.start()
    while process.poll() is None:
        rss, now = tree_usage(process.pid)
        peak[0] = max(peak[0], rss)
        cpu.update(now)
        time.sleep(0.25)
    reader.join()
    wall = time.perf_counter() - start
    records = json.loads((report / f"{backend}.json").read_text())["results"]
    return {"wall": round(wall, 1), "cpu": round(sum(cpu.values()), 1),
            "peak_memory_gb": round(peak[0] / 1e9, 2),
            "rc": process.returncode, "load_average": [round(x, 2) for x in os.getloadavg()],
            "tests": {r["id"]: {"status": r["status"], "seconds": round(r["seconds"], 1),
                                "why": (r["message"].splitlines() or [""])[0][:160]
                                if r["status"] != "pass" else ""} for r in records},
            "tail": "".join(out)[-600:] if process.returncode else ""}


def matmul_rate(seconds: float = 3.0, size: int = 1024) -> tuple[float, float]:
    """float64 GFLOP of square matrix products per wall second on every core (one product
    per thread at a time, one OpenBLAS thread each, as the reference runs its blocks),
    and per CPU second of those threads."""
    a = np.random.RandomState(0).standard_normal((size, size))
    count, lock = [0], threading.Lock()
    stop = time.perf_counter() + seconds

    def work():
        while time.perf_counter() < stop:
            a @ a
            with lock:
                count[0] += 1
    threads = [threading.Thread(target=work) for _ in range(blocks.workers())]
    start, cpu = time.perf_counter(), time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flops = 2 * size ** 3 * count[0] / 1e9
    return (round(flops / (time.perf_counter() - start), 2),
            round(flops / (time.process_time() - cpu), 2))


def golden_cost(test_ids) -> dict:
    """Each test's golden data computed again: wall and CPU seconds, and the reference's
    work (blocks.STATS); its inputs made first, untimed (a scale test's are made once and
    shared by its call and its golden: compute.rounded_inputs)."""
    cases, _ = load_file(default_folder().cases_dir / "scale.yaml")
    store, found = GoldenStore(), {}
    for case in cases:
        for variant in case.variants:
            for dtype in case.dtypes:
                label = f"{variant.label}-{dtype}" if variant.label else dtype
                test = f"{case.topic}/{case.id}[{label}]"
                if test not in test_ids:
                    continue
                compute.rounded_inputs(case, variant, dtype)
                blocks.reset_stats()
                start, cpu = time.perf_counter(), time.process_time()
                store.get(case, variant, dtype)
                found[test] = {"seconds": round(time.perf_counter() - start, 2),
                               "cpu_seconds": round(time.process_time() - cpu, 2),
                               **blocks.reset_stats()}
    return found


def _rate(done: list, seconds: str = "cpu_seconds") -> float | None:
    """GFLOP per second (CPU seconds, or wall: seconds="seconds") of blocks.STATS parts."""
    spent = sum(d[seconds] for d in done)
    return round(sum(d["flops"] for d in done) / spent / 1e9, 2) if spent else None


def long_profile_rates() -> tuple[float | None, float | None]:
    """The float64 reference's GFLOP per CPU second and per wall second on the long
    profile's sdpa cases (every row computed), float32 tests: the exact pass is the same
    in every dtype."""
    cases, _ = load_file(default_folder().cases_dir / "long.yaml")
    store, done = GoldenStore(), []
    for case in cases:
        if blocks.blocked(case.op, case.params) and "float32" in case.dtypes:
            for variant in case.variants:
                compute.rounded_inputs(case, variant, "float32")
                blocks.reset_stats()
                store.get(case, variant, "float32")
                done.append(blocks.reset_stats()["exact"])
    return _rate(done), _rate(done, "seconds")


def reference_figures(run: dict) -> dict:
    before = matmul_rate()
    passed = {test for test, t in run["tests"].items() if t["status"] == "pass"}
    tests = golden_cost(passed)
    long_cpu, long_wall = long_profile_rates()
    after = matmul_rate()
    total = sum(t["seconds"] for t in tests.values())
    cpu = sum(t["cpu_seconds"] for t in tests.values())
    return {"seconds": round(total, 1), "share": round(total / run["wall"], 3),
            "cpu_seconds": round(cpu, 1), "cpu_share": round(cpu / run["cpu"], 3),
            "exact_gflops": _rate([t["exact"] for t in tests.values()]),
            "plain_gflops": _rate([t["plain"] for t in tests.values()]),
            "long_profile_gflops": long_cpu, "long_profile_gflops_wall": long_wall,
            "matmul_gflops": [before[1], after[1]],
            "matmul_gflops_wall": [before[0], after[0]],
            "threads": blocks.workers(), "tests": tests}


def figures(backends, scratch: Path) -> dict:
    """The figures of `bench.py scale`: each backend's run, the first one's golden cost."""
    runs = {}
    for backend in backends:
        runs[backend] = certify(backend, scratch / backend)
    return {"backends": runs, "reference": reference_figures(runs[backends[0]]),
            "reference_backend": backends[0]}
