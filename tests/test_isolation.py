"""The backend runs in a process of its own: whatever it does there, the run goes on,
every test gets one record with a status that says what happened, and nothing it does
to its own interpreter reaches the checks.

Each row of FAULTS certifies one faulty adapter (tests/faulty/) on two worked
examples, in a fresh pytest process: the sdpa tests, where the adapter misbehaves, end
in the status given, with the text given, and the attention_weights tests after them
still run and pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attention_conformance.isolation import IsolatedBackend
from attention_conformance.loading import BackendLoadError

ROOT = Path(__file__).resolve().parent.parent
FAULTY = ROOT / "tests" / "faulty"
SELECT = "wo-ai-zhong-guo-cross-attention or wo-ai-zhong-guo-weights"
SDPA_TESTS = 4          # 2 variants x float32, float64
WEIGHTS_TESTS = 2

#: adapter -> (status of its sdpa tests, text each of their messages holds, options)
FAULTS = {
    "segfaults.py:Segfaults": ("crash", "killed by signal SIGSEGV (11)", ()),
    "aborts.py:Aborts": ("crash", "killed by signal SIGABRT (6)", ()),
    "exits.py:Exits": ("crash", "its process exited with code 3", ()),
    "system_exit.py:SystemExits": ("fail", "the backend raised SystemExit: the kernel gave up", ()),
    "unprintable.py:RaisesUnprintable": ("fail", "the backend raised Unprintable: <its __str__ raised>", ()),
    "deadlocks.py:Deadlocks": ("timeout", "the backend did not return within 1 s (--case-timeout)",
                               ("--case-timeout", "1")),
    "swallows_timeout.py:SwallowsTimeout": (
        "timeout", "the backend did not return within 1 s (--case-timeout)", ("--case-timeout", "1")),
    "patches_numpy.py:PatchesNumpy": ("fail", "golden out: worst abs error", ()),
    "lying_subclass.py:LyingSubclass": ("fail", "a subclass of numpy.ndarray; return a plain", ()),
    "matrix_output.py:MatrixOutput": ("fail", "output out is a numpy.matrix, a subclass of numpy.ndarray", ()),
    "seterr_raise.py:SetsErrRaise": ("pass", "", ()),
    "stray_thread.py:StrayThread": ("pass", "", ()),
}


def certify(tmp_path, adapter, cases, *options, timeout=240):
    reports = tmp_path / "reports"
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(cases), "--spec-dir", str(cases), "-p",
         "attention_conformance.plugin", "-p", "no:cacheprovider", "-q",
         "--backend", str(FAULTY / adapter), "-k", SELECT, "--dtype", "float32",
         "--dtype", "float64", "--report", str(reports), *options],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)
    [report] = reports.glob("*.json") if reports.exists() else [None]
    return done, json.loads(report.read_text()) if report else None


@pytest.mark.parametrize("adapter", FAULTS)
def test_a_faulty_backend_ends_in_a_status_and_the_run_goes_on(tmp_path, adapter, worked_examples_spec):
    status, text, options = FAULTS[adapter]
    done, report = certify(tmp_path, adapter, worked_examples_spec, *options)
    out = done.stdout + done.stderr
    assert report is not None, out[-3000:]
    records = report["results"]
    assert len(records) == SDPA_TESTS + WEIGHTS_TESTS, out[-3000:]     # one each, none lost
    sdpa = [r for r in records if r["case"] == "wo-ai-zhong-guo-cross-attention"]
    weights = [r for r in records if r["case"] != "wo-ai-zhong-guo-cross-attention"]
    assert [r["status"] for r in sdpa] == [status] * SDPA_TESTS, [r["message"][:300] for r in sdpa]
    assert all(text in r["message"] for r in sdpa), [r["message"][:300] for r in sdpa]
    assert [r["status"] for r in weights] == ["pass"] * WEIGHTS_TESTS, out[-3000:]
    assert report["complete"] is True
    assert done.returncode == (0 if status == "pass" else 1), out[-3000:]


@pytest.mark.parametrize("attr", ["DtypesString", "CatchAll", "UnknownPolicy"])
def test_a_bad_declaration_is_one_clear_error_at_load(attr):
    with pytest.raises(BackendLoadError) as error:
        IsolatedBackend(f"{FAULTY / 'bad_declarations.py'}:{attr}").close()
    message = str(error.value)
    assert "docs/interface.md" in message and "Traceback" not in message
    assert {"DtypesString": "dtypes must be a set", "CatchAll": "lacks attribute(s) name, dtypes, policy",
            "UnknownPolicy": "unknown policy 'masked_rows'"}[attr] in message


def test_the_backend_process_is_restarted_every_n_calls():
    backend = IsolatedBackend("numpy", restart_every=2)
    try:
        import numpy as np
        x = np.arange(6.0).reshape(2, 3)
        pids = []
        for _ in range(5):
            backend.softmax(x)
            pids.append(backend._proc.pid)
        assert len(set(pids)) == 3, pids          # calls 1-2, 3-4, 5
    finally:
        backend.close()


def test_an_isolated_backend_answers_like_the_adapter():
    import numpy as np
    from attention_conformance.backends.numpy import NumpyBackend

    isolated, plain = IsolatedBackend("numpy"), NumpyBackend()
    try:
        assert (isolated.name, isolated.dtypes, isolated.policy) == \
            (plain.name, frozenset(plain.dtypes), plain.policy)
        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal((2, 3, 4)).astype(np.float32) for _ in range(3))
        got = isolated.sdpa(q, k, v, causal="top_left", scale=None)
        assert type(got) is np.ndarray and got.dtype == np.float32
        np.testing.assert_array_equal(got, plain.sdpa(q, k, v, causal="top_left", scale=None))
        dq, dk, dv = isolated.sdpa_vjp(q, k, v, np.ones_like(q))
        assert dq.shape == q.shape and dv.shape == v.shape
    finally:
        isolated.close()


def test_in_process_mode_still_runs(tmp_path, worked_examples_spec):
    done, report = certify(tmp_path, "raises.py:Raises", worked_examples_spec, "--in-process")
    assert report is not None and done.returncode == 1
    assert {r["status"] for r in report["results"]} == {"fail", "pass"}


def test_an_interrupted_run_writes_a_report_marked_incomplete(tmp_path, worked_examples_spec):
    reports = tmp_path / "reports"
    cases = worked_examples_spec
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", str(cases), "--spec-dir", str(cases), "-p",
         "attention_conformance.plugin", "-p", "no:cacheprovider", "-q", "--backend",
         str(FAULTY / "hangs.py:Hangs"), "-k", SELECT, "--report", str(reports)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
             "FAULTY_HANGS_MARKER": str(tmp_path / "inside-sdpa")})
    import signal
    import time
    deadline = time.monotonic() + 120
    while not (tmp_path / "inside-sdpa").exists():  # wait until inside the hanging sdpa
        assert proc.poll() is None and time.monotonic() < deadline, "sdpa never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    [report] = reports.glob("*.json")
    data = json.loads(report.read_text())
    assert data["complete"] is False and data["interrupted"] is True, out[-2000:]
    assert "INCOMPLETE" in out


RUNNER = """
import sys, numpy as np
from attention_conformance.isolation import IsolatedBackend
backend = IsolatedBackend(sys.argv[1])
open(sys.argv[2], "w").write(str(backend._proc.pid))
x = np.zeros((2, 2))
backend.sdpa(x, x, x)
"""


def test_the_backend_process_ends_when_its_runner_is_killed(tmp_path):
    """A runner killed mid-call (SIGKILL: nothing of it runs) leaves no backend behind."""
    pid_file, marker = tmp_path / "worker.pid", tmp_path / "started"
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, str(FAULTY / "hangs.py:Hangs"),
                               str(pid_file)], env={**os.environ, "FAULTY_HANGS_MARKER": str(marker)})
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline and runner.poll() is None:
        time.sleep(0.05)
    assert marker.exists(), "the hanging call never started"
    worker = int(pid_file.read_text())
    runner.kill()
    runner.wait()
    deadline = time.monotonic() + 30
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker), f"backend process {worker} outlived its runner"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:          # a zombie has ended; only its entry is left
        return f.read().split(") ")[-1][0] != "Z"
