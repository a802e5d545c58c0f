"""The backend runs in a process of its own: whatever it does there, the run goes on,
every test gets one record with a status that says what happened, nothing it does to
its own interpreter reaches the checks, and nothing it starts outlives the run.

Each row of FAULTS certifies one faulty adapter (tests/faulty/) on two worked
examples, in a fresh pytest process: the sdpa tests, where the adapter misbehaves, end
in the statuses given, with the text given, and the attention_weights tests after them
still run and pass. After every row, no process the run started is alive (each process
of the run inherits the test's own tag in its environment, whatever it did to escape)
and the run's temporary folders are gone; so after each row of ENDINGS, a way a run ends
with no clean-up of its runner's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAULTY = ROOT / "tests" / "faulty"
SELECT = "wo-ai-zhong-guo-cross-attention or wo-ai-zhong-guo-weights"
SDPA_TESTS = 4          # 2 variants x float32, float64 (twice as many with every dtype)
WEIGHTS_TESTS = 2
TIMEOUT = "the backend did not finish this test's calls within 1 s (--case-timeout"
#: a judge silent this long is replaced, in the runs that stop theirs (3 heartbeats, as in
#: test_judge.py; a real run waits judge_proxy.STALLED_SECONDS, 10 s)
STALLED = 3.0

#: adapter -> (the statuses of its sdpa tests: one for all, or each of them sorted; the
#: text each of their messages holds (of the first status, if several); options)
FAULTS = {
    "segfaults.py:Segfaults": ("crash", "killed by signal SIGSEGV (11)", ()),
    "aborts.py:Aborts": ("crash", "killed by signal SIGABRT (6)", ()),
    "exits.py:Exits": ("crash", "its process exited with code 3", ()),
    "system_exit.py:SystemExits": ("fail", "the backend raised SystemExit: the kernel gave up", ()),
    "unprintable.py:RaisesUnprintable": ("fail", "the backend raised Unprintable: <its __str__ raised ValueError>", ()),
    "deadlocks.py:Deadlocks": ("timeout", TIMEOUT, ("--case-timeout", "1")),
    "swallows_timeout.py:SwallowsTimeout": ("timeout", TIMEOUT, ("--case-timeout", "1")),
    "patches_numpy.py:PatchesNumpy": ("fail", "golden out: worst abs error", ()),
    "lying_subclass.py:LyingSubclass": ("fail", "a subclass of numpy.ndarray; return a plain", ()),
    "matrix_output.py:MatrixOutput": ("fail", "output out is a numpy.matrix, a subclass of numpy.ndarray", ()),
    "seterr_raise.py:SetsErrRaise": ("pass", "", ()),
    "stray_thread.py:StrayThread": ("pass", "", ()),
    "leaks.py:Leaks": ("pass", "", ("--restart-above", "100")),     # restarted every 2 calls
    "kills_its_runner.py:KillsItsRunner": (     # judged again alone, then a fresh judge
        "crash", "the judge's process (the suite's own: it runs the backend's process and "
        "checks its outputs) ended while judging this test, twice: its process was killed by "
        "signal SIGKILL (9)", ()),
    # a crash costs its own test alone: the calls sent ahead to the dead process are sent
    # again to a fresh one, for the tests they were for
    "crashes_once.py:CrashesOnce": (("crash", "pass", "pass", "pass"), "SIGSEGV", ()),
    "writes_fds.py:WritesFds": ("crash", "it wrote what is no message on the suite's socket "
                                         "(bytes that are no message: b'hello from the adapter", ()),
    "writes_fds.py:FloodsSocket": ("crash", "it wrote what is no message on the suite's socket", ()),
    "closes_fds.py:ClosesFds": ("crash", "its process exited with code 0", ()),
    "forks.py:Forks": ("pass", "", ()),                 # the fork's child never answers
    "leaves_children.py:LeavesChildren": ("pass", "", ()),      # all of them ended after
    "huge_output.py:HugeOutput": ("fail", "the outputs of sdpa are too large: 2147483648 bytes", ()),
    # its last output, escaped, on a line of its own after the test, case and op lines
    "prints_escapes.py:PrintsEscapes": ("crash", "\n  \\x1b[2J\\x1b[31mred alert", ()),
    "catch_all.py:CatchAllGetattr": ("pass", "", ()),
}


#: pytest (argv[2:]) in a runner that takes a judge silent for argv[1] seconds for
#: stopped (judge_proxy.STALLED_SECONDS, 10 s in a real run)
_STALLED_AFTER = """
import sys
import pytest
from attention_conformance.process import judge_proxy
judge_proxy.STALLED_SECONDS = float(sys.argv[1])
sys.exit(pytest.main(sys.argv[2:]))
"""


def certify(tmp_path, adapter, cases, *options, timeout=240, tag=None, select=SELECT,
            spec_dir=None, stalled=None):
    """Certify a faulty adapter on the sdpa and weights worked examples (or the cases
    `select` picks in `cases`, of the spec folder `spec_dir`) in a fresh pytest process,
    every process of which carries `tag` in its environment; the run's result and its
    JSON report (None if it wrote none). stalled: the seconds of silence after which the
    runner replaces its judge, if not the real run's."""
    reports = tmp_path / "reports"
    for folder in ("tmp", "markers"):
        (tmp_path / folder).mkdir(exist_ok=True)     # the run's temporary folder: its own
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "TMPDIR": str(tmp_path / "tmp"),
           "FAULTY_MARKERS": str(tmp_path / "markers"), "FAULTY_TEST_TAG": tag or "none"}
    done = subprocess.run(
        [sys.executable, *(("-c", _STALLED_AFTER, str(stalled)) if stalled else ("-m", "pytest")),
         str(cases), "--spec-dir", str(spec_dir or cases), "-p",
         "attention_conformance.plugin", "-p", "no:cacheprovider", "-q",
         "--backend", str(FAULTY / adapter), "-k", select, "--dtype", "float32",
         "--dtype", "float64", "--report", str(reports), *options],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)
    [report] = reports.glob("*.json") if reports.exists() else [None]
    return done, json.loads(report.read_text()) if report else None


def alive_with(tag: str) -> list[int]:
    """The processes alive (not zombies) whose environment holds FAULTY_TEST_TAG=tag."""
    marker = f"FAULTY_TEST_TAG={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                    found.append(int(entry))
        except (OSError, ValueError):
            pass
    return found


def assert_nothing_left(tmp_path, tag, how=""):
    """Nothing of the run alive, and its temporary folders gone (how: the way the run
    ended, for the message)."""
    alive = {pid: _command(pid) for pid in alive_with(tag)}
    assert alive == {}, f"processes of the run outlived it ({how or 'its end'}): {alive}"
    left = sorted(p.name for p in (tmp_path / "tmp").glob("attention-conformance-*"))
    assert left == [], f"the run's temporary folders outlived it ({how or 'its end'}): {left}"


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


@pytest.mark.parametrize("adapter", FAULTS)
def test_a_faulty_backend_ends_in_a_status_and_the_run_goes_on(tmp_path, adapter, worked_examples_spec):
    statuses, text, options = FAULTS[adapter]
    tag = uuid.uuid4().hex
    done, report = certify(tmp_path, adapter, worked_examples_spec, *options, tag=tag)
    out = done.stdout + done.stderr
    assert report is not None, out[-3000:]
    records = report["results"]
    assert len(records) == SDPA_TESTS + WEIGHTS_TESTS, out[-3000:]     # one each, none lost
    sdpa = [r for r in records if r["case"] == "wo-ai-zhong-guo-cross-attention"]
    weights = [r for r in records if r["case"] != "wo-ai-zhong-guo-cross-attention"]
    expected = (statuses,) * SDPA_TESTS if isinstance(statuses, str) else statuses
    messages = [r["message"][:300] for r in sdpa]
    assert sorted(r["status"] for r in sdpa) == sorted(expected), messages
    assert all(text in r["message"] for r in sdpa if r["status"] == expected[0]), messages
    assert not any("\x1b" in r["message"] for r in records)       # nothing raw reaches a terminal
    assert [r["status"] for r in weights] == ["pass"] * WEIGHTS_TESTS, out[-3000:]
    assert report["complete"] is True
    assert done.returncode == (0 if set(expected) == {"pass"} else 1), out[-3000:]
    assert_nothing_left(tmp_path, tag)


def test_a_stopped_judge_is_replaced_within_seconds_and_the_test_judged_again(
        tmp_path, worked_examples_spec):
    """The backend stops its judge (SIGSTOP) on the run's first sdpa call: the runner hears
    nothing from it (not even its heartbeat), ends it and everything of its run, and a
    fresh judge judges that test again: it passes, as every other test does."""
    tag = uuid.uuid4().hex
    started = time.monotonic()
    done, report = certify(tmp_path, "stops_its_judge.py:StopsItsJudgeOnce",
                           worked_examples_spec, tag=tag, stalled=STALLED)
    assert report is not None, (done.stdout + done.stderr)[-3000:]
    assert {r["status"] for r in report["results"]} == {"pass"}
    assert len(report["results"]) == SDPA_TESTS + WEIGHTS_TESTS
    assert (tmp_path / "markers" / "stopped-once").exists()     # it did stop its judge
    assert time.monotonic() - started < STALLED + 60
    assert_nothing_left(tmp_path, tag)


def test_tests_whose_calls_are_sent_ahead_keep_their_own_statuses(tmp_path, worked_examples_spec):
    """The backend's process segfaults in sdpa on the D8 variants' inputs. The judge sends
    the next tests' first calls ahead while it checks the test before, so a D8 call kills
    the process while a D64 test is being judged: that test passes all the same, and
    each D8 test makes its call again, in a fresh process, and crashes on its own call."""
    done, report = certify(tmp_path, "sent_ahead.py:CrashesOnD8", worked_examples_spec)
    assert report is not None, (done.stdout + done.stderr)[-3000:]
    statuses = {(r["variant"], r["dtype"]): r["status"] for r in report["results"]}
    assert statuses == {
        ("Lq3-Lk4-D64", "float64"): "pass", ("Lq3-Lk4-D64", "float32"): "pass",
        ("Lq3-Lk4-D8", "float64"): "crash", ("Lq3-Lk4-D8", "float32"): "crash",
        ("", "float64"): "pass", ("", "float32"): "pass"}, statuses
    for crash in (r for r in report["results"] if r["status"] == "crash"):  # its own call
        assert "SIGSEGV" in crash["message"] and "during its call of sdpa" in crash["message"]


def test_a_judge_killed_by_a_call_sent_ahead_blames_no_other_test(tmp_path, worked_examples_spec):
    """The weights tests' calls kill the judge; the first of them is sent ahead while the
    judge checks the last sdpa test, which is judged again by a fresh judge and passes:
    only the tests whose own calls kill two judges crash."""
    tag = uuid.uuid4().hex
    done, report = certify(tmp_path, "kills_its_runner.py:KillsItsRunnerInWeights",
                           worked_examples_spec, tag=tag)
    assert report is not None, (done.stdout + done.stderr)[-3000:]
    statuses = {(r["case"], r["variant"], r["dtype"]): r["status"] for r in report["results"]}
    assert sorted(statuses.values()) == ["crash"] * WEIGHTS_TESTS + ["pass"] * SDPA_TESTS, statuses
    assert all(status == "crash" for (case, _, _), status in statuses.items()
               if case != "wo-ai-zhong-guo-cross-attention"), statuses
    assert_nothing_left(tmp_path, tag)


def test_a_test_that_started_a_fresh_process_says_why(tmp_path, worked_examples_spec):
    """The leaking backend is replaced every second call, and the crash of the first call
    of crashes_once.py makes the next test start a fresh process: each record says why."""
    _, report = certify(tmp_path, "leaks.py:Leaks", worked_examples_spec, "--restart-above", "100")
    reasons = {r.get("replaced", "") for r in report["results"]}
    assert any(reason.startswith("it had grown by ") and reason.endswith(
        "MiB (--restart-above 100)") for reason in reasons), reasons
    (tmp_path / "once").mkdir()
    _, report = certify(tmp_path / "once", "crashes_once.py:CrashesOnce", worked_examples_spec)
    assert sum(r.get("replaced") == "the last one ended" for r in report["results"]) == 1


def test_in_process_mode_still_runs(tmp_path, worked_examples_spec):
    done, report = certify(tmp_path, "raises.py:Raises", worked_examples_spec, "--in-process")
    assert report is not None and done.returncode == 1
    assert {r["status"] for r in report["results"]} == {"fail", "pass"}


def _run_until(tmp_path, cases, adapter, marker_name, *options):
    """A certification started in the background, once `marker_name` exists in the run's
    markers folder (the adapter made it: the moment to signal the run), or, marker_name
    None, once the runner's judge runs (the judge's own code not yet started, most often)."""
    tag = uuid.uuid4().hex
    for folder in ("tmp", "markers"):
        (tmp_path / folder).mkdir(exist_ok=True)
    marker = tmp_path / "markers" / (marker_name or "unused")
    proc = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-m", "pytest", str(cases), "--spec-dir",
         str(cases), "-p", "attention_conformance.plugin", "-p", "no:cacheprovider", "-q",
         "--backend", str(FAULTY / adapter), "-k", SELECT, "--report",
         str(tmp_path / "reports"), *options],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "FAULTY_HANGS_MARKER":
             str(marker), "FAULTY_TEST_TAG": tag, "TMPDIR": str(tmp_path / "tmp")},
        # signals' defaults even where this test's own process ignores SIGINT (bash runs
        # a background job so), which the run would inherit: no KeyboardInterrupt then
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not (marker.exists() if marker_name else _judge_of(proc.pid)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.05 if marker_name else 0.001)
    return proc, tag


def _judge_of(runner: int) -> bool:
    """Does the runner's judge process run (python -m ...judge_host, exec'd)?"""
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                if int(f.read().rsplit(b")", 1)[1].split()[1]) != runner:
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if b"attention_conformance.process.judge_host" in f.read():
                    return True
        except (OSError, ValueError, IndexError):
            pass
    return False


def _ended(proc, within: float) -> str:
    try:
        return proc.communicate(timeout=within)[0]
    except subprocess.TimeoutExpired:       # where it is stuck: every thread's stack
        proc.send_signal(signal.SIGABRT)
        out, _ = proc.communicate(timeout=30)
        pytest.fail(f"the signalled run did not end within {within} s:\n{out[-8000:]}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_an_interrupted_run_writes_its_report_with_the_tests_that_never_ran(
        tmp_path, worked_examples_spec, sig):
    """Ctrl-C, SIGTERM or SIGHUP while a test hangs: the report is written, marked
    incomplete, with the count and ids of the tests that never ran (JSON and Markdown);
    nothing of the run is left alive and its temporary folders are gone."""
    proc, tag = _run_until(tmp_path, worked_examples_spec, "hangs.py:Hangs", "inside-sdpa")
    proc.send_signal(sig)
    out = _ended(proc, 60)
    data = json.loads((tmp_path / "reports" / "faulty-hangs.json").read_text())
    assert data["complete"] is False and data["interrupted"] is True, out[-2000:]
    never = data["not_run_tests"]
    assert data["not_run"] == len(never) == 2 * (SDPA_TESTS + WEIGHTS_TESTS) - len(data["results"])
    assert never and all(t.startswith("worked_examples/wo-ai-zhong-guo-") for t in never)
    markdown = (tmp_path / "reports" / "faulty-hangs.md").read_text()
    assert "This run is incomplete" in markdown and all(f"`{t}`" in markdown for t in never)
    assert "INCOMPLETE" in out
    assert_nothing_left(tmp_path, tag)


def _signal(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _runner_killed(proc, tag) -> None:
    proc.kill()


def _all_at_once(proc, tag) -> None:
    _signal([p for p in alive_with(tag) if p != proc.pid], signal.SIGTERM)
    proc.kill()


def _judge_first(proc, tag) -> None:
    proc.send_signal(signal.SIGSTOP)        # a runner not yet at its clean-up
    rest = [p for p in alive_with(tag) if p != proc.pid]
    _signal(rest, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and set(rest) & set(alive_with(tag)):
        time.sleep(0.05)
    proc.kill()


#: ways a run ends with no clean-up of its runner's (`timeout -s KILL`, a cancelled CI
#: job, a container's stop, the OOM killer): (the moment: the adapter's marker, or None
#: as the judge starts; what is signalled then). After each, within 10 s, no process of
#: the run is alive and no temporary folder of it is left.
ENDINGS = {
    # the judge finds its runner gone within half a second, and ends the run
    "runner SIGKILL mid-test": ("inside-sdpa", _runner_killed),
    # ... before the judge had started to watch it (the judge knows its runner's pid)
    "runner SIGKILL as its judge starts": (None, _runner_killed),
    # SIGTERM to the judge and the backend's process, SIGKILL to the runner: the judge
    # ends at once, before it could find its runner gone
    "judge and backend SIGTERM, runner SIGKILL": ("inside-sdpa", _all_at_once),
    # the judge ends (SIGTERM) while its runner lives, and the runner is killed before its
    # clean-up: the judge left a janitor that removes its folder once the runner has gone
    "judge SIGTERM, runner SIGKILL after it": ("inside-sdpa", _judge_first),
}


@pytest.mark.parametrize("how", ENDINGS)
def test_a_run_killed_outright_leaves_nothing_behind(tmp_path, worked_examples_spec, how):
    """A run whose runner is killed outright (SIGKILL: no handler of its runs), with or
    without its judge's ending by SIGTERM before or with it (ENDINGS): nothing of the run
    is left alive and its temporary folders are gone."""
    marker, end = ENDINGS[how]
    proc, tag = _run_until(tmp_path, worked_examples_spec, "hangs.py:Hangs", marker)
    end(proc, tag)
    proc.communicate()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
            alive_with(tag) or list((tmp_path / "tmp").glob("attention-conformance-*"))):
        time.sleep(0.1)
    assert_nothing_left(tmp_path, tag, how)


#: pytest (argv[2:]), with a plugin that creates the file argv[1] once the run has
#: collected its tests. Its hook is trylast, as is the certification's, which waits there
#: for the backend's declaration: pluggy calls the hooks of that rank in the order of
#: their registration, and this plugin is registered first (the certification's at
#: pytest_configure), so its hook is the last one before that wait.
_MARKS_COLLECTED = """
import sys
import pytest


class Collected:
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self):
        open(sys.argv[1], "w").close()


sys.exit(pytest.main(sys.argv[2:], plugins=[Collected()]))
"""


def test_ctrl_c_during_a_slow_adapter_import_ends_the_run_at_once(tmp_path, worked_examples_spec):
    """The adapter takes two minutes to import (in the backend's process): Ctrl-C ends the
    run within seconds, with its report marked incomplete, instead of after the import.
    The Ctrl-C comes once the import has started and the run has collected its tests
    (each says so by a marker file), however long start-up takes."""
    markers = tmp_path / "markers"
    for folder in ("tmp", "markers"):
        (tmp_path / folder).mkdir(exist_ok=True)
    tag = uuid.uuid4().hex
    proc = subprocess.Popen(
        [sys.executable, "-c", _MARKS_COLLECTED, str(markers / "collected"),
         str(worked_examples_spec), "--spec-dir",
         str(worked_examples_spec), "-p", "attention_conformance.plugin", "-p",
         "no:cacheprovider", "-q", "--backend", str(FAULTY / "slow_import.py:SlowImport"),
         "-k", SELECT, "--report", str(tmp_path / "reports")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "FAULTY_TEST_TAG": tag,
             "FAULTY_MARKERS": str(markers), "TMPDIR": str(tmp_path / "tmp")},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120       # collected, and the import under way
    while not ((markers / "importing").exists() and (markers / "collected").exists()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out = _ended(proc, 30)                  # not the rest of the import's 120 s
    [report] = (tmp_path / "reports").glob("*.json")
    data = json.loads(report.read_text())
    assert data["complete"] is False and data["not_run"] == 2 * (SDPA_TESTS + WEIGHTS_TESTS), out
    assert_nothing_left(tmp_path, tag)
