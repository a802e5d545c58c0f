"""benchmarks/: what the benchmark commands read (pytest's and tox's closing lines), how
they pair two trees, the trees' own imports, the floor's record and replay, and the
results files, each its JSON rendered. No test here times anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench  # noqa: E402
import measure  # noqa: E402
import render  # noqa: E402
from recording import floor_of  # noqa: E402

sys.path.remove(str(ROOT / "benchmarks"))

TOX = """\
numpy: commands[0]> pytest spec/cases -q --backend numpy
  numpy: OK (28.30=setup[10.20]+cmd[18.10] seconds)
  jax: OK (193.12=setup[40.00]+cmd[153.12] seconds)
  suite: OK (164.00=setup[20.00]+cmd[144.00] seconds)
  report: FAIL code 1 (3.00=setup[1.00]+cmd[2.00] seconds)
  evaluation failed :( (523.45 seconds)
"""
TOX_OK = TOX.replace("report: FAIL code 1", "report: OK").replace("evaluation failed :(",
                                                                "congratulations :)")
MACHINE = {"cores": 2, "cpu": "AMD EPYC", "python": "3.11.7", "versions": {"numpy": "2.4.6"},
           "load_average": [1.0, 1.5, 2.0]}


def record(kind, figures, **more):
    return {"kind": kind, "date": "2026-12-06T05:00:00+00:00", "commit": "abc1234",
            "machine": MACHINE, "command": f"python benchmarks/bench.py {kind}",
            "figures": figures, **more}


def test_pytests_closing_line_gives_the_counts_and_the_items():
    output = "....\n3 passed, 1 failed, 2 xfailed, 1 error, 4 deselected in 2.01s\n"
    counts = measure.pytest_counts(output)
    assert counts == {"passed": 3, "failed": 1, "xfailed": 2, "errors": 1, "deselected": 4}
    assert measure.items_of(counts) == 7                  # deselected items did not run
    assert measure.pytest_counts("Traceback (most recent call last):\n") is None


def test_one_median_of_what_was_measured():
    assert measure.median([3.0, 1.0, 2.0]) == 2.0
    assert measure.median([4.0, 1.0, None, 2.0, 3.0]) == 2.5
    assert measure.median([None]) is None


def test_a_tox_log_gives_the_total_and_each_environment():
    found = bench.matrix(TOX, "", "cold")
    assert found["wall"] == 523.45 and not found["ok"] and found["tox_kind"] == "cold"
    assert found["envs"]["jax"] == {"status": "OK", "seconds": 193.12, "setup": 40.0}
    assert found["envs"]["report"]["status"] == "FAIL"
    assert found["cpu_seconds"] is None and found["stolen_seconds"] is None
    line = render.matrix_line(found)
    assert line == "tox -p (cold): 523 s, failed: report; longest: jax 193 s, suite 164 s", line


def test_the_cpu_of_a_tox_run_is_the_machines_busy_seconds_where_ci_read_them():
    bash = "tox cpu: real 545.10 user 901.20 sys 80.30\n"
    assert bench.tox_time(bash)["cpu_seconds"] == pytest.approx(981.5)
    both = bash + "machine busy 1400.5 s\nmachine stolen 61.0 s\n"
    assert bench.tox_time(both) == {"cpu_seconds": 1400.5, "stolen_seconds": 61.0}
    found = bench.matrix(TOX_OK, both, "warm")
    assert found["ok"]
    assert "all 4 environments OK; 1400 CPU s, so on" in render.matrix_line(found)
    assert "| jax | OK | 193.1 | 40.0 |" in render.page(record("matrix-warm", found))


def test_ci_prints_the_matrix_line_from_the_log_of_its_own_run(tmp_path):
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 benchmarks/bench.py matrix --tox-log reports/tox.log --tox-time " \
        "reports/tox.time" in ci
    (tmp_path / "tox.log").write_text(TOX)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench.py"), "matrix",
                           "--tox-log", str(tmp_path / "tox.log"), "--tox-time",
                           str(tmp_path / "missing.time"), "--kind", "fresh"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "tox -p (fresh): 523 s, failed: report; longest: jax " \
        "193 s, suite 164 s"


def test_a_saved_matrix_is_dated_when_its_run_ended(tmp_path, monkeypatch):
    """--save keeps the log's last write as the date, and no load average (the machine's
    now is not the run's)."""
    results, docs = tmp_path / "results", tmp_path / "benchmarks.md"
    docs.write_text(f"intro\n{render.TABLE_START}\nold\n{render.TABLE_END}\nrest\n")
    monkeypatch.setattr(render, "RESULTS", results)
    monkeypatch.setattr(render, "DOCS", docs)
    log = tmp_path / "tox.log"
    log.write_text(TOX_OK)
    os.utime(log, (1_700_000_000, 1_700_000_000))
    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks" / "bench.py")])
    assert bench.main(["matrix", "--tox-log", str(log), "--kind", "warm", "--save"]) == 0
    saved = json.loads((results / "matrix-warm.json").read_text())
    assert saved["date"] == "2023-11-14T22:13:20+00:00"
    assert saved["machine"]["load_average"] is None and saved["machine"]["cores"] >= 1
    assert saved["command"].startswith("python benchmarks/bench.py")
    assert (results / "matrix-warm.md").read_text() == render.page(saved)
    assert "load average not recorded" in render.page(saved)
    page = docs.read_text()
    assert page.startswith("intro\n") and page.endswith("\nrest\n") and "old" not in page
    assert "(../benchmarks/results/matrix-warm.md) | tox -p (warm): 523 s" in page


def test_paired_runs_alternate_their_order():
    order = [name for name, _ in bench.alternating({"base": 1, "head": 2}, 4)]
    assert order == ["base", "head", "head", "base", "base", "head", "head", "base"]


class FakeTree:
    def __init__(self, label, wall):
        self.label, self.commit, self.wall, self.runs = label, label[:7], wall, 0
        self.spec = None

    def on_spec(self, commit):
        self.spec = commit

    def certify(self, backend):
        self.runs += 1
        return measure.Run(self.wall, self.wall / 2, 0, "3 passed, 1 xfailed in 1.00s\n")


def test_paired_gives_each_trees_walls_cpu_and_the_ratio():
    base, head = FakeTree("main", 2.0), FakeTree(".", 2.1)
    figures = bench.paired(base, head, ["numpy", "torch"], 3)
    assert base.runs == head.runs == 2 * (1 + 3)          # one warm-up run each, not counted
    assert figures["backends"]["numpy"] == {"base": [2.0] * 3, "head": [2.1] * 3,
                                            "cpu": {"base": [1.0] * 3, "head": [1.05] * 3},
                                            "items": [4, 4]}
    assert figures["base"] == {"label": "main", "commit": "main"} and figures["repeat"] == 3
    line = render.headline(record("paired", figures))
    assert line == ("numpy x1.050 (2.00 → 2.10 s, CPU x1.050); torch x1.050 (2.00 → 2.10 s, "
                    "CPU x1.050) (head / base)"), line


def test_paired_runs_both_trees_on_the_spec_it_is_given(tmp_path):
    base, head = FakeTree("0faf4ed", 2.0), FakeTree(".", 2.1)
    figures = bench.paired(base, head, ["numpy"], 1, spec="0faf4ed")
    assert base.spec == head.spec == figures["spec"] == "0faf4ed"
    assert "both on the spec of 0faf4ed" in render.paired_body(figures)[0]
    tree = measure.Tree("HEAD", tmp_path)
    tree.on_spec("HEAD")
    assert tree.spec != tree.root / "spec" and (tree.spec / "cases").is_dir()
    assert tree.env["ATTENTION_CONFORMANCE_SPEC"] == str(tree.spec)


def test_a_runs_cpu_counts_the_processes_it_leaves_to_end_after_it():
    """A judge or a backend process ends after pytest: its CPU seconds are the run's."""
    busy = "import time; end = time.process_time() + 0.5\nwhile time.process_time() < end: pass"
    starts = (f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {busy!r}], "
              "start_new_session=True)")
    run = measure.timed([sys.executable, "-c", starts])
    assert run.rc == 0 and run.cpu >= 0.5, run


def test_a_tree_imports_its_own_code_wherever_the_package_is_installed(tmp_path):
    """A commit, extracted, and run with nothing installed for it: the package, its
    backends and its spec are the tree's, as pyproject.toml maps them."""
    tree = measure.Tree("HEAD", tmp_path)
    assert (tree.root / "spec" / "cases").is_dir() and len(tree.commit) >= 7
    code = ("import attention_conformance as a, attention_conformance.backends.numpy as b;"
            "from attention_conformance.model.folder import packaged_spec_dir as s;"
            "from pathlib import Path; print(*(Path(p).resolve() for p in "
            "(a.__file__, b.__file__, s())))")
    done = subprocess.run([sys.executable, "-c", code], env=tree.env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=True)
    package, backend, spec = map(Path, done.stdout.split())
    assert package == tree.root / "conformance" / "__init__.py"
    assert backend == tree.root / "backends" / "numpy.py"
    assert spec == tree.root / "spec"
    assert tree.env["ATTENTION_CONFORMANCE_SPEC"] == str(tree.root / "spec")


def test_the_benchmark_applies_the_settings_tox_ini_gives_its_environments():
    """A run measured outside tox is the run tox makes."""
    ini = (ROOT / "tox.ini").read_text()
    for key, value in {**measure.TOX_ENV, **measure.TORCH_ENV}.items():
        assert f"{key} = {{env:{key}:{value}}}" in ini, key


def test_a_recorded_run_replays_every_call(tmp_path):
    record_dir = tmp_path / "record"
    env = dict(os.environ, BENCH_RECORD_BACKEND="numpy", BENCH_RECORD_DIR=str(record_dir))
    env.pop("PYTEST_XDIST_WORKER", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(ROOT / "spec" / "cases"), "-q", "-p",
         "no:cacheprovider", "--backend", f"{ROOT / 'benchmarks' / 'recording.py'}:Recording",
         "-k", "wo-shi-xiao-gou", "--dtype", "float32"], capture_output=True, text=True,
        timeout=300, env=env, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "backend 'numpy'" in done.stdout        # it declares what it wraps
    recorded = (record_dir / "calls.jsonl").read_text().splitlines()
    assert recorded and {json.loads(r)["op"] for r in recorded} >= {"sdpa"}
    started = time.time()
    replay = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "recording.py"), "replay",
                             "numpy", str(record_dir)], capture_output=True, text=True,
                            timeout=120, check=False)
    assert replay.returncode == 0, replay.stderr
    figures = json.loads(replay.stdout.strip().splitlines()[-1])
    assert figures["calls"] == len(recorded) and figures["raised"] == 0
    assert started < figures["ended_at"] < time.time()


def test_the_floor_is_the_replaying_program_less_its_reading_of_the_inputs():
    replay = {"calls": 3, "inputs_seconds": 0.25, "load_seconds": 0.7, "calls_seconds": 0.05,
              "ended_at": 101.2}
    assert floor_of(100.0, replay) == pytest.approx(0.95)
    figures = {"topics": "all", "backends": {"torch": {
        "items": 3540, "runs": [4.0, 4.4, 4.2], "floors": [2.0, 2.1, 2.2], "replay": replay}}}
    row = next(line for line in render.page(record("floors", figures)).splitlines()
               if line.startswith("| torch"))
    assert row == "| torch | 3540 | 4.20 | 4.00–4.40 | 2.10 | 0.70 | 3 | 0.05 | 2.10 | x2.00 |"


def test_the_overhead_is_the_isolated_run_over_pytest_alone():
    figures = {"backend": "numpy", "items": 3540, "isolated": [1.9, 2.1, 2.0],
               "in_process": [2.4, 2.6, 2.5], "bare": [1.6, 1.5, 1.7]}
    page = render.page(record("overhead", figures))
    assert "**NumPy quick run (3540 items) 2.00 s, pytest alone on as many no-op items " \
        "1.60 s: x1.25**" in page
    assert "| in-process (`--in-process`) | 2.50 | 2.40–2.60 | x1.56 |" in page
    assert "```bash\npython benchmarks/bench.py overhead\n```" in page
    assert "on 2 cores (AMD EPYC), load average 1.0, 1.5, 2.0" in page


def test_each_checked_in_results_page_is_its_json_rendered():
    """No figure was edited by hand, and each says when, where and how it was measured."""
    jsons = sorted(render.RESULTS.glob("*.json"))
    assert {p.stem for p in jsons} == {p.stem for p in render.RESULTS.glob("*.md")}
    assert jsons
    for path in jsons:
        found = json.loads(path.read_text())
        assert found["kind"] == path.stem and found["date"] and found["commit"]
        assert found["machine"]["cores"] and found["machine"]["cpu"]
        assert found["command"].startswith("python benchmarks/bench.py " + path.stem.split("-")[0])
        assert path.with_suffix(".md").read_text(encoding="utf-8") == render.page(found)


def test_the_figures_on_the_docs_page_are_the_results_files():
    page = render.DOCS.read_text(encoding="utf-8")
    assert render.figures_table(render.records()) in page


def test_the_scale_page_gives_the_wall_the_cpu_the_memory_and_the_goldens_share():
    tests = {"scale/a[float32]": {"status": "pass", "seconds": 30.0, "why": ""},
             "scale/b[float16]": {"status": "unsupported", "seconds": 0.1,
                                  "why": "unsupported by size: case b needs 64 GB"}}
    run = {"wall": 600.0, "cpu": 400.0, "peak_memory_gb": 3.2, "rc": 0,
           "load_average": [1.0, 1.0, 1.0], "tests": tests, "tail": ""}
    reference = {"seconds": 60.0, "share": 0.1, "cpu_seconds": 40.0, "cpu_share": 0.1,
                 "exact_gflops": 4.0, "plain_gflops": 2.0, "long_profile_gflops": 5.0,
                 "long_profile_gflops_wall": 2.0, "matmul_gflops": [10.0, 12.0],
                 "matmul_gflops_wall": [4.0, 5.0], "threads": 2,
                 "tests": {"scale/a[float32]": {"seconds": 9.0, "cpu_seconds": 6.0}}}
    page = render.page(record("scale", {"reference_backend": "numpy", "backends": {"numpy": run},
                                        "reference": reference}))
    assert ("**numpy --profile scale: 600 s wall, 400 CPU s, peak 3.2 GB (1 pass, 1 "
            "unsupported); golden 10% of its CPU seconds; float64 reference 5.0 GFLOP per CPU "
            "second on the long cases, float64 matmul 12.0 (x2.4)**") in page
    assert "| `scale/a[float32]` | pass | 30.0 | 6.0 |  |" in page
    assert "| `scale/b[float16]` | unsupported | 0.1 | – | unsupported by size: case b" in page


def test_the_scale_benchmark_sums_the_memory_and_reads_the_cpu_of_a_whole_process_tree():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import scale
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    child = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(60_000_000); "
                              "b[::4096] = b'x' * len(b[::4096]); "
                              "t = time.process_time() + 0.3\nwhile time.process_time() < t: "
                              "pass\ntime.sleep(5)"])
    try:
        time.sleep(1.5)
        while scale.tree_usage(child.pid)[1].get(child.pid, 0) < 0.3 and child.poll() is None:
            time.sleep(0.2)         # a loaded machine: the child's 0.3 CPU s take longer
        assert scale.tree_rss(os.getpid()) > scale.tree_rss(child.pid) > 60_000_000
        assert scale.tree_usage(os.getpid())[1][child.pid] >= 0.3
    finally:
        child.kill()
        child.wait()
