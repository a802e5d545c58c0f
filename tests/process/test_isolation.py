"""The backend runs in a process of its own: whatever it does there, the run goes on,
every test gets one record with a status that says what happened, and nothing it does
to its own interpreter reaches the checks.

Each row of FAULTS certifies one faulty adapter (tests/faulty/) on two worked
examples, in a fresh pytest process: the sdpa tests, where the adapter misbehaves, end
in the status given, with the text given, and the attention_weights tests after them
still run and pass.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attention_conformance import plugin
from attention_conformance.process.backend_proxy import IsolatedBackend
from attention_conformance.process.judge_proxy import take_early
from attention_conformance.process.spawn import EARLY_ATTR
from attention_conformance.backend.resolve import BackendLoadError, load_backend

ROOT = Path(__file__).resolve().parents[2]
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
    "leaks.py:Leaks": ("pass", "", ("--restart-above", "100")),     # restarted every 2 calls
    "kills_its_runner.py:KillsItsRunner": (     # judged again alone, then a fresh judge
        "crash", "the judge's process (the suite's own: it runs the backend's process and "
        "checks its outputs) died while judging this test, twice: its process was killed by "
        "signal SIGKILL (9)", ()),
}


def certify(tmp_path, adapter, cases, *options, timeout=240):
    reports = tmp_path / "reports"
    (tmp_path / "tmp").mkdir(exist_ok=True)         # the run's temporary folder: its own
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "TMPDIR": str(tmp_path / "tmp")}
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
    _no_logs_left(tmp_path / "tmp")


def _no_logs_left(folder, seconds=10):
    """The judge's and the backends' logs are gone once their processes have ended (the
    run's end does not wait for them: a second or two after it)."""
    deadline = time.monotonic() + seconds
    while list(folder.glob("attention-conformance-*")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not list(folder.glob("attention-conformance-*"))


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


def test_a_process_that_grows_past_the_limit_is_restarted():
    """A backend that leaks 64 MiB a call, limit 100 MiB: the third call finds the
    process grown by 128 MiB and starts a fresh one, which declares its own load."""
    import numpy as np
    backend = IsolatedBackend(f"{FAULTY / 'leaks.py'}:Leaks", restart_above_mib=100)
    try:
        x = np.arange(6.0).reshape(2, 3)
        pids, grown = [], []
        for _ in range(5):
            np.testing.assert_allclose(backend.softmax(x), load_backend("numpy").softmax(x))
            pids.append(backend._proc.pid)
            grown.append(backend.grown_mib())
        assert len(set(pids[:2])) == 1 and len(set(pids)) == 3, pids   # calls 1-2, 3-4, 5
        assert 60 < grown[0] < 100 < grown[1] and 60 < grown[2] < 100, grown
    finally:
        backend.close()


def test_a_process_that_holds_too_many_memory_maps_is_restarted():
    """A backend that keeps 1,000 memory maps a call: with no limit, one process goes on
    gathering them (past vm.max_map_count it could not map memory); with a limit 2,500
    over what it held at load, each process is replaced once it was last counted over
    the limit, and only then (the process counts when due: how often depends on load)."""
    import numpy as np

    reference = f"{FAULTY / 'maps.py'}:LeaksMaps"
    x = np.arange(6.0).reshape(2, 3)

    def calls(backend, n, until=lambda held: False):
        pids, held = [], []
        for _ in range(n):
            np.testing.assert_allclose(backend.softmax(x), load_backend("numpy").softmax(x))
            pids.append(backend._proc.pid)
            held.append(backend.held_maps)
            if until(held[-1]):
                break
        return pids, held

    unlimited = IsolatedBackend(reference, restart_above_maps=0)
    try:
        at_load = unlimited.held_maps
        assert at_load is not None, "the backend's process sent no count of its maps"
        pids, held = calls(unlimited, 20, until=lambda n: n > at_load + 3500)
        assert len(set(pids)) == 1 and held[-1] > at_load + 3500, held
    finally:
        unlimited.close()
    limit = at_load + 2500
    limited = IsolatedBackend(reference, restart_above_maps=limit)
    try:
        pids, held = calls(limited, 12)
        assert len(set(pids)) >= 2, (pids, held)
        for i in range(1, len(pids)):
            assert (pids[i] != pids[i - 1]) == (held[i - 1] > limit), (i, pids, held)
            if pids[i] != pids[i - 1]:          # the new process's own count, not the last
                assert held[i] <= limit, (i, pids, held)
    finally:
        limited.close()


def test_the_default_limit_of_memory_maps_is_most_of_the_kernels():
    from attention_conformance.process.backend_proxy import MAPS_SHARE, maps_limit

    kernel = int(Path("/proc/sys/vm/max_map_count").read_text())
    assert MAPS_SHARE == 0.8 and maps_limit() == int(kernel * 0.8) > 0    # docs/running.md's 80 %
    backend = IsolatedBackend("numpy")
    try:
        assert backend.restart_above_maps == maps_limit()
        assert 0 < backend.held_maps < backend.restart_above_maps
    finally:
        backend.close()


def test_the_maps_are_counted_every_fifth_of_a_second_in_at_most_5_percent_of_the_time(
        monkeypatch):
    """On a clock of the test's own: a count that takes no time is due again 0.2 s later,
    one that takes 1 s only 20 s later (5 %); each counts the lines of /proc/self/maps."""
    from attention_conformance.process import backend_host as worker

    now, cost = [100.0], [0.0]

    def monotonic():            # a count reads it before and after: `cost` apart
        now[0] += cost[0]
        return now[0]

    monkeypatch.setattr(worker.time, "monotonic", monotonic)
    counter = worker.MapCounter()
    counted = counter.count()
    lines = len(Path("/proc/self/maps").read_bytes().splitlines())
    assert abs(counted - lines) <= 8
    assert counter.due == now[0] + 0.2 and counter.count() is None
    now[0] += 0.2
    cost[0] = 1.0
    started = now[0] + 1.0
    assert counter.count() is not None and counter.due == started + 1.0 / 0.05
    cost[0] = 0.0
    now[0] = counter.due - 0.01
    assert counter.count() is None and counter.count(force=True) is not None
    assert (worker.MAPS_EVERY, worker.MAPS_BUDGET) == (0.2, 0.05)      # docs/running.md's


def test_a_process_that_does_not_grow_serves_every_call():
    """By default there is no restart by count: 50 calls of a backend that does not
    leak are one process, and a leak under the limit does not restart it either."""
    import numpy as np
    options = plugin_defaults()
    assert options["restart_every"] == 0 and options["restart_above"] == 4096    # docs/running.md's
    for reference, calls in (("numpy", 50), (f"{FAULTY / 'leaks.py'}:Leaks", 3)):
        backend = IsolatedBackend(reference, restart_every=options["restart_every"],
                                  restart_above_mib=options["restart_above"])
        try:
            pids = set()
            for _ in range(calls):
                backend.softmax(np.ones((2, 3)))
                pids.add(backend._proc.pid)
            assert len(pids) == 1, (reference, pids)
        finally:
            backend.close()


def plugin_defaults(*args) -> dict:
    """The plugin's options as pytest would parse them (the defaults, without args)."""
    parser = pytest.Parser(_ispytest=True)
    plugin.pytest_addoption(parser)
    return vars(parser.parse_known_args(list(args)))


@pytest.mark.parametrize("option, value", [
    (option, value) for option in ("--restart-above", "--case-timeout")
    for value in ("-1", "nan", "many")] + [("--restart-every", v) for v in ("-1", "1.5", "many")])
def test_a_limit_below_zero_or_not_a_number_is_a_usage_error(option, value):
    with pytest.raises(pytest.UsageError, match=option):
        plugin_defaults(option, value)
    assert plugin_defaults(option, "0")[option[2:].replace("-", "_")] == 0    # 0: off


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


@pytest.fixture
def counting():
    """An isolated backend whose sdpa answers with how many sdpa calls it has computed."""
    backend = IsolatedBackend(f"{FAULTY / 'sent_ahead.py'}:Counts")
    yield backend
    backend.close()


def _q(first: float):
    import numpy as np
    q = np.zeros((1, 2, 4), np.float32)
    q.flat[0] = first
    return q


def test_a_call_sent_ahead_answers_the_same_call_once(counting):
    q = _q(0.0)
    assert counting.prefetch("sdpa", (q, q, q), {"scale": 0.5})
    assert not counting.prefetch("sdpa", (q, q, q), {"scale": 0.5})     # one ahead at most
    assert counting.sdpa(q, q, q, scale=0.5).flat[0] == 1          # computed once, taken
    assert counting.sdpa(q, q, q, scale=0.5).flat[0] == 2          # nothing left over
    other = q.copy()                # equal contents, another object: not the same call
    assert counting.prefetch("sdpa", (q, q, q), {"scale": 0.5})
    assert counting.sdpa(other, q, q, scale=0.5).flat[0] == 4      # the one ahead was 3
    assert counting.prefetch("sdpa", (q, q, q), {"scale": 0.5})
    assert counting.sdpa(q, q, q, scale=0.25).flat[0] == 6         # other params: 5 dropped


def test_a_call_sent_ahead_by_content_answers_a_call_of_the_same_bytes(counting):
    """A property's call, sent ahead with the test's first, is built again when the
    property runs: arrays of the same dtype, shape and bytes take its answer, others
    do not. Such calls may go PLANNED_ROOM beyond the calls ahead."""
    from attention_conformance.process.backend_proxy import PLANNED_ROOM

    q = _q(0.0)
    assert counting.prefetch("sdpa", (q, q, q), {})                  # the test's first
    for _ in range(PLANNED_ROOM):
        twin = q.copy()
        assert counting.prefetch("sdpa", (twin, twin, twin), {}, by_content=True)
    assert not counting.prefetch("sdpa", (q, q, q), {}, by_content=True)   # no more room
    assert not counting.prefetch("sdpa", (_q(1.0),) * 3, {})               # nor ahead
    assert counting.sdpa(q, q, q).flat[0] == 1
    assert counting.sdpa(q.copy(), q.copy(), q.copy()).flat[0] == 2     # the same bytes
    other = _q(5.0)
    assert counting.sdpa(other, other, other).flat[0] == 4     # not them: 3 parked
    assert counting.sdpa(q.copy(), q.copy(), q.copy()).flat[0] == 3     # the parked one
    twin = q.copy()
    assert counting.prefetch("sdpa", (twin, twin, twin), {}, by_content=True)
    same_bytes = q.view("int32")                                # but another dtype
    assert counting.sdpa(same_bytes, same_bytes, same_bytes).flat[0] == 6   # 5 parked


def test_a_call_sent_ahead_that_hangs_or_crashes_is_blamed_on_no_other_call(counting):
    fine = _q(0.0)
    for poison in (_q(42.0), _q(13.0)):           # hangs, then segfaults
        first = counting._proc.pid
        assert counting.prefetch("sdpa", (poison, fine, fine), {})
        counting.deadline, started = time.monotonic() + 2.0, time.monotonic()
        assert counting.sdpa(fine, fine, fine).flat[0] == 1        # a fresh process's first
        assert counting._proc.pid != first
        assert time.monotonic() - started < 30


def test_a_crash_in_a_call_sent_ahead_belongs_to_the_call_that_asks(counting):
    from attention_conformance.model.errors import BackendCrashed

    poison = _q(13.0)
    assert counting.prefetch("sdpa", (poison, poison, poison), {})
    with pytest.raises(BackendCrashed, match="SIGSEGV"):
        counting.sdpa(poison, poison, poison)
    assert not counting.prefetch("sdpa", (poison, poison, poison), {})   # no process to send to


def test_a_restart_takes_over_a_process_started_ahead():
    import numpy as np
    backend = IsolatedBackend("numpy", restart_every=3)
    try:
        x = np.arange(6.0).reshape(2, 3)
        backend.softmax(x)
        standby = backend._standby[0].pid          # started ahead of the restart
        for _ in range(3):
            backend.softmax(x)
        assert backend._proc.pid == standby
    finally:
        backend.close()
    assert backend._proc is None and backend._standby is None and not backend._retired


@pytest.mark.parametrize("wait", [True, False])
def test_closing_removes_the_backend_logs(wait):
    """A run leaves no log behind: close() deletes the log of every process (the
    standby's too), and a backend used after close() writes a new one."""
    import numpy as np
    backend = IsolatedBackend("numpy", restart_every=3)      # a standby at the first call
    try:
        x = np.arange(6.0).reshape(2, 3)
        backend.softmax(x)
        logs = [log.name for log in backend._logs]
        assert len(logs) == 2 and all(os.path.exists(name) for name in logs)
        backend.close(wait=wait)
        assert not any(os.path.exists(name) for name in logs)
        np.testing.assert_allclose(backend.softmax(x), load_backend("numpy").softmax(x))
        again = backend._log.name
        assert again not in logs and os.path.exists(again)
    finally:
        backend.close()
    assert not os.path.exists(again)


def test_a_close_that_does_not_wait_still_ends_a_process_that_will_not_exit():
    """The end of a run does not wait for the backend's process to exit; one that does
    not (a thread that never ends) is killed two seconds later all the same."""
    backend = IsolatedBackend(f"{FAULTY / 'stray_thread.py'}:StrayThread")
    pid = backend._proc.pid
    started = time.monotonic()
    backend.close(wait=False)
    assert time.monotonic() - started < 1.0
    assert _alive(pid)                              # still in its stray thread
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), f"backend process {pid} was never ended"


class _EarlyConfig:
    """What pytest_load_initial_conftests sees of a run: its options, parsed early."""

    def __init__(self, **options):
        self.known_args_namespace = argparse.Namespace(**options)
        self.cleanups = []
        self.pluginmanager = _Plugins()

    def add_cleanup(self, func):
        self.cleanups.append(func)

    def getini(self, name):
        return None


class _Plugins:
    def __init__(self):
        self.blocked = set()

    def set_blocked(self, name):
        self.blocked.add(name)


EARLY_REFERENCE = "numpy"


def _early(in_process=False):
    config = _EarlyConfig(backend=EARLY_REFERENCE, in_process=in_process, device=None,
                          restart_every=0, restart_above=0, spec_dir=None, capture="fd")
    next(plugin.pytest_load_initial_conftests(early_config=config, parser=None, args=[]))
    return config       # the plugin's part of the hook is done when it yields (a wrapper)


def test_an_isolated_run_starts_the_judge_before_pytest_configures():
    """The framework's import overlaps pytest's start-up: the judge's process (which
    starts the backend's) is running when the options are first known, and the run takes
    it, once."""
    config = _early()
    judge = take_early(config)
    try:
        assert judge is not None and judge._proc.poll() is None
        assert take_early(config) is None
        judge.wait_loaded()                      # it declares what the adapter declares
        declared = load_backend(EARLY_REFERENCE)
        assert (judge.name, judge.dtypes) == (declared.name, frozenset(declared.dtypes))
    finally:
        judge.close()
    assert config.known_args_namespace.noconftest is True
    assert config.known_args_namespace.capture == "no"      # nothing of a test runs here
    assert config.pluginmanager.blocked == {"logging-plugin"}     # nor logs there


def test_the_judge_process_starts_before_the_runner_imports_numpy():
    """The plugin launches the judge's process with the standard library alone, so the
    framework's import (in the backend's process, the judge's first act) starts before
    the runner's own imports do."""
    script = f"""
import argparse, sys
from attention_conformance import plugin
class Config:
    known_args_namespace = argparse.Namespace(backend="numpy", in_process=False, device=None,
                                              restart_every=0, restart_above=0, spec_dir=None,
                                              capture="fd")
    class pluginmanager:
        def set_blocked(name): pass
    def getini(self, name): return None
    def add_cleanup(self, func): self.cleanup = func
config = Config()
next(plugin.pytest_load_initial_conftests(early_config=config, parser=None, args=[]))
process = getattr(config, {EARLY_ATTR!r})[1][0]
print(process.poll() is None, "numpy" in sys.modules)
config.cleanup()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]      # running, and no NumPy yet


def test_a_process_started_early_that_no_run_takes_is_stopped_at_cleanup():
    config = _early()
    process, _, log = getattr(config, EARLY_ATTR)[1]
    pid = process.pid
    for cleanup in config.cleanups:
        cleanup()
    assert not os.path.exists(log.name)             # its log removed with it
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), f"backend process {pid} was never ended"


def test_an_in_process_run_starts_no_process_early():
    config = _early(in_process=True)
    assert take_early(config) is None
    assert config.known_args_namespace.capture == "fd"      # the backend runs (and prints) here
    assert not config.pluginmanager.blocked


#: a plugin that writes whether pytest's logging plugin took part in the run
LOGGING_PROBE = """
import os
def pytest_sessionfinish(session):
    with open(os.environ["LOGGING_PROBE_OUT"], "w") as f:
        f.write(str(session.config.pluginmanager.has_plugin("logging-plugin")))
"""


@pytest.mark.parametrize("options, registered", [
    ((), False),                                # nothing of a test logs in pytest's process
    (("--log-cli-level", "INFO"), True),        # logs asked for
    (("--in-process",), True),                  # the backend runs (and logs) here
])
def test_pytests_log_capture_is_left_out_of_an_isolated_run_unless_asked(
        tmp_path, worked_examples_spec, monkeypatch, options, registered):
    (tmp_path / "logging_probe.py").write_text(LOGGING_PROBE)
    out = tmp_path / "registered"
    monkeypatch.setenv("LOGGING_PROBE_OUT", str(out))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    done, _ = certify(tmp_path, "seterr_raise.py:SetsErrRaise", worked_examples_spec,
                      "-p", "logging_probe", *options)       # an adapter that passes
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert out.read_text() == str(registered)


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
        assert "SIGSEGV" in crash["message"] and "while computing sdpa" in crash["message"]


def test_a_judge_killed_by_a_call_sent_ahead_blames_no_other_test(tmp_path, worked_examples_spec):
    """The weights tests' calls kill the judge; the first of them is sent ahead while the
    judge checks the last sdpa test, which is judged again by a fresh judge and passes:
    only the tests whose own calls kill two judges crash."""
    done, report = certify(tmp_path, "kills_its_runner.py:KillsItsRunnerInWeights",
                           worked_examples_spec)
    assert report is not None, (done.stdout + done.stderr)[-3000:]
    statuses = {(r["case"], r["variant"], r["dtype"]): r["status"] for r in report["results"]}
    assert sorted(statuses.values()) == ["crash"] * WEIGHTS_TESTS + ["pass"] * SDPA_TESTS, statuses
    assert all(status == "crash" for (case, _, _), status in statuses.items()
               if case != "wo-ai-zhong-guo-cross-attention"), statuses
    _no_logs_left(tmp_path / "tmp")


def test_in_process_mode_still_runs(tmp_path, worked_examples_spec):
    done, report = certify(tmp_path, "raises.py:Raises", worked_examples_spec, "--in-process")
    assert report is not None and done.returncode == 1
    assert {r["status"] for r in report["results"]} == {"fail", "pass"}


def test_an_interrupted_run_writes_a_report_marked_incomplete(tmp_path, worked_examples_spec):
    reports = tmp_path / "reports"
    cases = worked_examples_spec
    proc = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-m", "pytest", str(cases), "--spec-dir",
         str(cases), "-p", "attention_conformance.plugin", "-p", "no:cacheprovider", "-q",
         "--backend", str(FAULTY / "hangs.py:Hangs"), "-k", SELECT, "--report", str(reports)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
             "FAULTY_HANGS_MARKER": str(tmp_path / "inside-sdpa")},
        # Ctrl-C's default even where this test's own process ignores SIGINT (bash runs
        # a background job so), which the run would inherit: no KeyboardInterrupt then
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not (tmp_path / "inside-sdpa").exists():  # wait until inside the hanging sdpa
        assert proc.poll() is None and time.monotonic() < deadline, "sdpa never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:      # where it is stuck: every thread's stack
        proc.send_signal(signal.SIGABRT)
        out, _ = proc.communicate(timeout=30)
        pytest.fail(f"the interrupted run did not end within 60 s:\n{out[-8000:]}")
    [report] = reports.glob("*.json")
    data = json.loads(report.read_text())
    assert data["complete"] is False and data["interrupted"] is True, out[-2000:]
    assert "INCOMPLETE" in out


RUNNER = """
import sys, numpy as np
from attention_conformance.process.backend_proxy import IsolatedBackend
backend = IsolatedBackend(sys.argv[1])
open(sys.argv[2], "w").write(str(backend._proc.pid))
x = np.zeros((2, 2))
backend.sdpa(x, x, x)
"""


def test_the_backend_process_ends_when_its_runner_is_killed(tmp_path):
    """A runner killed mid-call (SIGKILL: nothing of it runs) leaves no backend behind."""
    pid_file, marker = tmp_path / "worker.pid", tmp_path / "started"
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, str(FAULTY / "hangs.py:Hangs"),
                               str(pid_file)], env={**os.environ, "FAULTY_HANGS_MARKER": str(marker),
                                                    "TMPDIR": str(tmp_path)})   # its log stays
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
