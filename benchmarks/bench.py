#!/usr/bin/env python3
"""What a certification costs (docs/benchmarks.md). Each command measures one thing and
writes benchmarks/results/KIND.json with its Markdown beside it:

    python benchmarks/bench.py overhead                 # NumPy quick run against pytest alone
    python benchmarks/bench.py floors --backend numpy --backend torch
    python benchmarks/bench.py suite                    # the suite's own tests
    python benchmarks/bench.py matrix --tox-log reports/tox.log --tox-time reports/tox.time
    python benchmarks/bench.py paired --base main --head . --backend numpy --backend torch
    python benchmarks/bench.py paired --base OLD --head . --spec OLD   # the code alone
    python benchmarks/bench.py scale --backend numpy    # --profile scale: wall, memory, golden

Medians of --repeat runs, each a fresh process. Nothing here is a test: a figure taken
on a busy machine is inflated, and the results files record the load average.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

# one OpenBLAS thread in this process as in every run it times (tox.ini's setting): set
# before anything imports NumPy (recording does), else OpenBLAS's idle threads spin
# after each product and scale.py's CPU seconds count them
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import render  # noqa: E402
from measure import (HERE, ROOT, TOX_ENV, Tree, commit_of, items_of, machine,  # noqa: E402
                     pytest_counts, tail, timed)
from recording import floor_of  # noqa: E402


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def items_in(run) -> int:
    return items_of(pytest_counts(run.output))


def overhead(tree: Tree, repeat: int) -> dict:
    """The NumPy quick run, isolated and in-process, against pytest alone on as many items."""
    tree.certify("numpy")                     # warms the tree's spec and module caches
    walls = {"isolated": [], "in_process": [], "bare": []}
    for i in range(repeat):
        log(f"overhead: {i + 1}/{repeat}")
        run = tree.certify("numpy")
        walls["isolated"].append(run.wall)
        walls["in_process"].append(tree.certify("numpy", "--in-process").wall)
        walls["bare"].append(tree.bare(items_in(run)).wall)
    return {"backend": "numpy", "items": items_in(run), **walls}


def floors(tree: Tree, backends: list[str], repeat: int, topics: list[str] | None) -> dict:
    cases = only_topics(tree, topics) if topics else None
    return {"topics": topics or "all",
            "backends": {backend: floor(tree, backend, repeat, cases) for backend in backends}}


def floor(tree: Tree, backend: str, repeat: int, cases: Path | None) -> dict:
    """The backend's quick runs and its floor: the same calls replayed outside the suite
    (recording.py), a run and a replay in turn."""
    record = tree.scratch / f"record-{backend}"
    env = dict(tree.env_for(backend), BENCH_RECORD_BACKEND=backend, BENCH_RECORD_DIR=str(record))
    log(f"floors {backend}: the recorded run")
    tree.certify(f"{HERE / 'recording.py'}:Recording", cases=cases, env=env)
    runs, replays = [], []
    for i in range(repeat):
        log(f"floors {backend}: {i + 1}/{repeat}")
        runs.append(tree.certify(backend, cases=cases))
        replays.append(replayed(tree, backend, record))
    shutil.rmtree(record, ignore_errors=True)
    replays.sort(key=lambda replay: replay["floor"])
    return {"items": items_in(runs[0]), "runs": [run.wall for run in runs],
            "floors": [replay["floor"] for replay in replays],
            "replay": replays[len(replays) // 2]}


def replayed(tree: Tree, backend: str, record: Path) -> dict:
    started_at = time.time()
    run = timed([sys.executable, str(HERE / "recording.py"), "replay", backend, str(record)],
                env=tree.env_for(backend), cwd=tree.root)
    lines = [line for line in run.output.splitlines() if line.startswith("{")]
    if run.rc != 0 or not lines:
        raise RuntimeError(f"{backend}: the replay broke (rc {run.rc}):\n{tail(run.output)}")
    replay = json.loads(lines[-1])
    return {**replay, "floor": floor_of(started_at, replay)}


def only_topics(tree: Tree, topics: list[str]) -> Path:
    """A copy of the tree's spec folder with the case files of these topics alone."""
    spec = tree.scratch / "spec-topics"
    shutil.copytree(tree.spec, spec, ignore=shutil.ignore_patterns("__pycache__"))
    for path in (spec / "cases").glob("*.yaml"):
        if path.stem not in topics:
            path.unlink()
    return spec / "cases"


def suite(repeat: int, scratch: Path) -> dict:
    """The suite's own tests as tox's suite environment runs them, on this checkout."""
    env = dict(os.environ, PYTHONPYCACHEPREFIX=str(scratch / "pycache"))
    for key, value in TOX_ENV.items():
        env.setdefault(key, value)
    runs = []
    for i in range(repeat):
        log(f"suite: {i + 1}/{repeat}")
        run = timed([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "auto",
                     "tests"], env=env, cwd=ROOT)
        if run.rc != 0:
            raise RuntimeError(f"the suite's tests failed (rc {run.rc}):\n{tail(run.output)}")
        runs.append({"wall": run.wall, "cpu": run.cpu})
    return {"runs": runs, "counts": pytest_counts(run.output)}


def paired(base: Tree, head: Tree, backends: list[str], repeat: int,
           spec: str | None = None) -> dict:
    """Each backend's quick run on both trees (both on the spec of commit `spec` where one
    is given), alternating: wall and CPU seconds of every process of each run."""
    trees = {"base": base, "head": head}
    for tree in trees.values():
        if spec:
            tree.on_spec(spec)
    figures = {name: {"label": tree.label, "commit": tree.commit} for name, tree in trees.items()}
    figures.update(repeat=repeat, backends={}, **({"spec": spec} if spec else {}))
    for backend in backends:
        items = [items_in(tree.certify(backend)) for tree in trees.values()]   # warms both
        walls, cpu = {"base": [], "head": []}, {"base": [], "head": []}
        for name, tree in alternating(trees, repeat):
            log(f"paired {backend}: {name} {len(walls[name]) + 1}/{repeat}")
            run = tree.certify(backend)
            walls[name].append(run.wall)
            cpu[name].append(run.cpu)
        figures["backends"][backend] = {**walls, "cpu": cpu, "items": items}
    return figures


def alternating(trees: dict, repeat: int):
    """Each tree `repeat` times, in pairs whose order alternates (AB BA AB ...): a drift of
    the machine, or a cost to whichever runs second, falls on both sides alike."""
    names = list(trees)
    for i in range(repeat):
        for name in names if i % 2 == 0 else names[::-1]:
            yield name, trees[name]


# ---------------------------------------------------------------- the matrix, from tox's log

def tox_envs(text: str) -> dict:
    """Each environment's closing line (tox 4: `  numpy: OK (28.30=setup[10.20]+cmd[18.10]
    seconds)`): status, seconds, setup seconds."""
    envs = {}
    for m in re.finditer(r"^\s*([\w.-]+): (OK|FAIL|SKIP)[^(\n]*\(([\d.]+)"
                         r"(?:=setup\[([\d.]+)\])?", text, re.MULTILINE):
        envs[m[1]] = {"status": m[2], "seconds": float(m[3]),
                      "setup": float(m[4]) if m[4] else None}
    return envs


def tox_time(text: str) -> dict:
    """What .ci/run writes to reports/tox.time: the machine's busy CPU seconds over the run
    (every process, /proc/stat) where it could read them, else bash's `time` of tox (the
    processes tox waited for only); the CPU seconds the hypervisor stole meanwhile."""
    busy = re.search(r"machine busy ([\d.]+)", text)
    bash = re.search(r"user ([\d.]+) sys ([\d.]+)", text)
    stolen = re.search(r"machine stolen ([\d.]+)", text)
    cpu = float(busy[1]) if busy else (float(bash[1]) + float(bash[2]) if bash else None)
    return {"cpu_seconds": cpu, "stolen_seconds": float(stolen[1]) if stolen else None}


def matrix(log_text: str, time_text: str, kind: str) -> dict:
    total = re.findall(r"(congratulations :\)|evaluation failed :\() \(([\d.]+) seconds\)",
                       log_text)
    return {"tox_kind": kind, "wall": float(total[-1][1]) if total else None,
            "ok": bool(total) and total[-1][0].startswith("congratulations"),
            "envs": tox_envs(log_text), "cores": len(os.sched_getaffinity(0)),
            **tox_time(time_text)}


# ---------------------------------------------------------------- results and command line

def save(kind: str, figures: dict, *, date: str | None = None, load_known=True) -> None:
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    command = ["python", os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]
    record = {"kind": kind, "date": date or now, "commit": commit_of(ROOT),
              "machine": machine(), "command": shlex.join(command), "figures": figures}
    if not load_known:                       # measured before now: today's load is not its
        record["machine"]["load_average"] = None
    render.write(record)
    print(render.page(record))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = p.add_subparsers(dest="command", required=True)
    commands.add_parser("overhead").add_argument("--repeat", type=int, default=9)
    floors_p = commands.add_parser("floors")
    floors_p.add_argument("--backend", action="append", dest="backends")
    floors_p.add_argument("--repeat", type=int, default=7)
    floors_p.add_argument("--topics", type=lambda text: text.split(","),
                          help="comma-separated case files (default: the whole quick spec)")
    commands.add_parser("suite").add_argument("--repeat", type=int, default=3)
    matrix_p = commands.add_parser("matrix", help="read a `tox -p` run's log: nothing is run")
    matrix_p.add_argument("--tox-log", type=Path, required=True)
    matrix_p.add_argument("--tox-time", type=Path, help=".ci/run's reports/tox.time")
    matrix_p.add_argument("--kind", choices=("cold", "fresh", "warm"), default="warm")
    matrix_p.add_argument("--save", action="store_true",
                          help="write benchmarks/results/matrix-KIND.json, not only the line")
    paired_p = commands.add_parser("paired")
    paired_p.add_argument("--base", required=True, help="a commit or a checkout's folder")
    paired_p.add_argument("--head", required=True, help="a commit or a checkout's folder")
    paired_p.add_argument("--backend", action="append", dest="backends")
    paired_p.add_argument("--repeat", type=int, default=9)
    paired_p.add_argument("--spec", help="a commit whose spec both trees certify (default: "
                          "each tree its own)")
    scale_p = commands.add_parser("scale", help="--profile scale on each backend (the first: "
                                  "its golden data's cost and the reference's rate)")
    scale_p.add_argument("--backend", action="append", dest="backends")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.command == "matrix":
        text = args.tox_time.read_text() if args.tox_time and args.tox_time.exists() else ""
        figures = matrix(args.tox_log.read_text(errors="replace"), text, args.kind)
        print(render.matrix_line(figures))
        if args.save:
            ended = datetime.datetime.fromtimestamp(args.tox_log.stat().st_mtime, datetime.UTC)
            save(f"matrix-{args.kind}", figures, date=ended.isoformat(timespec="seconds"),
                 load_known=False)
        return 0
    with tempfile.TemporaryDirectory(prefix="attention-bench-") as scratch:
        scratch = Path(scratch)
        if args.command == "overhead":
            save("overhead", overhead(Tree(str(ROOT), scratch), args.repeat))
        elif args.command == "floors":
            save("floors", floors(Tree(str(ROOT), scratch), args.backends or ["numpy", "torch"],
                                  args.repeat, args.topics))
        elif args.command == "suite":
            save("suite", suite(args.repeat, scratch))
        elif args.command == "scale":
            import scale                    # NumPy and the suite: only this command needs them
            save("scale", scale.figures(args.backends or ["numpy"], scratch))
        else:
            base, head = Tree(args.base, scratch / "base"), Tree(args.head, scratch / "head")
            save("paired", paired(base, head, args.backends or ["numpy", "torch"], args.repeat,
                                  args.spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
