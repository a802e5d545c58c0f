#!/usr/bin/env python3
"""What the conformance suite itself costs, per backend (see docs/benchmarks.md).

    python benchmarks/bench.py [--backends numpy,torch,jax,tensorflow] [--repeat 3]

Every measurement runs in a fresh subprocess and is repeated ``--repeat`` times;
the tables give medians (with the min-max range where it matters). For each backend:

- framework import: ``import torch`` alone in a fresh interpreter;
- backend load: ``load_backend(NAME)`` after the runner's own imports (what a run
  pays for the backend on top of the runner: framework, adapter, construction);
- conformance run: ``python -m pytest SPEC/cases --backend NAME -q -p no:cacheprovider
  --report DIR``, wall clock, items counted from pytest's summary line; the report's
  per-test ``seconds`` give the time spent inside the cases;
- collect-only: the same with ``--collect-only`` (startup, imports, spec, collection);
- bare pytest: a generated file with the same number of trivial parametrised tests,
  same flags, the conformance plugin disabled: pytest's own cost for that many items;
- xdist: the conformance run with ``-n WORKERS``; the per-test statuses of its report
  must equal the serial run's.

Then (once): the float64 reference's sdpa and sdpa_vjp at growing lengths (wall time
and peak RSS over the interpreter's baseline, each in its own subprocess), and the
NumPy run on the quick spec replicated x1, x2, x4 (cost against the number of cases).

Results are printed as Markdown and written to benchmarks/results-costs.md (and the raw
figures to benchmarks/results-costs.json; benchmarks/results.md holds the speed targets,
written by benchmarks/targets.py). Nothing here is a test: timings are only
meaningful on a quiet machine; the load average before and after is recorded.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ("numpy", "torch", "jax", "tensorflow")
#: backend name -> the module whose import is the "framework import"
FRAMEWORK = {"numpy": "numpy", "torch": "torch", "jax": "jax", "tensorflow": "tensorflow"}
#: settings of tox.ini, applied unless the caller's environment sets them: its
#: [testenv]'s, for every run, and each backend's own
COMMON_ENV = {"OPENBLAS_NUM_THREADS": "1"}
BACKEND_ENV = {"torch": {"OMP_NUM_THREADS": "1"}}
#: distributions whose versions describe the machine's software
DISTRIBUTIONS = ("numpy", "ml_dtypes", "PyYAML", "jsonschema", "pytest", "pytest-xdist",
                 "hypothesis", "torch", "jax", "jaxlib", "tensorflow", "tensorflow-cpu",
                 "keras")
#: extra pytest arguments for every run (conformance and bare alike). The hypothesis
#: plugin (installed with the `test` extra, absent from the tox certification envs)
#: imports all of hypothesis in its terminal-summary hook: seconds per run that are
#: neither pytest's nor the runner's, so they are left out of both sides by default.
DEFAULT_PYTEST_ARGS = "-p no:hypothesispytest"
SUMMARY_WORD = re.compile(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?|deselected"
                          r"|warnings?|rerun)\b")
ITEM_WORDS = ("passed", "failed", "skipped", "xfailed", "xpassed", "errors")
TARGET_RATIO = 2.0          # conformance / bare pytest, NumPy backend
TARGET_PER_ITEM = 3.0       # JAX and TensorFlow per-item time / NumPy's

BARE_TEST = '''\
import pytest


@pytest.mark.parametrize("i", range({n}))
def test_x(i):
    assert i >= 0
'''

IMPORT_CODE = ("import time; t = time.perf_counter(); import {module}; "
               "print(time.perf_counter() - t)")

LOAD_CODE = """\
import time
import attention_conformance.plugin  # the runner's own imports, paid by every run
from attention_conformance.backend.resolve import load_backend
t = time.perf_counter()
load_backend({name!r})
print(time.perf_counter() - t)
"""

MEMORY_CODE = """\
import contextlib, json, resource, sys, time
import numpy as np
from attention_conformance.golden import reference


def rss_mb():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return peak_mb()


def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


length, width, op, causal, mode = sys.argv[1:6]
length, width = int(length), int(width)
causal = None if causal == "none" else causal
baseline = max(rss_mb(), 0.0)
rng = np.random.RandomState(0)
q, k, v = (rng.standard_normal((length, width)) for _ in range(3))
d_out = rng.standard_normal((length, width)) if op == "sdpa_vjp" else None
inputs = peak_mb()
rounding = reference.rounded_to(mode) if mode != "float64" else contextlib.nullcontext()
start = time.perf_counter()
with rounding:
    if op == "sdpa":
        out = (reference.sdpa(q, k, v, causal=causal),)
    else:
        out = reference.sdpa_vjp(q, k, v, d_out, causal=causal)
seconds = time.perf_counter() - start
finite = all(bool(np.all(np.isfinite(o))) for o in out)
print(json.dumps({"baseline_mb": baseline, "inputs_peak_mb": inputs, "peak_mb": peak_mb(),
                  "seconds": seconds, "finite": finite,
                  "block": getattr(reference, "BLOCK", None)}))
"""


# --------------------------------------------------------------------------- helpers

def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def spread(values):
    values = [v for v in values if v is not None]
    return (min(values), max(values)) if values else (None, None)


def fmt(value, digits=2, unit=""):
    if value is None:
        return "–"
    if isinstance(value, float) and value != value:
        return "–"
    return f"{value:.{digits}f}{unit}"


def fmt_range(values, digits=2):
    low, high = spread(values)
    if low is None:
        return "–"
    med = median(values)
    if len(values) == 1 or high - low < 10 ** -digits:
        return fmt(med, digits)
    return f"{fmt(med, digits)} ({fmt(low, digits)}–{fmt(high, digits)})"


def log(message):
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Runner:
    """Runs subprocesses with one environment and a time limit."""

    def __init__(self, spec_dir: Path, timeout: float):
        self.timeout = timeout
        self.env = dict(os.environ)
        self.env["ATTENTION_CONFORMANCE_SPEC"] = str(spec_dir)
        self.env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        for key, value in COMMON_ENV.items():
            self.env.setdefault(key, value)
        path = self.env.get("PYTHONPATH")
        self.env["PYTHONPATH"] = str(ROOT) + (os.pathsep + path if path else "")
        self.cache_root = Path(tempfile.mkdtemp(prefix="attention-bench-cache-"))
        self.env["ATTENTION_CONFORMANCE_CACHE"] = str(self.cache_root / "warm")

    def run(self, args, *, cwd=ROOT, env=None, merge=True):
        """(wall seconds, return code, stdout [+ stderr]); rc None on timeout.

        The CPU seconds (user + system) of the child and every descendant it waited
        for (xdist workers included) are left in ``self.cpu``."""
        before = _children_cpu()
        start = time.perf_counter()
        self.cpu = None
        try:
            proc = subprocess.run(args, cwd=cwd, env=env or self.env, text=True,
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                                  timeout=self.timeout)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) \
                else (exc.stdout or "")
            return time.perf_counter() - start, None, out + "\n[timed out]"
        wall = time.perf_counter() - start
        self.cpu = _children_cpu() - before
        return wall, proc.returncode, proc.stdout

    def seconds_printed(self, code):
        """Run python -c code; the float on the last line of its stdout, or None."""
        _, rc, out = self.run([sys.executable, "-c", code], merge=False)
        lines = [l for l in (out or "").strip().splitlines() if l.strip()]
        if rc != 0 or not lines:
            return None
        try:
            return float(lines[-1])
        except ValueError:
            return None


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def parse_summary(output: str) -> dict | None:
    """Counts of pytest's final summary line ('3 passed, 1 failed in 2.0s'), or None."""
    for line in reversed(output.splitlines()):
        if " in " in line and SUMMARY_WORD.search(line):
            counts = {}
            for number, word in SUMMARY_WORD.findall(line):
                word = {"error": "errors", "warning": "warnings"}.get(word, word)
                counts[word] = counts.get(word, 0) + int(number)
            return counts
        if line.strip().startswith("no tests ran"):
            return {}
    return None


def items_of(counts: dict | None) -> int:
    return sum(counts.get(w, 0) for w in ITEM_WORDS) if counts else 0


def read_report(directory: Path, backend: str) -> dict | None:
    """The plugin's JSON report in directory (BACKEND.json, or the only JSON there)."""
    candidates = sorted(directory.glob("*.json"))
    exact = [p for p in candidates if p.stem == backend]
    for path in exact or candidates:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("results"), list):
            return data
    return None


def statuses(report: dict | None) -> dict:
    if not report:
        return {}
    return {r["id"]: r["status"] for r in report["results"] if "id" in r and "status" in r}


def case_seconds(report: dict | None) -> float | None:
    if not report:
        return None
    values = [r.get("seconds") for r in report["results"]]
    values = [v for v in values if isinstance(v, (int, float))]
    return sum(values) if values else None


def tail(text: str, lines: int = 15) -> str:
    return "\n".join((text or "").rstrip().splitlines()[-lines:])


# --------------------------------------------------------------------------- machine

def machine() -> dict:
    info = {"nproc": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(terse=True), "machine": platform.machine()}
    try:
        info["nproc"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info.setdefault("cpu", platform.processor() or "unknown")
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_gib"] = round(int(line.split()[1]) / 1024 ** 2, 1)
    except OSError:
        pass
    from importlib.metadata import PackageNotFoundError, version
    versions = {}
    for dist in DISTRIBUTIONS:
        try:
            versions[dist] = version(dist)
        except PackageNotFoundError:
            pass
    info["versions"] = versions
    try:
        import yaml
        info["libyaml"] = bool(getattr(yaml, "__with_libyaml__", False))
    except ImportError:
        info["libyaml"] = None
    info["PYTHONDONTWRITEBYTECODE"] = os.environ.get("PYTHONDONTWRITEBYTECODE", "")
    return info


def load_average():
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except OSError:
        return None


# --------------------------------------------------------------------------- runs

class Bench:
    def __init__(self, args):
        self.args = args
        self.spec_dir = Path(args.spec).resolve()
        self.tmp = Path(tempfile.mkdtemp(prefix="attention-bench-"))
        if args.topics:
            self.spec_dir = self.copy_spec(self.tmp / "spec-topics", args.topics)
        self.cases_dir = self.spec_dir / "cases"
        self.runner = Runner(self.spec_dir, args.timeout)
        self.extra = shlex.split(args.pytest_args or "")
        self.results = {"backends": {}, "memory": [], "growth": [], "long": {}}

    def close(self):
        shutil.rmtree(self.tmp, ignore_errors=True)
        shutil.rmtree(self.runner.cache_root, ignore_errors=True)

    # -- one conformance run ------------------------------------------------------
    def conformance(self, name, *, cases_dir=None, extra=(), profile=None, label="run",
                    cold=False):
        """One run; `cold`: with an empty spec cache (as on a fresh machine)."""
        report_dir = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=self.tmp))
        args = [sys.executable, "-m", "pytest", str(cases_dir or self.cases_dir),
                "--backend", name, "-q", "-p", "no:cacheprovider",
                "--profile", profile or self.args.profile,
                "--report", str(report_dir), *self.extra, *extra]
        env = dict(self.runner.env)
        for key, value in BACKEND_ENV.get(name, {}).items():
            env.setdefault(key, value)
        if cases_dir is not None:
            env["ATTENTION_CONFORMANCE_SPEC"] = str(Path(cases_dir).parent)
        if cold:
            env["ATTENTION_CONFORMANCE_CACHE"] = tempfile.mkdtemp(dir=self.runner.cache_root)
        for attempt in range(2):
            wall, rc, out = self.runner.run(args, env=env)
            if rc is None or rc >= 0:
                break
            log(f"{name}: the run was killed by signal {-rc}; running it again")
        counts = parse_summary(out)
        report = read_report(report_dir, name)
        run = {"wall": wall, "cpu": self.runner.cpu, "rc": rc, "counts": counts,
               "items": items_of(counts),
               "statuses": statuses(report), "case_seconds": case_seconds(report),
               "per_test": {r["id"]: r.get("seconds") for r in (report or {}).get("results", [])}}
        if rc not in (0, 1) or counts is None:
            run["error"] = tail(out)
        shutil.rmtree(report_dir, ignore_errors=True)
        return run

    def collect_only(self, name):
        args = [sys.executable, "-m", "pytest", str(self.cases_dir), "--backend", name,
                "-q", "-p", "no:cacheprovider", "--profile", self.args.profile,
                "--collect-only", *self.extra]
        wall, rc, out = self.runner.run(args)
        return wall if rc == 0 else None

    def bare(self, n):
        """(wall, cpu) seconds of pytest running n trivial tests, or (None, None)."""
        directory = self.tmp / f"bare-{n}"
        if not directory.exists():
            directory.mkdir()
            (directory / f"test_bare_{n}.py").write_text(BARE_TEST.format(n=n))
        args = [sys.executable, "-m", "pytest", str(directory / f"test_bare_{n}.py"), "-q",
                "-p", "no:cacheprovider", "-p", "no:attention_conformance",
                "--rootdir", str(directory), *self.extra]
        wall, rc, out = self.runner.run(args, cwd=directory)
        counts = parse_summary(out)
        if rc != 0 or items_of(counts) != n:
            log(f"bare pytest run of {n} tests went wrong (rc {rc}):\n{tail(out)}")
            return None, None
        return wall, self.runner.cpu

    # -- one backend -------------------------------------------------------------
    def backend(self, name):
        a = self.args
        r = {"framework_import": [], "backend_load": [], "collect": [], "serial": [],
             "bare": [], "bare_cpu": [], "xdist": [], "cold": None}
        self.results["backends"][name] = r      # partial figures survive an interruption
        module = FRAMEWORK.get(name)
        if module and importlib.util.find_spec(module) is None:
            log(f"{name}: {module} is not installed; skipped")
            return {"skipped": f"{module} not installed"}
        log(f"{name}: first run, empty spec cache")
        first = self.conformance(name, label=f"{name}-cold", cold=True)
        r["cold"] = first["wall"] if "error" not in first else None
        for i in range(a.repeat):
            log(f"{name}: repeat {i + 1}/{a.repeat}")
            if module:
                r["framework_import"].append(
                    self.runner.seconds_printed(IMPORT_CODE.format(module=module)))
            r["backend_load"].append(self.runner.seconds_printed(LOAD_CODE.format(name=name)))
            run = self.conformance(name, label=f"{name}-serial")
            if "error" in run:
                log(f"{name}: the conformance run failed (rc {run['rc']}):\n{run['error']}")
                r["serial"].append(run)
                r["failed"] = run["error"]
                return r
            r["serial"].append(run)
            if not run["items"]:
                log(f"{name}: the run selected no test items; nothing more to time")
                r["failed"] = "no test items"
                return r
            if a.collect:
                r["collect"].append(self.collect_only(name))
            wall, cpu = self.bare(run["items"])
            r["bare"].append(wall)
            r["bare_cpu"].append(cpu)
            if a.workers:
                r["xdist"].append(self.conformance(name, extra=["-n", str(a.workers)],
                                                   label=f"{name}-xdist"))
        return r

    # -- isolation and the plugin's tax on other projects ------------------------
    def isolation(self, name):
        """The backend in its own process against --in-process, on the same spec."""
        figures = {"isolated": [], "in_process": []}
        for i in range(self.args.repeat):
            log(f"{name}: isolation {i + 1}/{self.args.repeat}")
            for key, extra in (("isolated", ()), ("in_process", ("--in-process",))):
                run = self.conformance(name, extra=extra, label=f"{name}-{key}")
                figures[key].append(run["wall"] if "error" not in run else None)
        iso, inproc = median(figures["isolated"]), median(figures["in_process"])
        figures["ratio"] = iso / inproc if iso and inproc else None
        self.results["isolation"] = {name: figures}
        return figures

    def plugin_tax(self):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from plugin_tax import plugin_tax

        log("plugin tax on an unrelated one-test project")
        self.results["plugin_tax"] = plugin_tax(runs=max(7, 3 * self.args.repeat))
        return self.results["plugin_tax"]

    # -- reference memory --------------------------------------------------------
    def memory(self):
        a = self.args
        causals = {"both": ("none", "top_left"), "none": ("none",),
                   "top_left": ("top_left",)}[a.causal]
        for length in a.lengths:
            for op in a.memory_ops:
                for causal in causals:
                    for mode in a.memory_modes:
                        runs = []
                        for _ in range(a.memory_repeat):
                            log(f"reference {op} L={length} causal={causal} {mode}")
                            _, rc, out = self.runner.run(
                                [sys.executable, "-c", MEMORY_CODE, str(length),
                                 str(a.head_dim), op, causal, mode], merge=False)
                            try:
                                runs.append(json.loads(out.strip().splitlines()[-1]))
                            except (ValueError, IndexError):
                                log(f"reference run failed (rc {rc}): {tail(out, 5)}")
                        if runs:
                            self.results["memory"].append({
                                "length": length, "op": op, "causal": causal, "mode": mode,
                                "seconds": [x["seconds"] for x in runs],
                                "extra_mb": [x["peak_mb"] - x["baseline_mb"] for x in runs],
                                "baseline_mb": median([x["baseline_mb"] for x in runs]),
                                "finite": all(x["finite"] for x in runs),
                                "block": runs[0].get("block")})

    # -- growth with the number of cases -----------------------------------------
    def copy_spec(self, dest: Path, topics=None) -> Path:
        """A copy of the spec folder keeping only the case files of `topics` (all if None)."""
        shutil.copytree(self.spec_dir, dest, ignore=shutil.ignore_patterns("__pycache__"))
        if topics:
            missing = [t for t in topics if not (dest / "cases" / f"{t}.yaml").exists()]
            if missing:
                raise SystemExit(f"bench: no case file for topic(s) {', '.join(missing)} in "
                                 f"{self.spec_dir / 'cases'}")
            for path in (dest / "cases").glob("*.yaml"):
                if path.stem not in topics:
                    path.unlink()
        return dest

    def replicated_spec(self, factor) -> Path | None:
        """A copy of the spec (growth topics only) whose quick cases appear `factor`
        times, renamed, with golden data regenerated for the copies."""
        import yaml

        dest = self.tmp / f"spec-x{factor}"
        if dest.exists():
            return dest / "cases"
        self.copy_spec(dest, self.args.growth_topics)
        for path in sorted((dest / "cases").glob("*.yaml")):
            document = yaml.safe_load(path.read_text(encoding="utf-8"))
            quick = [c for c in document.get("cases", []) if c.get("profile", "quick") == "quick"]
            for copy in range(2, factor + 1):
                if not quick:
                    continue
                clone = dict(document, topic=f"{document['topic']}_x{copy}",
                             cases=[dict(c, id=f"{c['id']}-x{copy}") for c in quick])
                target = dest / "cases" / f"{path.stem}_x{copy}.yaml"
                target.write_text(yaml.safe_dump(clone, sort_keys=False, allow_unicode=True,
                                                 width=100), encoding="utf-8")
        if factor > 1:
            env = dict(self.runner.env, ATTENTION_CONFORMANCE_SPEC=str(dest))
            _, rc, out = self.runner.run([sys.executable, "-m", "attention_conformance", "golden",
                                          "regenerate"], env=env)
            if rc != 0:
                log(f"golden regenerate for the x{factor} spec failed (rc {rc}):\n{tail(out)}")
                return None
        return dest / "cases"

    def growth(self):
        a = self.args
        name = a.growth_backend
        for factor in a.growth_factors:
            log(f"growth: spec x{factor} on {name}")
            cases = self.replicated_spec(factor)
            if cases is None:
                continue
            walls, bares, cpus, bare_cpus, items = [], [], [], [], None
            for _ in range(a.repeat):
                run = self.conformance(name, cases_dir=cases, label=f"growth-x{factor}")
                if "error" in run:
                    log(f"growth run failed:\n{run['error']}")
                    break
                items = run["items"]
                walls.append(run["wall"])
                cpus.append(run["cpu"])
                wall, cpu = self.bare(items)
                bares.append(wall)
                bare_cpus.append(cpu)
            if walls:
                self.results["growth"].append({"factor": factor, "items": items,
                                               "conformance": walls, "bare": bares,
                                               "conformance_cpu": cpus, "bare_cpu": bare_cpus})

    # -- the long profile -----------------------------------------------------------
    def long_profile(self, name):
        log(f"{name}: long profile")
        run = self.conformance(name, profile="long", label=f"{name}-long")
        self.results["long"][name] = run


# --------------------------------------------------------------------------- report

def summarise_backend(r: dict) -> dict:
    serial = [x for x in r.get("serial", []) if "error" not in x]
    if not serial:
        return {}
    walls = [x["wall"] for x in serial]
    items = serial[0]["items"]
    load = median(r["backend_load"])
    wall = median(walls)
    bare = median(r["bare"])
    in_case = median([x["case_seconds"] / x["items"] for x in serial
                      if x["case_seconds"] is not None and x["items"]])
    s = {"items": items, "wall": wall, "walls": walls, "bare": bare, "bares": r["bare"],
         "framework_import": median(r["framework_import"]),
         "framework_imports": r["framework_import"],
         "backend_load": load, "backend_loads": r["backend_load"],
         "collect": median(r["collect"]), "in_case_per_item": in_case,
         "cold": r.get("cold"),
         "counts": serial[0]["counts"]}
    cpu, bare_cpu = median([x["cpu"] for x in serial]), median(r.get("bare_cpu", []))
    s["cpu"], s["bare_cpu"] = cpu, bare_cpu
    s["ratio_cpu"] = cpu / bare_cpu if cpu and bare_cpu else None
    s["items_per_s"] = items / wall if wall else None
    s["ratio"] = wall / bare if wall and bare else None
    s["ratio_net"] = (wall - load) / bare if wall and bare and load is not None else None
    s["net_per_item"] = (wall - load) / items if items and load is not None else None
    if s["collect"] is not None and items:
        s["marginal_per_item"] = (wall - s["collect"]) / items
    # determinism: every serial run must give the same statuses as the first
    first = serial[0]["statuses"]
    s["serial_agree"] = all(x["statuses"] == first for x in serial[1:]) if first else None
    xd = [x for x in r.get("xdist", []) if "error" not in x]
    if r.get("xdist"):
        diffs = []
        for x in xd:
            other = x["statuses"]
            diffs.append(sorted(k for k in set(first) | set(other)
                                if first.get(k) != other.get(k)))
        s["xdist"] = {
            "walls": [x["wall"] for x in xd], "wall": median([x["wall"] for x in xd]),
            "cpu": median([x["cpu"] for x in xd]),
            "failed_runs": len(r["xdist"]) - len(xd),
            "identical": bool(first) and len(xd) == len(r["xdist"]) and
            all(not d for d in diffs) and all(x["items"] == items for x in xd),
            "differing": sorted({k for d in diffs for k in d}),
            "errors": [x.get("error") for x in r["xdist"] if "error" in x]}
    return s


def render(results: dict, args) -> str:
    m = results["machine"]
    out = []
    w = out.append
    w("# Benchmark results: the conformance suite's own cost")
    w("")
    w(f"Measured {results['started']} with `{results['command']}`; every figure is the median"
      f" of {args.repeat} run(s) in fresh subprocesses (min–max in brackets where shown).")
    w("")
    w("## Isolation and the plugin's tax")
    w("")
    tax = results.get("plugin_tax")
    if tax:
        w(f"- plugin tax on an unrelated one-test pytest project (with the plugin, against "
          f"`-p no:attention_conformance`, median of {tax['runs']} pairs): "
          f"{tax['tax_ms']:+.0f} ms; target <= {tax['target_ms']:.0f} ms: "
          f"{'meets' if tax['meets'] else 'misses'}")
    for name, f in (results.get("isolation") or {}).items():
        ratio = f.get("ratio")
        w(f"- {name} quick run with the backend in its own process: "
          f"{fmt(median(f['isolated']), 1)} s, in-process {fmt(median(f['in_process']), 1)} s: "
          f"x{fmt(ratio, 2)}; target <= x1.3: {'meets' if ratio and ratio <= 1.3 else 'misses'}")
    w("")
    w("## Machine")
    w("")
    w(f"- CPU: {m.get('cpu')} — {m.get('nproc')} cores usable (`nproc`); memory "
      f"{m.get('memory_gib')} GiB")
    w(f"- load average (1, 5, 15 min) before: {results.get('load_before')}, after: "
      f"{results.get('load_after')} (a busy machine inflates every wall time)")
    w(f"- Python {m.get('python')} on {m.get('platform')}; "
      + ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items()))
    w(f"- YAML C loader (libyaml): {m.get('libyaml')}; PYTHONDONTWRITEBYTECODE="
      f"{m.get('PYTHONDONTWRITEBYTECODE')!r}; extra pytest args on every run: "
      f"`{args.pytest_args or '(none)'}`")
    w(f"- spec: {results['spec']}, profile `{args.profile}`"
      + (f", topics {', '.join(args.topics)}" if args.topics else ", every case file"))
    w("")

    summaries = results["summaries"]
    ran = [b for b in args.backends if summaries.get(b)]
    w("## Framework import (fresh interpreter, on its own)")
    w("")
    for b in args.backends:
        r = results["backends"].get(b, {})
        if r.get("skipped"):
            w(f"- {b}: skipped ({r['skipped']})")
            continue
        s = summaries.get(b) or {}
        w(f"- {b}: `import {FRAMEWORK.get(b, '?')}` {fmt_range(r.get('framework_import', []))} s;"
          f" backend load over the runner's imports {fmt_range(r.get('backend_load', []))} s")
    w("")
    w("## Per backend")
    w("")
    w("| backend | items | first run s | conformance s | bare pytest s | ratio | ratio − load |"
      " CPU ratio | items/s | collect-only s | in-case ms/item | vs NumPy |"
      " (wall − load)/item ms | vs NumPy |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    base = summaries.get("numpy") or {}
    for b in ran:
        s = summaries[b]
        rel = (s["in_case_per_item"] / base["in_case_per_item"]
               if base.get("in_case_per_item") and s.get("in_case_per_item") else None)
        rel_net = (s["net_per_item"] / base["net_per_item"]
                   if base.get("net_per_item") and s.get("net_per_item") else None)
        w(f"| {b} | {s['items']} | {fmt(s.get('cold'))} | {fmt_range(s['walls'])} |"
          f" {fmt_range(s['bares'])} |"
          f" {fmt(s['ratio'])} | {fmt(s['ratio_net'])} | {fmt(s['ratio_cpu'])} |"
          f" {fmt(s['items_per_s'], 1)} |"
          f" {fmt(s['collect'])} | {fmt(ms(s['in_case_per_item']), 1)} | {fmt(rel)} |"
          f" {fmt(ms(s['net_per_item']), 1)} | {fmt(rel_net)} |")
    w("")
    w("- *first run*: the same run with an empty spec cache, as on a fresh machine (the"
      " spec is parsed, schema-validated and statically checked; later runs read the files"
      " that validated cleanly from the cache). *conformance s* and every ratio use the"
      " repeated runs, cache warm. The settings of tox.ini apply: "
      + ", ".join([f"{k}={v}" for k, v in COMMON_ENV.items()]
                  + [f"{b} {k}={v}" for b, env in BACKEND_ENV.items() for k, v in env.items()])
      + " unless set by the caller.")
    w("- *ratio* = conformance wall / bare pytest wall for the same number of items;"
      " *ratio − load* subtracts the backend load (framework import, adapter) from the"
      " conformance wall first. The target (at most "
      f"{TARGET_RATIO:g} for NumPy) is judged on *ratio − load*: the framework import is"
      " reported above on its own line and is not the runner's overhead. *CPU ratio* is"
      " the same comparison in CPU seconds (user + system, children included): less"
      " sensitive to a busy machine, but it counts BLAS threads spinning.")
    w("- *in-case ms/item*: mean time inside a case (backend call, golden comparison,"
      " properties: the plugin's per-test `seconds`); *vs NumPy* is the target ratio"
      f" (at most {TARGET_PER_ITEM:g} for JAX and TensorFlow); compiling or tracing is"
      " included. *(wall − load)/item* spreads everything else (startup, spec loading,"
      " pytest) over the items as well.")
    for b in ran:
        s = summaries[b]
        counts = ", ".join(f"{v} {k}" for k, v in (s.get("counts") or {}).items())
        w(f"- {b}: {counts}" + ("" if s.get("serial_agree") in (True, None)
                                 else " — **serial runs disagree with each other**"))
    checks = []
    if base.get("ratio_net") is not None:
        checks.append(f"NumPy ratio − load {fmt(base['ratio_net'])} "
                      f"({'meets' if base['ratio_net'] <= TARGET_RATIO else 'misses'} ≤ {TARGET_RATIO:g})")
    for b in ("jax", "tensorflow"):
        s = summaries.get(b)
        if s and base.get("in_case_per_item") and s.get("in_case_per_item"):
            rel = s["in_case_per_item"] / base["in_case_per_item"]
            checks.append(f"{b} in-case per item {fmt(rel)}x NumPy "
                          f"({'meets' if rel <= TARGET_PER_ITEM else 'misses'} ≤ {TARGET_PER_ITEM:g}x)")
    if checks:
        w("- targets: " + "; ".join(checks))
    w("")

    if args.workers:
        w(f"## pytest-xdist (`-n {args.workers}`)")
        w("")
        w("| backend | serial s | xdist s | speedup | serial CPU s | xdist CPU s |"
          " outcomes identical to serial |")
        w("|---|---:|---:|---:|---:|---:|---|")
        for b in ran:
            s = summaries[b]
            x = s.get("xdist")
            if not x:
                continue
            speed = s["wall"] / x["wall"] if x.get("wall") else None
            same = "yes" if x["identical"] else \
                f"**no**: {len(x['differing'])} ids differ" + (
                    f" (e.g. {', '.join(x['differing'][:3])})" if x["differing"] else "") + (
                    f"; {x['failed_runs']} run(s) failed" if x["failed_runs"] else "")
            w(f"| {b} | {fmt(s['wall'])} | {fmt_range(x['walls'])} | {fmt(speed)} |"
              f" {fmt(s['cpu'])} | {fmt(x['cpu'])} | {same} |")
        w("")
        w("Identical means: the same test ids with the same statuses (pass, fail, xfail,"
          " xpass, unsupported) in the plugin's JSON report, for every xdist run.")
        w("")

    if results["growth"]:
        w(f"## Cost against the number of cases ({args.growth_backend}; the quick cases of"
          f" {', '.join(args.growth_topics) or 'every topic'} replicated)")
        w("")
        w("| spec | items | conformance s | bare pytest s | ratio | conformance CPU s |"
          " bare CPU s | CPU ratio | conformance ms/item |")
        w("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        points = []
        for g in results["growth"]:
            c, bare = median(g["conformance"]), median(g["bare"])
            cc, bc = median(g.get("conformance_cpu", [])), median(g.get("bare_cpu", []))
            points.append((g["items"], c, bare))
            w(f"| x{g['factor']} | {g['items']} | {fmt_range(g['conformance'])} |"
              f" {fmt_range(g['bare'])} | {fmt(c / bare if c and bare else None)} |"
              f" {fmt(cc)} | {fmt(bc)} | {fmt(cc / bc if cc and bc else None)} |"
              f" {fmt(ms(c / g['items']) if c and g['items'] else None, 1)} |")
        w("")
        lines = []
        for what, key, unit in (("wall", "", "s"), ("CPU", "_cpu", "CPU s")):
            fit = linear_fit([(g["items"], median(g["conformance" + key]))
                              for g in results["growth"] if median(g["conformance" + key])])
            fit_bare = linear_fit([(g["items"], median(g["bare" + key]))
                                   for g in results["growth"] if median(g["bare" + key])])
            if fit:
                lines.append(f"{what}: conformance ≈ {fit[0]:.2f} {unit} + {ms(fit[1]):.2f} ms"
                             " × items" + (f"; bare pytest ≈ {fit_bare[0]:.2f} {unit} +"
                                           f" {ms(fit_bare[1]):.2f} ms × items"
                                           if fit_bare else ""))
        if lines:
            w("Least-squares lines — " + "; ".join(lines) + ". The fixed part is startup,"
              " imports, spec loading and validation; the slope is the cost of one more item.")
            w("")

    if results["memory"]:
        w("## The float64 reference at growing length (sdpa and its vjp, block by block)")
        w("")
        block = results["memory"][0].get("block")
        w(f"Lq = Lk = L, D = {args.head_dim}, inputs N(0, 1); BLOCK = {block} query rows at"
          " once. Peak = ru_maxrss minus the interpreter's RSS before the inputs were made"
          " (so it includes inputs and outputs).")
        w("")
        w("| L | op | causal | mode | seconds | peak MB over baseline | one dense L×L float64"
          " matrix MB |")
        w("|---:|---|---|---|---:|---:|---:|")
        for row in results["memory"]:
            dense = row["length"] ** 2 * 8 / 2 ** 20
            w(f"| {row['length']} | {row['op']} | {row['causal']} | {row['mode']} |"
              f" {fmt_range(row['seconds'])} | {fmt(median(row['extra_mb']), 0)} |"
              f" {dense:,.0f} |" + ("" if row["finite"] else " (non-finite output!)"))
        w("")

    if results["long"]:
        w("## The long profile")
        w("")
        for b, run in results["long"].items():
            if "error" in run:
                w(f"- {b}: failed: `{run['error'].splitlines()[-1] if run['error'] else ''}`")
                continue
            counts = ", ".join(f"{v} {k}" for k, v in (run.get("counts") or {}).items())
            w(f"- {b}: {run['items']} items in {fmt(run['wall'], 1)} s ({counts}); in-case"
              f" {fmt(run['case_seconds'], 1)} s")
        w("")
        names = list(results["long"])
        ids = sorted({i for run in results["long"].values() for i in run.get("per_test", {})})
        if ids:
            w("| test | " + " | ".join(f"{b} s" for b in names) + " |")
            w("|---|" + "---:|" * len(names))
            for i in ids:
                w(f"| {i} | " + " | ".join(
                    fmt(results['long'][b].get('per_test', {}).get(i), 2) for b in names) + " |")
            w("")
    return "\n".join(out) + "\n"


def ms(seconds):
    return None if seconds is None else seconds * 1000.0


def linear_fit(points):
    """(intercept, slope) of a least-squares line through (x, y) points, or None."""
    if len(points) < 2 or len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - slope * mx, slope


# --------------------------------------------------------------------------- main

def csv(kind):
    def parse(text):
        return [kind(x) for x in text.split(",") if x.strip()]
    return parse


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", type=csv(str), default=",".join(BACKENDS),
                   help="comma-separated backends (default: %(default)s)")
    p.add_argument("--repeat", type=int, default=3, help="runs per figure (median)")
    p.add_argument("--spec", default=os.environ.get("ATTENTION_CONFORMANCE_SPEC", ROOT / "spec"),
                   help="the spec/ folder (default: $ATTENTION_CONFORMANCE_SPEC or spec/)")
    p.add_argument("--profile", default="quick", choices=("quick", "long", "all"),
                   help="profile of the timed conformance runs (default quick)")
    p.add_argument("--workers", default="2",
                   help="pytest-xdist -n for the xdist runs ('auto', a number, 0 to skip)")
    p.add_argument("--no-collect", dest="collect", action="store_false",
                   help="skip the --collect-only runs")
    p.add_argument("--pytest-args", default=DEFAULT_PYTEST_ARGS,
                   help="extra arguments for every pytest run, conformance and bare alike"
                        " (default: %(default)r; '' for none)")
    p.add_argument("--lengths", type=csv(int), default="2048,4096,8192,16384",
                   help="sequence lengths of the reference memory runs")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--memory-ops", type=csv(str), default="sdpa,sdpa_vjp",
                   help="reference ops of the memory runs (default: %(default)s)")
    p.add_argument("--memory-modes", type=csv(str), default="float64",
                   help="float64 (the golden) and/or a dtype: the rounded 'plain same-dtype'"
                        " computation that sets tolerances (golden of long cases runs both)")
    p.add_argument("--causal", default="both", choices=("both", "none", "top_left"))
    p.add_argument("--memory-repeat", type=int, default=None,
                   help="runs per reference measurement (default: --repeat)")
    p.add_argument("--no-memory", dest="memory", action="store_false")
    p.add_argument("--topics", type=csv(str), default=None,
                   help="run only these case files (topics) in the timed runs (default all)")
    p.add_argument("--growth-factors", type=csv(int), default="1,4,16",
                   help="replicate the growth topics' quick cases this many times")
    p.add_argument("--growth-topics", type=csv(str), default=None,
                   help="case files replicated for the growth runs (default"
                        " worked_examples if present, else every file)")
    p.add_argument("--growth-backend", default="numpy")
    p.add_argument("--no-growth", dest="growth", action="store_false")
    p.add_argument("--no-xdist", dest="xdist", action="store_false")
    p.add_argument("--long", action="store_true",
                   help="also run the long profile once per backend (slow)")
    p.add_argument("--timeout", type=float, default=3600.0, help="per subprocess, seconds")
    p.add_argument("--output", default=str(ROOT / "benchmarks" / "results-costs.md"),
                   help="Markdown output ('' for stdout only); raw figures go beside it"
                        " as .json")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if not args.xdist or str(args.workers) in ("0", ""):
        args.workers = None
    if args.memory_repeat is None:
        args.memory_repeat = args.repeat
    if args.growth_topics is None:
        spec = Path(args.spec)
        args.growth_topics = ["worked_examples"] if \
            (spec / "cases" / "worked_examples.yaml").exists() else []
    unknown = [b for b in args.backends if b not in BACKENDS and ":" not in b]
    if unknown:
        log(f"not a built-in backend (running it anyway, no framework import line): {unknown}")
    bench = Bench(args)
    results = bench.results
    results["command"] = "python benchmarks/bench.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    results["started"] = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    results["machine"] = machine()
    results["spec"] = str(bench.spec_dir)
    results["load_before"] = load_average()
    if args.workers and importlib.util.find_spec("xdist") is None:
        log("pytest-xdist is not installed: the xdist runs are skipped")
        args.workers = None
    def terminate(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminate)
    try:
        bench.plugin_tax()
        if "numpy" in args.backends:
            bench.isolation("numpy")
        for name in args.backends:
            results["backends"][name] = bench.backend(name)
        if args.long:
            for name in args.backends:
                if not results["backends"].get(name, {}).get("skipped"):
                    bench.long_profile(name)
        if args.growth and args.growth_backend:
            bench.growth()
        if args.memory:
            bench.memory()
    except KeyboardInterrupt:
        log("interrupted: reporting what was measured")
    finally:
        bench.close()
    results["load_after"] = load_average()
    results["summaries"] = {b: summarise_backend(r) for b, r in results["backends"].items()
                            if not r.get("skipped")}
    text = render(results, args)
    print(text)
    if args.output:
        path = Path(args.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        raw = {k: v for k, v in results.items()}
        for r in raw["backends"].values():
            for run in r.get("serial", []) + r.get("xdist", []):
                run.pop("statuses", None)
                run.pop("per_test", None)
        path.with_suffix(".json").write_text(json.dumps(raw, indent=1, default=str) + "\n")
        log(f"wrote {path} and {path.with_suffix('.json')}")
    failed = [b for b, r in results["backends"].items() if r.get("failed")]
    xdist_bad = [b for b, s in results["summaries"].items()
                 if s.get("xdist") and not s["xdist"]["identical"]]
    if failed:
        log(f"conformance runs failed for: {', '.join(failed)}")
    if xdist_bad:
        log(f"xdist outcomes differ from serial for: {', '.join(xdist_bad)}")
    return 1 if failed or xdist_bad else 0


if __name__ == "__main__":
    sys.exit(main())
