"""Measuring: one way to time a command, one median, the checkout a run imports, and the
machine a figure was taken on. Standard library only: plugin_tax.py runs it with the
Python of an installed wheel, where this repository is not importable.
"""

from __future__ import annotations

import ctypes
import io
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tarfile
import time
import tomllib
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: the hypothesis plugin imports all of hypothesis when a session ends: seconds that are
#: neither pytest's nor the suite's, kept out of both sides of every comparison
PYTEST = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest"]
#: tox.ini's settings for every environment, applied unless the caller's environment sets them
TOX_ENV = {"OPENBLAS_NUM_THREADS": "1"}
#: and for the torch environments
TORCH_ENV = {"OMP_NUM_THREADS": "1"}
VERSIONS = ("numpy", "pytest", "torch", "jax", "tensorflow-cpu", "onnxruntime")
BARE_TEST = '''\
import pytest


@pytest.mark.parametrize("i", range({n}))
def test_x(i):
    assert i >= 0
'''


def median(values):
    """The median of the values that are not None; None where there is none."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


@dataclass
class Run:
    wall: float
    cpu: float | None          # the command's and every process it started, however ended
    rc: int | None             # None: timed out
    output: str


def timed(argv, *, env=None, cwd=None, timeout=3600) -> Run:
    """Run a command to its end, its stdout and stderr together, and time it: the wall
    until it returns, the CPU seconds of it and of every process it left running."""
    def children_cpu():
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    _become_subreaper()
    cpu, start, before = children_cpu(), time.perf_counter(), _children()
    try:
        done = subprocess.run(argv, env=env, cwd=cwd, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        return Run(time.perf_counter() - start, None, None, str(exc.stdout or ""))
    wall = time.perf_counter() - start
    _reap_orphans(before)
    return Run(wall, children_cpu() - cpu, done.returncode, done.stdout)


def _become_subreaper() -> None:
    """Processes a run leaves to end after it (a judge, a backend's process) are re-parented
    to this one, not to init, so their CPU seconds are counted once reaped (Linux only)."""
    try:
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)          # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _children() -> set[int]:
    """This process's children now, from /proc (empty where there is none)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == os.getpid():
            found.add(int(stat.parent.name))
    return found


def _reap_orphans(before: set[int], limit: float = 30.0) -> None:
    """Wait (at most `limit` seconds) for the children a run left behind, not the ones this
    process had before it, so that their CPU seconds are added."""
    end = time.monotonic() + limit
    while (orphans := _children() - before) and time.monotonic() < end:
        for pid in orphans:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        time.sleep(0.01)


SUMMARY_WORD = re.compile(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?|deselected)\b")
ITEM_WORDS = ("passed", "failed", "skipped", "xfailed", "xpassed", "errors")


def pytest_counts(output: str) -> dict | None:
    """The counts of pytest's closing line ('3 passed, 1 xfailed in 2.0s'), or None."""
    for line in reversed(output.splitlines()):
        if " in " in line and SUMMARY_WORD.search(line):
            counts = {}
            for number, word in SUMMARY_WORD.findall(line):
                word = "errors" if word == "error" else word
                counts[word] = counts.get(word, 0) + int(number)
            return counts
    return None


def items_of(counts: dict | None) -> int:
    return sum(counts.get(word, 0) for word in ITEM_WORDS) if counts else 0


def tail(text: str, lines: int = 15) -> str:
    return "\n".join((text or "").rstrip().splitlines()[-lines:])


class Tree:
    """A checkout whose code every run imports, whatever is installed: a folder, or a
    commit of this repository extracted (git archive) into scratch. Each tree has its
    own spec cache and compiled-module cache, warmed by its first run."""

    def __init__(self, where: str, scratch: Path):
        scratch.mkdir(parents=True, exist_ok=True)
        self.label = where
        if Path(where).is_dir():
            self.root = Path(where).resolve()
            self.commit = commit_of(self.root)
        else:
            self.commit = git("rev-parse", "--short", f"{where}^{{commit}}")
            self.root = extract(where, scratch / "tree")
        self.scratch, self.spec = scratch, self.root / "spec"
        path = [str(import_root(self.root, scratch / "import")), os.environ.get("PYTHONPATH")]
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, path)),
                        PYTHONPYCACHEPREFIX=str(scratch / "pycache"),
                        ATTENTION_CONFORMANCE_CACHE=str(scratch / "spec-cache"),
                        ATTENTION_CONFORMANCE_SPEC=str(self.spec),
                        TF_CPP_MIN_LOG_LEVEL="2")
        for key, value in TOX_ENV.items():
            self.env.setdefault(key, value)
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)
        self.env.pop("JAX_COMPILATION_CACHE_DIR", None)      # JAX compiles, as on a new machine

    def on_spec(self, commit: str) -> None:
        """Certify the spec folder of this commit, not the tree's own: two trees on one
        spec compare the code alone."""
        self.spec = extract(commit, self.scratch / "spec-of", "spec") / "spec"
        self.env["ATTENTION_CONFORMANCE_SPEC"] = str(self.spec)

    def env_for(self, backend: str) -> dict:
        """The tree's environment with tox.ini's settings for this backend."""
        env = dict(self.env)
        for key, value in (TORCH_ENV if backend.startswith("torch") else {}).items():
            env.setdefault(key, value)
        return env

    def certify(self, backend: str, *extra, cases: Path | None = None, env=None) -> Run:
        """One quick run of the tree's spec (or of `cases`); a run that breaks raises."""
        env = dict(env or self.env_for(backend))
        if cases:
            env["ATTENTION_CONFORMANCE_SPEC"] = str(Path(cases).parent)
        run = timed([sys.executable, *PYTEST, str(cases or self.spec / "cases"),
                     "--backend", backend, *extra], env=env, cwd=self.root)
        if run.rc not in (0, 1) or pytest_counts(run.output) is None:
            raise RuntimeError(f"{backend} on {self.label}: the run broke (rc {run.rc}):\n"
                               f"{tail(run.output)}")
        return run

    def bare(self, n: int) -> Run:
        """pytest alone on n no-op tests, the same flags, the plugin off."""
        folder = self.scratch / f"bare-{n}"
        folder.mkdir(exist_ok=True)
        (folder / "test_bare.py").write_text(BARE_TEST.format(n=n))
        run = timed([sys.executable, *PYTEST, "-p", "no:attention_conformance", "--rootdir",
                     str(folder), "test_bare.py"], env=self.env, cwd=folder)
        if run.rc != 0 or items_of(pytest_counts(run.output)) != n:
            raise RuntimeError(f"the bare pytest run of {n} items broke:\n{tail(run.output)}")
        return run


def git(*args, cwd=ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          check=True).stdout.strip()


def commit_of(root: Path) -> str:
    """The commit checked out in root, '+changes' where a tracked file differs from it
    (but the results and the page that shows them); 'unknown' outside git."""
    try:
        commit = git("rev-parse", "--short", "HEAD", cwd=root)
        changed = git("status", "--porcelain", "-uno", "--", ".", ":!benchmarks/results",
                      ":!docs/benchmarks.md", cwd=root)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+changes" if changed else "")


def extract(commit: str, dest: Path, *paths: str) -> Path:
    archive = subprocess.run(["git", "archive", commit, *paths], cwd=ROOT, capture_output=True,
                             check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def import_root(tree: Path, dest: Path) -> Path:
    """A folder for PYTHONPATH in which `attention_conformance` is tree's own code:
    pyproject.toml maps the package and its sub-packages onto the tree's folders."""
    config = tomllib.loads((tree / "pyproject.toml").read_text())
    mapping = config["tool"]["setuptools"]["package-dir"]
    for package, folder in sorted(mapping.items(), key=lambda item: item[0].count(".")):
        target = dest.joinpath(*package.split("."))
        if "." in package:
            target.symlink_to(tree / folder)
            continue
        target.mkdir(parents=True)
        for entry in (tree / folder).iterdir():
            if entry.name != "__pycache__":
                (target / entry.name).symlink_to(entry)
    return dest


def cpu_model() -> str:
    try:
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
    except OSError:
        found = None
    return found[1].strip() if found else platform.processor() or "unknown"


def machine() -> dict:
    """What a figure was measured on, and how busy the machine was then."""
    versions = {}
    for name in VERSIONS:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            pass
    return {"cores": len(os.sched_getaffinity(0)), "cpu": cpu_model(),
            "python": platform.python_version(), "versions": versions,
            "load_average": [round(x, 2) for x in os.getloadavg()]}
