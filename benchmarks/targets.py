#!/usr/bin/env python3
"""The speed targets, one figure each, with "meets" or "misses" (docs/benchmarks.md).

    python benchmarks/targets.py                      # every target this machine can run
    python benchmarks/targets.py --only suite,overhead
    python benchmarks/targets.py --tox-log tox.log --tox-kind warm   # read a tox -p log
    python benchmarks/targets.py --tox-log tox.log --tox-time tox.time  # and its CPU time
    python benchmarks/targets.py --summary            # the one line, from the last figures

Targets (issue 16):

1. tox: the whole `tox -p` matrix, <= 600 s cold (empty caches), <= 180 s warm; read
   from the output of a `tox -p` run (`--tox-log`), never re-run here.
2. suite: `pytest tests -n 2` (what `tox -e suite` runs), <= 180 s wall.
3. overhead: the NumPy quick run, isolated (the default) and warm, against a bare pytest
   run of as many items (a generated file of that many parametrised no-op tests, the
   same flags, the plugin off): <= 1.5x; beside it the in-process figure, a run whose
   cases do nothing (benchmarks/null_cases.py: the runner's machinery alone), and the
   floor of a serial run (that + the seconds spent inside the cases).
4. floor: for jax, tensorflow, torch and onnxruntime, the certification run's wall
   against the framework's floor for the same work: every backend call of that run
   recorded (benchmarks/recording.py) and replayed once, on the same inputs, in a fresh
   interpreter with nothing checked (the program's start, framework import, adapter
   construction, compiling or building a session, running; not its reading of the
   recorded inputs, nor its exit): <= 1.2x. Beside it, a bare pytest run of as many
   items: no run can cost less than the floor plus that; pytest's start until a plugin
   knows the options; and NumPy's run of the same tests, the suite's own work on them
   (a run costing no more than the floor plus that adds nothing of its own for the
   framework). For JAX, the programs XLA
   compiled in the run and in the replay, and their compile seconds. Medians of
   --repeat runs and replays; a run longer than LONG_RUN seconds (JAX's whole spec
   takes minutes) is measured once.
5. growth: what each case family costs, per case and per item, on NumPy and on JAX
   (where every new shape is a new XLA program: the family's cost to the matrix): the
   topic's run minus a run of the same spec folder that selects nothing (start-up,
   load, spec). Reported, no bound.

Beside target 1, `--only env_cpu` runs each environment of tox.ini's env_list alone
(`tox -e ENV`, one after another; warm: after a `tox -p`) and records its wall and the
machine's busy CPU seconds over it (/proc/stat): where a warm matrix's CPU goes. Their
sum over the cores is the least wall any schedule of that work can take. Reported, no
bound.

Each run merges its figures into benchmarks/results-targets.json (figures not measured
keep their earlier value and date) and rewrites benchmarks/results.md. Timings are only
meaningful on a quiet machine; the load average is recorded with every figure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from bench import BACKEND_ENV, BARE_TEST, COMMON_ENV, items_of, parse_summary, tail  # noqa: E402
from options_known import PREFIX as OPTIONS_KNOWN  # noqa: E402

FIGURES = HERE / "results-targets.json"
RESULTS = HERE / "results.md"
FLOOR_BACKENDS = ("jax", "tensorflow", "torch", "onnxruntime")
GROWTH_TOPICS = ("tiles", "varlen", "lse", "sinks", "precision")
#: backend -> how many runs of each topic (None: --repeat). JAX compiles every program
#: anew in each run (no persistent cache here), so one run is its figure.
GROWTH_BACKENDS = {"numpy": None, "jax": 1}
#: a floor's run longer than this (seconds) is measured once, not --repeat times: its
#: noise is small against its length (JAX's whole spec: minutes a run)
LONG_RUN = 60.0
#: figures kept beside the targets, never judged
UNJUDGED = ("growth", "notes", "suite_in_matrix", "env_cpu")
TARGETS = {"tox_cold": 600.0, "tox_warm": 180.0, "tox_fresh": 600.0, "suite": 180.0, "overhead": 1.5,
           "floor": 1.2}
#: a tox run whose wall is within this factor of its CPU seconds / cores kept every core
#: busy (idle under 5 %): "at its floor", the floor of that much work on this machine
TOX_BUSY_SLACK = 1.05
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest"]
#: the same run with cases that do nothing (benchmarks/null_cases.py): the machinery alone
NULL_CASES = [PYTEST[0], str(HERE / "null_cases.py"), *PYTEST[3:]]


def log(message):
    print(f"[targets] {message}", file=sys.stderr, flush=True)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def load() -> list:
    return [round(x, 2) for x in os.getloadavg()]


def run_ended(log: Path) -> str:
    """When a recorded run ended: its log's last write (not when it is recorded)."""
    stamp = datetime.datetime.fromtimestamp(log.stat().st_mtime, datetime.UTC)
    return stamp.isoformat(timespec="seconds")


def run(args, *, env=None, cwd=ROOT, timeout=3600):
    """(wall, cpu of the child and its waited-for descendants, rc, output)."""
    import resource

    def cpu():
        u = resource.getrusage(resource.RUSAGE_CHILDREN)
        return u.ru_utime + u.ru_stime

    before, start = cpu(), time.perf_counter()
    try:
        done = subprocess.run(args, check=False, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - start, None, None, "[timed out]"
    return time.perf_counter() - start, cpu() - before, done.returncode, done.stdout


def _cpu_seconds(columns, stat_text: str | None) -> float | None:
    """The sum of these columns of /proc/stat's `cpu` line (all CPUs, since boot), in
    seconds; None where the file or a column is missing."""
    try:
        text = stat_text if stat_text is not None else Path("/proc/stat").read_text()
        fields = next(line for line in text.splitlines() if line.startswith("cpu ")).split()
        return sum(int(fields[i]) for i in columns) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, IndexError, ValueError):
        return None


def stolen_seconds(stat_text: str | None = None) -> float | None:
    """CPU seconds the hypervisor has taken from this virtual machine since boot, over all
    its CPUs (the steal column of /proc/stat); None where there is no such column. On a
    shared 2-vCPU machine it can be a third of a run's wall: a figure measured then
    overstates what the suite costs."""
    return _cpu_seconds((8,), stat_text)


def busy_seconds(stat_text: str | None = None) -> float | None:
    """CPU seconds this machine's CPUs have been busy since boot, all processes (user, nice,
    system, irq, softirq of /proc/stat, as .ci/run counts them), or None."""
    return _cpu_seconds((1, 2, 3, 6, 7), stat_text)


def tox_envs(ini: Path = ROOT / "tox.ini") -> list[str]:
    """The environments of tox.ini's env_list, in its order."""
    import configparser

    config = configparser.ConfigParser(interpolation=None)
    config.read(ini)
    return [e.strip() for e in config["tox"]["env_list"].split(",") if e.strip()]


def median(values):
    values = sorted(v for v in values if v is not None)
    return values[len(values) // 2] if values else None


def replay_figures(started_at: float, replay: dict) -> dict:
    """A replay's figures with its floor: the replaying program's time from its start
    (time.time() before it was started) to its last call's return (a fresh interpreter's
    start, NumPy's import, the framework's, the calls: what the same work costs as a
    program of its own) less its seconds reading the recorded inputs. Not its exit, which
    can take a framework a second and which a certification run does not wait for.
    `program_seconds`: the part of the floor that is neither the load nor the calls."""
    floor = replay["ended_at"] - started_at - replay["inputs_seconds"]
    return {**replay, "floor": floor,
            "program_seconds": floor - replay["load_seconds"] - replay["calls_seconds"]}


class Targets:
    def __init__(self, args):
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="attention-targets-"))
        # compiled modules cached in a folder of the run's own (as tox.ini does), so that
        # every run after the first imports what a user's installed package imports
        self.env = dict(os.environ, PYTHONPYCACHEPREFIX=str(self.tmp / "pycache"),
                        TF_CPP_MIN_LOG_LEVEL="2")
        for key, value in COMMON_ENV.items():           # tox.ini's, for every environment
            self.env.setdefault(key, value)
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)
        self.env.pop("JAX_COMPILATION_CACHE_DIR", None)     # a floor is measured cold
        self.env["ATTENTION_CONFORMANCE_CACHE"] = str(self.tmp / "spec-cache")
        self.spec = Path(args.spec).resolve()

    def close(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def conformance(self, backend, extra=(), env=None, cases=None, pytest=PYTEST):
        cases = cases or self.spec / "cases"
        env = dict(env or self.env, ATTENTION_CONFORMANCE_SPEC=str(Path(cases).parent))
        for key, value in BACKEND_ENV.get(backend, {}).items():
            env.setdefault(key, value)
        wall, cpu, rc, out = run([*pytest, str(cases), "--backend", backend, "-q", *extra],
                                 env=env)
        counts = parse_summary(out or "")
        if rc == 5 and "-k" in extra:        # a selection of nothing, asked for
            return {"wall": wall, "cpu": cpu, "items": 0, "counts": counts or {}}
        if rc not in (0, 1) or counts is None:
            raise RuntimeError(f"{backend}: the conformance run failed (rc {rc}):\n{tail(out)}")
        return {"wall": wall, "cpu": cpu, "items": items_of(counts), "counts": counts}

    def bare(self, n):
        folder = self.tmp / f"bare-{n}"
        folder.mkdir(exist_ok=True)
        (folder / "test_bare.py").write_text(BARE_TEST.format(n=n))
        wall, cpu, rc, out = run([*PYTEST, "-q", "-p", "no:attention_conformance",
                                  "--rootdir", str(folder), str(folder / "test_bare.py")],
                                 env=self.env, cwd=folder)
        assert rc == 0 and items_of(parse_summary(out)) == n, tail(out)
        return {"wall": wall, "cpu": cpu}

    # -- 1. beside it: where a warm matrix's CPU goes --------------------------------
    def env_cpu(self):
        """Each tox environment alone, one after another: wall and busy CPU seconds."""
        import importlib.util

        if importlib.util.find_spec("tox") is None:
            raise RuntimeError(f"env_cpu: tox is not installed for {sys.executable}")
        rows = []
        for env in tox_envs():
            log(f"env_cpu: tox -e {env}")
            before = busy_seconds()
            wall, _, rc, out = run([sys.executable, "-m", "tox", "-e", env], timeout=1800)
            after = busy_seconds()
            if rc is None:
                raise RuntimeError(f"env_cpu: tox -e {env} timed out:\n{tail(out)}")
            setup = tox_env_lines(out or "").get(env, {}).get("setup")
            rows.append({"env": env, "wall": wall, "rc": rc, "setup": setup,
                         "cpu": None if before is None or after is None else after - before})
        return env_cpu_figures(rows)

    # -- 2. the suite's own tests ---------------------------------------------------
    def suite(self):
        log("suite: pytest tests -n 2")
        wall, cpu, rc, out = run([*PYTEST[:-2], "tests", "-q", "-n", "2"], env=self.env,
                                 timeout=1800)
        return {"wall": wall, "cpu": cpu, "rc": rc, "counts": parse_summary(out or ""),
                "target": TARGETS["suite"], "meets": rc == 0 and wall <= TARGETS["suite"]}

    # -- 3. runner overhead ---------------------------------------------------------
    def overhead(self):
        figures = {"isolated": [], "in_process": [], "bare": [], "machinery": [], "items": None}
        self.conformance("numpy")                    # warms the spec cache
        for i in range(self.args.repeat):
            log(f"overhead: repeat {i + 1}/{self.args.repeat}")
            iso = self.conformance("numpy")
            inproc = self.conformance("numpy", extra=["--in-process"])
            figures["items"] = iso["items"]
            figures["isolated"].append(iso["wall"])
            figures["in_process"].append(inproc["wall"])
            figures["bare"].append(self.bare(iso["items"])["wall"])
            figures["machinery"].append(self.conformance("numpy", pytest=NULL_CASES)["wall"])
        iso, inproc, bare, machinery = (median(figures[k]) for k in
                                        ("isolated", "in_process", "bare", "machinery"))
        # the floor of a serial run: the runner's machinery with cases that do nothing
        # (pytest, the plugin, the spec, the report) plus the work inside the cases
        # in-process (the backend's arithmetic, rounding inputs, the golden comparison,
        # the properties' calls): the report's per-test seconds
        reports = self.tmp / "overhead-report"
        self.conformance("numpy", extra=["--in-process", "--report", str(reports)])
        from bench import case_seconds, read_report

        in_cases = case_seconds(read_report(reports, "numpy")) or 0.0
        figures.update(in_case_seconds=in_cases, machinery_ratio=machinery / bare,
                       floor_ratio=(machinery + in_cases) / bare)
        figures.update(ratio=iso / bare, in_process_ratio=inproc / bare,
                       target=TARGETS["overhead"], meets=iso / bare <= TARGETS["overhead"])
        return figures

    # -- 4. each framework against its own floor ------------------------------------
    def floor(self, backend):
        import importlib.util

        module = {"onnxruntime": "onnxruntime"}.get(backend, backend)
        if importlib.util.find_spec(module) is None:
            return {"skipped": f"{module} is not installed"}
        cases = self.spec_of(self.args.floor_topics) if self.args.floor_topics else None
        # the recorded run first: it imports every module the run imports (torch imports
        # torch._dynamo and sympy at the first bottom-right causal call, seconds to compile
        # into a fresh bytecode cache), so that the runs measured after it, and the
        # replays, import what a user's installed package imports (nothing of the
        # framework's own work is warmed by it: the JAX cache is off)
        log(f"floor {backend}: the recorded run")
        record = self.tmp / f"record-{backend}"
        env = dict(self.env, BENCH_RECORD_BACKEND=backend, BENCH_RECORD_DIR=str(record))
        recorded = self.conformance(f"{HERE / 'recording.py'}:Recording", env=env, cases=cases)
        from recording import suite_compiles

        compiles = suite_compiles(record)
        log(f"floor {backend}: the certification run")
        # medians of --repeat (a run of seconds varies by +-20 % from one to the next)
        runs = [self.conformance(backend, cases=cases)]
        repeat = 1 if runs[0]["wall"] > LONG_RUN else self.args.repeat
        runs += [self.conformance(backend, cases=cases) for _ in range(repeat - 1)]
        suite = {"wall": median(r["wall"] for r in runs), "items": runs[0]["items"],
                 "walls": [r["wall"] for r in runs]}
        log(f"floor {backend}: replaying {backend} outside the suite")
        replay_env = dict(self.env)
        for key, value in BACKEND_ENV.get(backend, {}).items():   # tox's settings, as in the run
            replay_env.setdefault(key, value)
        replays = []
        for _ in range(repeat):
            started_at = time.time()
            _, _, rc, out = run([sys.executable, str(HERE / "recording.py"), "replay",
                                 backend, str(record)], env=replay_env)
            if rc != 0:
                raise RuntimeError(f"{backend}: the replay failed:\n{tail(out)}")
            replays.append(replay_figures(started_at, json.loads(out.strip().splitlines()[-1])))
        replays.sort(key=lambda r: r["floor"])
        replay = replays[len(replays) // 2]                 # the median replay
        floor = replay["floor"]
        # pytest alone on as many items: a run cannot cost less than floor + that
        pytest_alone = median(self.bare(suite["items"])["wall"] for _ in range(repeat))
        # no backend's process can start before pytest knows the options
        self.options_known(cases)                   # its module compiled, as the others'
        options_known = median(self.options_known(cases) for _ in range(repeat))
        # the runner's machinery with this backend: pytest, the plugin, the spec, the
        # backend's process (the framework's import) and the report, but cases that do nothing
        machinery = median(self.conformance(backend, cases=cases, pytest=NULL_CASES)["wall"]
                           for _ in range(repeat))
        # the suite's own work on these tests (inputs, checks, properties, pytest), with a
        # backend whose calls cost next to nothing: NumPy's run of the same folder
        suite_on_numpy = median(self.conformance("numpy", cases=cases)["wall"]
                                for _ in range(repeat))
        figures = {"suite_wall": suite["wall"], "suite_walls": suite["walls"],
                   "floors": [r["floor"] for r in replays],
                   "items": suite["items"], "bare": pytest_alone, "machinery": machinery,
                   "ratio_with_pytest": suite["wall"] / (floor + pytest_alone),
                   "options_known": options_known,
                   "ratio_with_options": suite["wall"] / (floor + options_known),
                   "numpy_run": suite_on_numpy,
                   "ratio_with_numpy_run": suite["wall"] / (floor + suite_on_numpy),
                   "recorded_items": recorded["items"], "replay": replay, "floor": floor,
                   "ratio": suite["wall"] / floor, "target": TARGETS["floor"],
                   "topics": self.args.floor_topics or "all",
                   "meets": suite["wall"] / floor <= TARGETS["floor"],
                   # any pytest run pays pytest's own per-item cost on top of the work
                   "at_floor": suite["wall"] / (floor + pytest_alone) <= TARGETS["floor"]}
        if backend == "jax":
            figures["suite_programs"] = compiles["programs"]
            figures["suite_compile_seconds"] = compiles["seconds"]
        shutil.rmtree(record, ignore_errors=True)
        return figures

    def options_known(self, cases=None) -> float:
        """Seconds from pytest's start to the moment a plugin knows the run's options
        (benchmarks/options_known.py), with the same flags and the same case folder."""
        env = dict(self.env, PYTHONPATH=os.pathsep.join(
            filter(None, [str(HERE), self.env.get("PYTHONPATH")])))
        started_at = time.time()
        _, _, rc, out = run([*PYTEST, "-p", "options_known", "-p", "no:attention_conformance",
                             str(cases or self.spec / "cases"), "-q"], env=env)
        known = [line for line in (out or "").splitlines() if line.startswith(OPTIONS_KNOWN)]
        if rc != 0 or not known:
            raise RuntimeError(f"options_known: no time printed (rc {rc}):\n{tail(out)}")
        return float(known[-1][len(OPTIONS_KNOWN):]) - started_at

    def spec_of(self, topics) -> Path:
        """A copy of the spec folder with only the case files of topics; its cases dir."""
        dest = self.tmp / ("spec-" + "-".join(topics))
        if not dest.exists():
            shutil.copytree(self.spec, dest, ignore=shutil.ignore_patterns("__pycache__"))
            for path in (dest / "cases").glob("*.yaml"):
                if path.stem not in topics:
                    path.unlink()
        return dest / "cases"

    # -- 5. growth: the cost of each case family ------------------------------------
    def growth(self):
        rows = []
        cases_dir = self.spec / "cases"
        for backend in self.args.growth_backends:
            repeat = GROWTH_BACKENDS.get(backend) or self.args.repeat
            for topic in self.args.growth_topics:
                if (cases_dir / f"{topic}.yaml").exists():
                    rows.append(self.topic_cost(backend, topic, repeat))
                    log(f"growth {backend} {topic}: {rows[-1]['per_case_ms']:.1f} ms a case")
        return rows

    def topic_cost(self, backend, topic, repeat) -> dict:
        cases = self.spec_of([topic])
        nothing = ["-k", "no-such-case-anywhere"]
        self.conformance(backend, cases=cases, extra=nothing)
        base = median(self.conformance(backend, cases=cases, extra=nothing)["wall"]
                      for _ in range(repeat))
        runs = [self.conformance(backend, cases=cases) for _ in range(repeat)]
        wall = median(r["wall"] for r in runs)
        n_cases, items = self.count_cases(cases), runs[0]["items"]
        return {"backend": backend, "topic": topic, "cases": n_cases, "items": items,
                "wall": wall, "base": base, "per_case_ms": 1000 * (wall - base) / max(n_cases, 1),
                "per_item_ms": 1000 * (wall - base) / max(items, 1)}

    def count_cases(self, cases) -> int:
        code = ("import sys; from attention_conformance.specs.loader import load_spec; "
                "from attention_conformance.model.case import in_profile; "
                "print(sum(in_profile(c, 'quick') for c in load_spec(sys.argv[1]).cases))")
        _, _, rc, out = run([sys.executable, "-c", code, str(Path(cases).parent)], env=self.env)
        return int(out.strip().splitlines()[-1]) if rc == 0 else 0


# --------------------------------------------------------------------------- tox logs

def tox_cpu(path: Path) -> float | None:
    """CPU seconds of the whole `tox -p` run, as .ci/run writes them: the machine's busy
    seconds over the run (`machine busy 1400.2 s`, from /proc/stat: every process, the
    backend processes nobody waited for included) where it has them, else bash's `time`
    (`tox cpu: real 545.10 user 901.20 sys 80.30`: the processes tox waited for)."""
    import re

    text = path.read_text(errors="replace") if path and path.exists() else ""
    busy = re.search(r"machine busy ([\d.]+)", text)
    if busy:
        return float(busy[1])
    m = re.search(r"user ([\d.]+) sys ([\d.]+)", text)
    return float(m[1]) + float(m[2]) if m else None


def tox_stolen(path: Path) -> float | None:
    """CPU seconds the hypervisor stole over the `tox -p` run (`machine stolen 61.0 s`,
    which .ci/run writes from /proc/stat's steal column), or None."""
    import re

    text = path.read_text(errors="replace") if path and path.exists() else ""
    m = re.search(r"machine stolen ([\d.]+)", text)
    return float(m[1]) if m else None


def tox_env_lines(text: str) -> dict:
    """Each environment's line of tox's output: status, seconds and setup seconds (tox 4
    prints `  numpy: OK (28.30=setup[10.20]+cmd[18.10] seconds)`)."""
    import re

    envs = {}
    for m in re.finditer(r"^\s*([\w.-]+): (OK|FAIL|SKIP)[^(\n]*\(([\d.]+)"
                         r"(?:=setup\[([\d.]+)\])?", text, re.MULTILINE):
        envs[m[1]] = {"status": m[2], "seconds": float(m[3]),
                      "setup": float(m[4]) if m[4] else None}
    return envs


def env_cpu_figures(rows: list, cores: int | None = None) -> dict:
    """The environments' CPU summed: on this many cores, the least wall of any schedule."""
    cores = cores or os.cpu_count() or 1
    known = [r["cpu"] for r in rows if r["cpu"] is not None]
    cpu = sum(known) if len(known) == len(rows) and rows else None
    return {"envs": rows, "cores": cores, "cpu_seconds": cpu,
            "wall_seconds": sum(r["wall"] for r in rows),
            "cpu_floor": cpu / cores if cpu is not None else None, "bound": TARGETS["tox_warm"]}


def tox_figures(path: Path, kind: str, time_path: Path | None = None) -> dict:
    """Seconds of a `tox -p` run from its output: the total, and each environment's
    total with its setup (creating the env, installing) apart from its commands."""
    import re

    text = path.read_text(errors="replace")
    envs = tox_env_lines(text)
    total = re.findall(r"(congratulations :\)|evaluation failed :\() \(([\d.]+) seconds\)", text)
    seconds = float(total[-1][1]) if total else None
    ok = bool(total) and total[-1][0].startswith("congratulations")
    target = TARGETS[f"tox_{kind}"]
    setup = sum(e["setup"] or 0.0 for e in envs.values())
    busy = sum(e["seconds"] for e in envs.values())
    cores = os.cpu_count() or 1
    # no schedule of these environments on this many cores ends sooner (each env runs
    # on one core at a time, xdist envs aside): the floor the parallel run can reach
    floor = max([busy / cores] + [e["seconds"] for e in envs.values()]) if envs else None
    cpu = tox_cpu(time_path)
    cpu_floor = cpu / cores if cpu else None
    return {"wall": seconds, "ok": ok, "envs": envs, "target": target, "kind": kind,
            "setup_seconds": setup, "env_seconds": busy, "cores": cores,
            "schedule_floor": floor, "cpu_seconds": cpu, "stolen_seconds": tox_stolen(time_path),
            # the work itself: however scheduled, this many cores need cpu / cores
            "cpu_floor": cpu_floor,
            "meets": bool(ok and seconds is not None and seconds <= target),
            # every core busy nearly all along: only less work can end it sooner
            "at_floor": bool(ok and seconds and cpu_floor
                             and seconds <= TOX_BUSY_SLACK * cpu_floor)}


# --------------------------------------------------------------------------- rendering

def floor_key(backend: str, topics) -> str:
    """The figure of a floor measured on some topics (--floor-topics), or on the whole
    spec: each kept, neither overwriting the other."""
    return f"floor_{backend}" if topics else f"floor_{backend}_all"


def verdict(figure: dict | None) -> str:
    """meets; at its floor (misses the bound, but within it of the floor a run cannot go
    below, which is measured beside it); misses; not measured."""
    if not figure:
        return "not measured"
    if figure.get("meets"):
        return "meets"
    return "at its floor" if figure.get("at_floor") else "misses"


def summary_line(figures: dict) -> str:
    parts = []
    fresh = (("tox_fresh", "tox -p fresh clone (JAX cache kept)", "{wall:.0f} s"),) \
        if "tox_fresh" in figures else ()
    for key, label, fmt in (("tox_cold", "tox -p cold", "{wall:.0f} s"), *fresh,
                            ("tox_warm", "tox -p warm", "{wall:.0f} s"),
                            ("suite", "suite", "{wall:.0f} s"),
                            ("overhead", "NumPy overhead", "x{ratio:.2f}")):
        f = figures.get(key)
        text = fmt.format(**f["value"]) if f and f["value"].get("wall", 1) is not None else "-"
        parts.append(f"{label} {text} {verdict(f and f['value'])}")
        if key == "suite" and "suite_in_matrix" in figures:
            parts[-1] += f" ({figures['suite_in_matrix']['value']['wall']:.0f} s in tox -p)"
    for backend in FLOOR_BACKENDS:
        f = figures.get(f"floor_{backend}")
        if f and "ratio" in f["value"]:
            parts.append(f"{backend} floor x{f['value']['ratio']:.2f} {verdict(f['value'])}")
        else:
            parts.append(f"{backend} floor - not measured")
    for backend in FLOOR_BACKENDS:                  # the whole spec, where measured
        f = figures.get(floor_key(backend, None))
        if f and "ratio" in f["value"]:
            parts.append(f"{backend} floor (whole spec) x{f['value']['ratio']:.2f} "
                         f"{verdict(f['value'])}")
    judged = [f for k, f in figures.items() if k not in UNJUDGED]
    met = sum(1 for f in judged if f["value"].get("meets"))
    floored = sum(1 for f in judged if verdict(f["value"]) == "at its floor")
    also = f", {floored} more at their floor" if floored else ""
    return f"speed targets: {met} of {len(judged)} measured meet{also}: " + "; ".join(parts)


def _machinery(v) -> str:
    if "machinery_ratio" not in v:              # figures from before it was measured
        return "not measured"
    return f"x{v['machinery_ratio']:.2f} ({median(v['machinery']):.1f} s)"


def render(figures: dict) -> str:
    def head(key):
        f = figures.get(key)
        if not f:
            return "not measured yet"
        stolen = (f"; {f['stolen']:g} CPU s stolen by the hypervisor while measured"
                  if f.get("stolen") is not None else "")
        if f.get("load") is None:                  # a recorded run: when it ended
            return f"run ended {f['when']}{stolen}"
        return f"measured {f['when']}, load average {f['load']}{stolen}"

    out = ["# Speed targets (issue 16)", "",
           ("Written by `python benchmarks/targets.py` (see docs/benchmarks.md, \"The speed "
            "targets, in one command\"); each figure keeps the date and load average it was "
            "measured at, and the CPU seconds the hypervisor stole from this virtual machine "
            "meanwhile (/proc/stat). Figures taken on a loaded or a stolen-from machine "
            "overstate every wall time: rerun on a quiet one."), "",
           "| target | figure | bound | verdict | measured |", "|---|---|---|---|---|"]

    def row(key, label, figure, bound):
        f = figures.get(key)
        out.append(f"| {label} | {figure(f['value']) if f else '–'} | {bound} | "
                   f"{verdict(f and f['value'])} | {head(key)} |")

    def tox(v):
        if v.get("wall") is None:
            return "no total in the log"
        cpu = (f"; {v['cpu_seconds']:.0f} CPU s, so on {v['cores']} cores no schedule ends "
               f"before {v['cpu_floor']:.0f} s: cores busy "
               f"{100 * v['cpu_floor'] / v['wall']:.0f} % of the run") if v.get("cpu_seconds") else \
            f"; on {v['cores']} cores no schedule ends before {v['schedule_floor']:.0f} s"
        if v.get("stolen_seconds") is not None:
            cpu += f"; {v['stolen_seconds']:.0f} CPU s stolen by the hypervisor"
        return (f"{v['wall']:.0f} s ({len(v['envs'])} envs: {v['env_seconds']:.0f} s in all, "
                f"setup {v['setup_seconds']:.0f} s of it{cpu})")

    row("tox_cold", "1. full `tox -p`, cold", tox, "≤ 600 s")
    if "tox_fresh" in figures:
        row("tox_fresh", "1. full `tox -p`, fresh clone with JAX's cache kept (not cold)", tox,
            "≤ 600 s")
    row("tox_warm", "1. full `tox -p`, warm", tox, "≤ 180 s")
    in_matrix = figures.get("suite_in_matrix")
    row("suite", "2. `pytest tests -n 2` (tox -e suite)",
        lambda v: f"{v['wall']:.0f} s wall" + (f", {v['cpu']:.0f} CPU s" if v.get("cpu") else
                                                f" ({v.get('source', '')})")
        + (f"; {in_matrix['value']['wall']:.0f} s as the suite env of the last `tox -p`, "
           "sharing the cores with the other environments" if in_matrix else ""), "≤ 180 s")
    row("overhead", "3. NumPy runner overhead, isolated, warm",
        lambda v: (f"x{v['ratio']:.2f} ({median(v['isolated']):.1f} s / bare "
                   f"{median(v['bare']):.1f} s, {v['items']} items); in-process "
                   f"x{v['in_process_ratio']:.2f}; cases that do nothing "
                   f"{_machinery(v)}; floor x{v['floor_ratio']:.2f} (that + "
                   f"{v['in_case_seconds']:.1f} s inside the cases, in-process)"), "≤ x1.5")
    floor_rows = [(f"floor_{b}", f"4. {b} against its floor") for b in FLOOR_BACKENDS]
    floor_rows += [(floor_key(b, None), f"4. {b} against its floor, whole spec")
                   for b in FLOOR_BACKENDS if floor_key(b, None) in figures]
    for key, label in floor_rows:
        row(key, label,
            lambda v: (f"x{v['ratio']:.2f} (run {v['suite_wall']:.2f} s / floor "
                       f"{v['floor']:.2f} s: "
                       + (f"the program's start {v['replay']['program_seconds']:.2f} s"
                          " + " if "program_seconds" in v["replay"] else "")
                       + f"load {v['replay']['load_seconds']:.2f} s + "
                       f"{v['replay']['calls']} calls {v['replay']['calls_seconds']:.2f} s; "
                       f"topics: {v['topics'] if isinstance(v['topics'], str) else ', '.join(v['topics'])})"
                       + (f"; pytest alone on {v['items']} items {v['bare']:.2f} s: run / (floor + "
                          f"that) x{v['ratio_with_pytest']:.2f}" if "bare" in v else "")
                       + (f"; pytest's start until a plugin knows the options (no backend's "
                          f"process starts before) {v['options_known']:.2f} s: run / (floor + "
                          f"that) x{v['ratio_with_options']:.2f}" if "options_known" in v else "")
                       + (f"; NumPy's run of the same tests (the suite's own work) "
                          f"{v['numpy_run']:.2f} s: run / (floor + that) "
                          f"x{v['ratio_with_numpy_run']:.2f}" if "numpy_run" in v else "")
                       + (f"; the same run with cases that do nothing {v['machinery']:.2f} s"
                          if "machinery" in v else "")
                       + (f"; programs compiled: run {v['suite_programs']} "
                          f"({v['suite_compile_seconds']:.1f} s), floor {v['replay']['programs']} "
                          f"({v['replay']['compile_seconds']:.1f} s)" if "suite_programs" in v else ""))
            if "ratio" in v else v.get("skipped", "–"), "≤ x1.2")
    out += render_env_cpu(figures.get("env_cpu"))
    out += ["", "## 5. Growth: the cost of each case family (isolated)", ""]
    growth = figures.get("growth")
    if growth and growth["value"]:
        stolen = f", {growth['stolen']:g} CPU s stolen" if growth.get("stolen") is not None else ""
        out += [(f"Measured {growth['when']}, load average {growth['load']}{stolen}. Cost = the "
                 "topic's run minus a run of the same folder that selects nothing (start-up, "
                 "backend load, spec load)."), "",
                "| backend | topic | quick cases | items | run s | selects-nothing s | ms a case "
                "| ms an item |", "|---|---|---:|---:|---:|---:|---:|---:|"]
        for r in growth["value"]:
            out.append(f"| {r.get('backend', 'numpy')} | {r['topic']} | {r['cases']} | "
                       f"{r['items']} | {r['wall']:.2f} | {r['base']:.2f} | "
                       f"{r['per_case_ms']:.1f} | {r['per_item_ms']:.2f} |")
    else:
        out.append("not measured yet")
    notes = figures.get("notes", {}).get("value", {}).get("text") if figures.get("notes") else None
    if notes:
        out += ["", "## Notes", "", notes]
    out += ["", "Summary line (what CI logs):", "", "```", summary_line(figures), "```", ""]
    return "\n".join(out)


def render_env_cpu(figure: dict | None) -> list:
    """The section on where a warm matrix's CPU goes (each environment alone)."""
    if not figure or not figure["value"].get("envs"):
        return []
    v = figure["value"]
    stolen = f", {figure['stolen']:g} CPU s stolen" if figure.get("stolen") is not None else ""
    out = ["", "## 1. Beside it: where a warm matrix's CPU goes (each environment alone)", "",
           (f"Measured {figure['when']}, load average {figure['load']}{stolen}: `tox -e ENV` "
            "for each environment of tox.ini, one after another, warm; CPU = the machine's "
            "busy seconds over it (every process: tox, pytest, the backend's)."), "",
           "| environment | status | wall s | setup s | CPU s | share of the CPU |",
           "|---|---|---:|---:|---:|---:|"]
    total = v["cpu_seconds"]
    for r in v["envs"]:
        cpu = "–" if r["cpu"] is None else f"{r['cpu']:.1f}"
        share = f"{100 * r['cpu'] / total:.0f} %" if total and r["cpu"] is not None else "–"
        setup = "–" if r.get("setup") is None else f"{r['setup']:.1f}"
        status = "OK" if r["rc"] == 0 else f"rc {r['rc']}"
        out.append(f"| {r['env']} | {status} | {r['wall']:.1f} | {setup} | {cpu} | {share} |")
    if total is not None:
        out += ["", (f"In all {total:.0f} CPU s ({v['wall_seconds']:.0f} s of wall one after "
                     f"another): on {v['cores']} cores no schedule of this work ends before "
                     f"{v['cpu_floor']:.0f} s (the warm bound: {v['bound']:.0f} s).")]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="suite,overhead,floor,growth",
                   help="comma-separated: suite, overhead, floor, growth, env_cpu")
    p.add_argument("--floor-backends", default=",".join(FLOOR_BACKENDS))
    p.add_argument("--floor-topics", default=None,
                   help="comma-separated topics for the floor runs (default: the whole spec)")
    p.add_argument("--growth-topics", default=",".join(GROWTH_TOPICS))
    p.add_argument("--growth-backends", default=",".join(GROWTH_BACKENDS))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--spec", default=str(ROOT / "spec"))
    p.add_argument("--tox-log", type=Path, help="the output of a `tox -p` run to read")
    p.add_argument("--tox-time", type=Path,
                   help="bash's `time` of that run (.ci/run writes reports/tox.time): CPU seconds")
    p.add_argument("--tox-kind", choices=("cold", "fresh", "warm"), default="warm")
    p.add_argument("--summary", action="store_true",
                   help="print the summary line of the last figures and exit (CI)")
    p.add_argument("--figures", type=Path, default=FIGURES)
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    args.floor_topics = args.floor_topics.split(",") if args.floor_topics else None
    args.growth_topics = [t for t in args.growth_topics.split(",") if t]
    args.growth_backends = [b for b in args.growth_backends.split(",") if b]
    figures = json.loads(args.figures.read_text()) if args.figures.exists() else {}

    def keep(key, value, when=None):
        figures[key] = {"value": value, "when": when or now(), "load": load()}

    def measure(key, compute):
        """keep() what compute() measures, with the CPU stolen while it ran."""
        before = stolen_seconds()
        keep(key, compute())
        after = stolen_seconds()
        if before is not None and after is not None:
            figures[key]["stolen"] = round(after - before, 1)

    if args.tox_log:
        tox = tox_figures(args.tox_log, args.tox_kind, args.tox_time)
        ended = run_ended(args.tox_log)
        keep(f"tox_{args.tox_kind}", tox, ended)
        figures[f"tox_{args.tox_kind}"]["load"] = None      # now's is not the run's
        suite = tox["envs"].get("suite")
        if suite and suite["status"] == "OK":     # beside the others: not the target's figure
            keep("suite_in_matrix", {"wall": suite["seconds"], "source": "tox -p (suite env)"},
                 ended)
            figures["suite_in_matrix"]["load"] = None
    if args.summary:
        print(summary_line(figures))
        return 0
    targets = Targets(args)
    only = set(args.only.split(",")) if args.only else set()
    try:
        if "suite" in only:
            measure("suite", targets.suite)
        if "overhead" in only:
            measure("overhead", targets.overhead)
        if "floor" in only:
            for backend in args.floor_backends.split(","):
                try:
                    measure(floor_key(backend, args.floor_topics),
                            lambda: targets.floor(backend))
                except RuntimeError as exc:
                    log(str(exc))
        if "growth" in only:
            measure("growth", targets.growth)
        if "env_cpu" in only:
            measure("env_cpu", targets.env_cpu)
    finally:
        targets.close()
        args.figures.write_text(json.dumps(figures, indent=1) + "\n")
        args.output.write_text(render(figures), encoding="utf-8")
    print(render(figures))
    print(summary_line(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
