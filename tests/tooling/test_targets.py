"""benchmarks/targets.py reads tox's output as tox prints it, and the floor's recording
replays the calls of a run (benchmarks/recording.py): the pieces CI and the benchmark use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import targets  # noqa: E402

sys.path.remove(str(ROOT / "benchmarks"))

TOX = """\
numpy: commands[0]> pytest spec/cases -q --backend numpy
  numpy: OK (28.30=setup[10.20]+cmd[18.10] seconds)
  jax: OK (193.12=setup[40.00]+cmd[153.12] seconds)
  suite: OK (164.00=setup[20.00]+cmd[144.00] seconds)
  report: FAIL code 1 (3.00=setup[1.00]+cmd[2.00] seconds)
  evaluation failed :( (523.45 seconds)
"""


def test_a_tox_log_gives_the_total_and_each_environment(tmp_path):
    (tmp_path / "tox.log").write_text(TOX)
    found = targets.tox_figures(tmp_path / "tox.log", "cold")
    assert found["wall"] == 523.45 and not found["ok"] and not found["meets"]
    assert found["envs"]["jax"] == {"status": "OK", "seconds": 193.12, "setup": 40.0}
    assert found["envs"]["report"]["status"] == "FAIL"
    assert found["setup_seconds"] == 71.2
    (tmp_path / "ok.log").write_text(TOX.replace("evaluation failed :(", "congratulations :)"))
    assert targets.tox_figures(tmp_path / "ok.log", "cold")["meets"]          # <= 600 s
    assert not targets.tox_figures(tmp_path / "ok.log", "warm")["meets"]      # > 180 s


def test_a_recorded_tox_run_is_dated_when_it_ended_not_when_recorded(tmp_path):
    """--tox-log keeps the log's last write as the figure's date, and no load average
    (the recorder's would not be the run's); the table says so."""
    log = tmp_path / "tox.log"
    log.write_text(TOX.replace("evaluation failed :(", "congratulations :)"))
    os.utime(log, (1_700_000_000, 1_700_000_000))           # 2023-11-14T22:13:20Z
    figures, results = tmp_path / "figures.json", tmp_path / "results.md"
    assert targets.main(["--tox-log", str(log), "--tox-kind", "cold", "--only", "",
                         "--figures", str(figures), "--output", str(results)]) == 0
    row = json.loads(figures.read_text())["tox_cold"]
    assert row["when"] == "2023-11-14T22:13:20+00:00" and row["load"] is None
    assert json.loads(figures.read_text())["suite_in_matrix"]["when"] == row["when"]
    assert "run ended 2023-11-14T22:13:20+00:00" in results.read_text()


def test_the_cpu_time_of_a_tox_run_bounds_its_wall_on_this_many_cores(tmp_path):
    (tmp_path / "tox.log").write_text(TOX)
    (tmp_path / "tox.time").write_text("tox cpu: real 545.10 user 901.20 sys 80.30\n")
    found = targets.tox_figures(tmp_path / "tox.log", "cold", tmp_path / "tox.time")
    assert abs(found["cpu_seconds"] - 981.5) < 1e-9
    assert abs(found["cpu_floor"] - 981.5 / found["cores"]) < 1e-9
    assert targets.tox_figures(tmp_path / "tox.log", "cold")["cpu_floor"] is None
    # the machine's own busy seconds, where .ci/run could read them, count every process
    with open(tmp_path / "tox.time", "a") as f:
        f.write("machine busy 1400.5 s\n")
    assert targets.tox_figures(tmp_path / "tox.log", "cold", tmp_path / "tox.time")[
        "cpu_seconds"] == 1400.5
    # and the seconds the hypervisor stole meanwhile, shown beside the figure
    assert targets.tox_figures(tmp_path / "tox.log", "cold", tmp_path / "tox.time")[
        "stolen_seconds"] is None
    with open(tmp_path / "tox.time", "a") as f:
        f.write("machine stolen 61.0 s\n")
    found = targets.tox_figures(tmp_path / "tox.log", "cold", tmp_path / "tox.time")
    assert found["stolen_seconds"] == 61.0
    page = targets.render({"tox_cold": {"value": found, "when": "", "load": []}})
    assert "61 CPU s stolen by the hypervisor" in page


def test_a_tox_run_that_kept_every_core_busy_is_at_its_floor(tmp_path):
    """Over its bound, but its wall within 5 % of its CPU seconds / cores: at its floor."""
    cores = os.cpu_count() or 1
    (tmp_path / "ok.log").write_text(TOX.replace("evaluation failed :(", "congratulations :)"))
    for busy, at_floor in ((523.45 * cores / 1.02, True), (523.45 * cores / 1.5, False)):
        (tmp_path / "tox.time").write_text(f"machine busy {busy:.1f} s\n")
        found = targets.tox_figures(tmp_path / "ok.log", "warm", tmp_path / "tox.time")
        assert not found["meets"] and found["at_floor"] is at_floor, found
        assert targets.verdict(found) == ("at its floor" if at_floor else "misses")


def test_the_summary_line_says_meets_misses_or_not_measured(tmp_path):
    (tmp_path / "tox.log").write_text(TOX.replace("evaluation failed :(", "congratulations :)"))
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "targets.py"), "--tox-log",
         str(tmp_path / "tox.log"), "--tox-kind", "warm", "--summary",
         "--figures", str(tmp_path / "none.json")], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith("speed targets: 0 of 1 measured meet:"), line
    # the suite env of a parallel matrix shares the cores: shown, never the suite's figure
    assert "tox -p warm 523 s misses" in line and "suite - not measured (164 s in tox -p)" in line
    assert "jax floor - not measured" in line


def test_a_figure_within_its_bound_of_its_floor_says_so(tmp_path):
    """A framework run that misses x1.2 of the framework's floor, but is within it of the
    floor plus pytest alone on as many items, is 'at its floor', never 'meets'."""
    def floor_figure(run, floor, bare):
        value = {"ratio": run / floor, "meets": run / floor <= 1.2,
                 "at_floor": run / (floor + bare) <= 1.2}
        return {"value": value, "when": "", "load": []}

    figures = {"floor_torch": floor_figure(3.1, 2.2, 0.5),
               "floor_onnxruntime": floor_figure(1.4, 0.6, 0.2)}
    line = targets.summary_line(figures)
    assert "torch floor x1.41 at its floor" in line, line
    assert "onnxruntime floor x2.33 misses" in line, line
    assert line.startswith("speed targets: 0 of 2 measured meet, 1 more at their floor:"), line


def test_a_floor_on_the_whole_spec_is_kept_beside_the_one_on_some_topics():
    """--floor-topics and the whole spec are two figures: neither overwrites the other,
    and both are on the page and in the summary line."""
    assert targets.floor_key("torch", ["worked_examples"]) == "floor_torch"
    assert targets.floor_key("torch", None) == "floor_torch_all"
    def figure(ratio, topics):
        value = {"ratio": ratio, "meets": ratio <= 1.2, "at_floor": False, "suite_wall": 2.0,
                 "floor": 2.0 / ratio, "topics": topics,
                 "replay": {"load_seconds": 0.5, "calls": 7, "calls_seconds": 0.1}}
        return {"value": value, "when": "", "load": []}

    figures = {"floor_torch": figure(1.1, ["worked_examples"]), "floor_torch_all": figure(2.0, "all")}
    line = targets.summary_line(figures)
    assert "torch floor x1.10 meets" in line and "torch floor (whole spec) x2.00 misses" in line
    assert line.startswith("speed targets: 1 of 2 measured meet:"), line
    rows = [r for r in targets.render(figures).splitlines() if r.startswith("| 4. torch")]
    assert len(rows) == 2 and "whole spec" in rows[1] and "topics: all" in rows[1], rows
    assert not [r for r in targets.render({}).splitlines() if "whole spec" in r]


def test_the_cpu_stolen_by_the_hypervisor_is_read_and_shown_beside_its_figure():
    stat = "cpu  97367 0 15672 11181631 1499 0 1345 28180 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"
    assert targets.stolen_seconds(stat) == 28180 / os.sysconf("SC_CLK_TCK")
    assert targets.stolen_seconds("intr 1 2 3\n") is None
    figure = {"value": {"wall": 150.0, "meets": True, "target": 180}, "when": "then",
              "load": [1.0, 1.0, 1.0], "stolen": 37.5}
    row = next(line for line in targets.render({"suite": figure}).splitlines()
               if line.startswith("| 2."))
    assert "37.5 CPU s stolen by the hypervisor" in row, row
    del figure["stolen"]
    assert "stolen" not in targets.render({"suite": figure}).split("| 2.", 1)[1].split("\n")[0]


def test_the_busy_cpu_of_the_machine_is_read_as_ci_counts_it():
    """user + nice + system + irq + softirq of /proc/stat, as .ci/run's busy() sums them."""
    stat = "cpu  97367 11 15672 11181631 1499 7 1345 28180 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"
    expected = (97367 + 11 + 15672 + 7 + 1345) / os.sysconf("SC_CLK_TCK")
    assert abs(targets.busy_seconds(stat) - expected) < 1e-9
    assert targets.busy_seconds("intr 1 2 3\n") is None
    assert "$2 + $3 + $4 + $7 + $8" in (ROOT / ".ci" / "run").read_text()


def test_each_environment_of_tox_ini_is_measured_and_summed_over_the_cores():
    envs = targets.tox_envs()
    # tox.ini's order, longest first: jax, the suite, ..., the report last
    assert envs[:2] == ["jax", "suite"] and envs[-1] == "report" and "numpy" in envs, envs
    rows = [{"env": e, "wall": 10.0, "rc": 0, "setup": 1.0, "cpu": 15.0} for e in envs]
    rows[1]["rc"] = 1
    figures = targets.env_cpu_figures(rows, cores=2)
    assert figures["cpu_seconds"] == 15.0 * len(envs) and figures["cpu_floor"] == 7.5 * len(envs)
    text = "\n".join(targets.render_env_cpu({"value": figures, "when": "then", "load": [1]}))
    assert f"| {envs[1]} | rc 1 | 10.0 | 1.0 | 15.0 | {100 / len(envs):.0f} % |" in text, text
    assert (f"In all {15 * len(envs)} CPU s ({10 * len(envs)} s of wall one after another): "
            f"on 2 cores no schedule of this work ends before {7.5 * len(envs):.0f} s") in text
    rows[2]["cpu"] = None                      # one not measured: no sum, no floor claimed
    assert targets.env_cpu_figures(rows, cores=2)["cpu_floor"] is None
    assert "In all" not in "\n".join(targets.render_env_cpu(
        {"value": targets.env_cpu_figures(rows, cores=2), "when": "then", "load": [1]}))
    assert "env_cpu" in targets.UNJUDGED        # reported beside target 1, never judged


def test_the_benchmark_applies_the_settings_tox_ini_gives_every_environment():
    """bench.COMMON_ENV mirrors tox.ini's [testenv] defaults: a run measured outside tox
    is the run tox makes."""
    ini = (ROOT / "tox.ini").read_text()
    for key, value in targets.COMMON_ENV.items():
        assert f"{key} = {{env:{key}:{value}}}" in ini, key


def test_the_checked_in_results_page_is_its_figures_rendered():
    """benchmarks/results.md is what targets.py renders from results-targets.json: no
    figure on the page was edited by hand, none is missing from it."""
    figures = json.loads((ROOT / "benchmarks" / "results-targets.json").read_text())
    page = (ROOT / "benchmarks" / "results.md").read_text(encoding="utf-8")
    assert page == targets.render(figures)


def test_the_cost_page_counts_the_verdicts_of_the_checked_in_figures():
    """docs/cost.md's "N of the M figures meet, K more are at their floor" (moved from the
    README) is what the summary line of benchmarks/results-targets.json says."""
    import re

    figures = json.loads((ROOT / "benchmarks" / "results-targets.json").read_text())
    line = targets.summary_line(figures)
    met, judged, floored = re.match(
        r"speed targets: (\d+) of (\d+) measured meet(?:, (\d+) more at their floor)?", line).groups()
    readme = " ".join((ROOT / "docs" / "cost.md").read_text(encoding="utf-8").split())
    assert f"{met} of the {judged} figures meet, {floored or 0} more are at their floor" in readme, line


def test_a_recorded_run_replays_every_call(tmp_path):
    record = tmp_path / "record"
    env = dict(os.environ, BENCH_RECORD_BACKEND="numpy", BENCH_RECORD_DIR=str(record))
    env.pop("PYTEST_XDIST_WORKER", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(ROOT / "spec" / "cases"), "-q", "-p",
         "no:cacheprovider", "--backend", f"{ROOT / 'benchmarks' / 'recording.py'}:Recording",
         "-k", "wo-shi-xiao-gou", "--dtype", "float32"], capture_output=True, text=True,
        timeout=300, env=env, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "backend 'numpy'" in done.stdout        # it declares what it wraps
    recorded = (record / "calls.jsonl").read_text().splitlines()
    assert recorded and {json.loads(r)["op"] for r in recorded} >= {"sdpa"}
    replay = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "recording.py"), "replay",
                             "numpy", str(record)], capture_output=True, text=True, timeout=120,
                            check=False)
    assert replay.returncode == 0, replay.stderr
    figures = json.loads(replay.stdout.strip().splitlines()[-1])
    assert figures["calls"] == len(recorded) and figures["raised"] == 0
    assert figures["inputs_seconds"] > 0 and figures["load_seconds"] > 0
    assert abs(figures["ended_at"] - time.time()) < 60


def test_the_floor_is_the_replaying_programs_wall_less_its_reading_of_the_inputs():
    """What the same work costs outside the suite: the program from its start (its
    interpreter's, NumPy's import) to its last call's return, not the recorded inputs'
    reading, nor its exit."""
    replay = {"calls": 3, "inputs_seconds": 0.25, "load_seconds": 0.7, "calls_seconds": 0.05,
              "raised": 0, "programs": 0, "compile_seconds": 0.0, "ended_at": 101.2}
    found = targets.replay_figures(100.0, replay)
    assert abs(found["floor"] - 0.95) < 1e-9 and abs(found["program_seconds"] - 0.2) < 1e-9
    figure = {"suite_wall": 1.9, "floor": found["floor"], "ratio": 2.0, "replay": found,
              "topics": ["worked_examples"], "meets": False, "options_known": 0.12,
              "ratio_with_options": 1.9 / (found["floor"] + 0.12), "numpy_run": 1.05,
              "ratio_with_numpy_run": 1.9 / (found["floor"] + 1.05)}
    row = next(line for line in targets.render(
        {"floor_torch": {"value": figure, "when": "", "load": []}}).splitlines()
        if line.startswith("| 4. torch"))
    assert ("floor 0.95 s: the program's start 0.20 s + load 0.70 s + 3 calls "
            "0.05 s") in row, row
    assert "knows the options (no backend's process starts before) 0.12 s: run / (floor + " \
        "that) x1.78" in row, row
    assert "NumPy's run of the same tests (the suite's own work) 1.05 s: run / (floor + that) " \
        "x0.95" in row, row


def test_a_run_whose_cases_do_nothing_calls_no_backend(tmp_path, worked_examples_spec):
    """benchmarks/null_cases.py: every test passes with a backend whose every call raises,
    so the figure it gives is the runner's machinery alone."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "null_cases.py"), str(worked_examples_spec),
         "--spec-dir", str(worked_examples_spec), "-p", "no:cacheprovider", "-q",
         "--backend", str(ROOT / "tests" / "faulty" / "raises.py:Raises")],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout, done.stdout[-500:]


def test_the_moment_pytest_knows_the_options_is_measured_before_any_conftest(tmp_path):
    """benchmarks/options_known.py ends pytest where the plugin starts the judge: before
    any conftest.py is imported, with the clock's time printed between start and end."""
    (tmp_path / "conftest.py").write_text("raise SystemExit('a conftest.py was imported')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "benchmarks"))
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "options_known", "-p",
                           "no:cacheprovider", str(tmp_path)], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path, check=False)
    ended = time.time()
    assert done.returncode == 0 and "conftest" not in done.stdout + done.stderr, done
    known = [line for line in done.stdout.splitlines() if line.startswith("options known at ")]
    assert len(known) == 1 and started < float(known[0].split()[-1]) < ended, done.stdout
