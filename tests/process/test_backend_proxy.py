"""The judge's side of the backend's process (process/backend_proxy.py), used directly:
a test's calls under its deadline, calls sent ahead and whom they answer, the processes
replaced (for memory, memory maps, a count of calls, a crash or a timeout), and each
ended with everything it started."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from attention_conformance import plugin
from attention_conformance.backend.resolve import BackendLoadError, load_backend
from attention_conformance.model.errors import BackendCrashed, CaseTimeout
from attention_conformance.process import backend_host, spawn
from attention_conformance.process.ahead import AHEAD, PLANNED_ROOM
from attention_conformance.process.backend_proxy import (AHEAD_BYTES, MAPS_SHARE, BackendProxy,
                                                         maps_limit)
from attention_conformance.process.protocol import JudgeOptions

FAULTY = Path(__file__).resolve().parents[1] / "faulty"
X = np.arange(6.0).reshape(2, 3)


def isolated(reference, *, timeout=60.0, ahead=1, restart_every=0, restart_above_mib=0.0,
             restart_above_maps=None) -> BackendProxy:
    """A backend in a process of its own, loaded, as the judge holds it."""
    options = JudgeOptions(reference=reference, device=None, spec_dir=None,
                           case_timeout=timeout, restart_every=restart_every,
                           restart_above_mib=restart_above_mib)
    proxy = BackendProxy(options, ahead=ahead, restart_above_maps=restart_above_maps)
    try:
        proxy.wait_loaded()
    except BaseException:
        proxy.close()           # its process ended and its log (in TMPDIR: no judge's folder) gone
        raise
    return proxy


def call(proxy, op, arrays, **params):
    """One test of one call; its first output."""
    with proxy.test() as backend:
        return backend.call(op, arrays, params)[0]


def pid(proxy) -> int:
    return proxy.process.proc.pid


@pytest.fixture
def proxies():
    """Proxies made by a test, each closed after it (every process and log ended)."""
    made = []
    yield lambda *args, **kwargs: made.append(isolated(*args, **kwargs)) or made[-1]
    for proxy in made:
        proxy.close()


@pytest.mark.parametrize("attr", ["DtypesString", "CatchAll", "UnknownPolicy"])
def test_a_bad_declaration_is_one_clear_error_at_load(attr):
    with pytest.raises(BackendLoadError) as error:
        isolated(f"{FAULTY / 'bad_declarations.py'}:{attr}")
    message = str(error.value)
    assert "docs/interface.md" in message and "Traceback" not in message
    assert {"DtypesString": "dtypes must be a set", "CatchAll": "lacks attribute(s) name, dtypes, policy",
            "UnknownPolicy": "unknown policy 'masked_rows'"}[attr] in message


def test_an_isolated_backend_answers_like_the_adapter(proxies):
    from attention_conformance.backends.numpy import NumpyBackend
    proxy, plain = proxies("numpy"), NumpyBackend()
    assert (proxy.declaration.name, proxy.declaration.dtypes, proxy.declaration.policy) == \
        (plain.name, frozenset(plain.dtypes), plain.policy)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, 4)).astype(np.float32) for _ in range(3))
    got = call(proxy, "sdpa", {"q": q, "k": k, "v": v}, causal="top_left", scale=None)
    assert type(got) is np.ndarray and got.dtype == np.float32
    np.testing.assert_array_equal(got, plain.sdpa(q, k, v, causal="top_left", scale=None))
    with proxy.test() as backend:
        dq, dk, dv = backend.call("sdpa_vjp", {"q": q, "k": k, "v": v, "d_out": np.ones_like(q)}, {})
    assert dq.shape == q.shape and dv.shape == v.shape


def test_the_timeout_bounds_all_the_calls_of_a_test_together_and_says_so(proxies):
    """Two calls of 0.7 s each under --case-timeout 1: the first returns, the second is
    cut at the test's deadline, and the message says which and how many had returned."""
    proxy = proxies(f"{FAULTY / 'slow_calls.py'}:SlowCalls", timeout=1.0)
    q = np.zeros((1, 2, 4))
    started = time.monotonic()
    with pytest.raises(CaseTimeout) as timeout, proxy.test() as backend:
        backend.call("sdpa", {"q": q, "k": q, "v": q}, {})
        backend.call("sdpa", {"q": q, "k": q, "v": q}, {})
    assert 1.0 <= time.monotonic() - started < 10
    assert str(timeout.value) == (
        "the backend did not finish this test's calls within 1 s (--case-timeout bounds all "
        "the calls of one test together): its call of sdpa was still running (1 call of this "
        "test had returned); its process was killed")
    assert proxy.process is None                    # the next call starts a fresh one
    assert call(proxy, "softmax", {"x": X}).shape == X.shape


def test_the_backend_process_is_restarted_every_n_calls(proxies):
    proxy = proxies("numpy", restart_every=2)
    pids = []
    for _ in range(5):
        call(proxy, "softmax", {"x": X})
        pids.append(pid(proxy))
    assert len(set(pids)) == 3, pids          # calls 1-2, 3-4, 5
    assert proxy.replaced == "--restart-every 2: it had made 2 calls"


def test_a_process_that_grows_past_the_limit_is_restarted(proxies):
    """A backend that leaks 64 MiB a call, limit 100 MiB: the third call finds the
    process grown by 128 MiB and starts a fresh one, which declares its own load."""
    proxy = proxies(f"{FAULTY / 'leaks.py'}:Leaks", restart_above_mib=100)
    pids, grown = [], []
    for _ in range(5):
        np.testing.assert_allclose(call(proxy, "softmax", {"x": X}), load_backend("numpy").softmax(X))
        pids.append(pid(proxy))
        grown.append(proxy.process.held_mib - proxy.process.loaded_mib)
    assert len(set(pids[:2])) == 1 and len(set(pids)) == 3, pids   # calls 1-2, 3-4, 5
    assert 60 < grown[0] < 100 < grown[1] and 60 < grown[2] < 100, grown
    assert proxy.replaced.startswith("it had grown by ")


def test_a_process_that_holds_too_many_memory_maps_is_restarted(proxies):
    """A backend that keeps 1,000 memory maps a call: with no limit, one process goes on
    gathering them (past vm.max_map_count it could not map memory); with a limit 2,500
    over what it held at load, each process is replaced once it was last counted over
    the limit, and only then (the process counts when due: how often depends on load)."""
    reference = f"{FAULTY / 'maps.py'}:LeaksMaps"

    def calls(proxy, n, until=lambda held: False):
        pids, held = [], []
        for _ in range(n):
            call(proxy, "softmax", {"x": X})
            pids.append(pid(proxy))
            held.append(proxy.process.held_maps)
            if until(held[-1]):
                break
        return pids, held

    unlimited = proxies(reference, restart_above_maps=0)
    at_load = unlimited.process.held_maps
    assert at_load is not None, "the backend's process sent no count of its maps"
    pids, held = calls(unlimited, 20, until=lambda n: n > at_load + 3500)
    assert len(set(pids)) == 1 and held[-1] > at_load + 3500, held
    limit = at_load + 2500
    pids, held = calls(proxies(reference, restart_above_maps=limit), 12)
    assert len(set(pids)) >= 2, (pids, held)
    for i in range(1, len(pids)):
        assert (pids[i] != pids[i - 1]) == (held[i - 1] > limit), (i, pids, held)
        if pids[i] != pids[i - 1]:          # the new process's own count, not the last
            assert held[i] <= limit, (i, pids, held)


def test_the_default_limit_of_memory_maps_is_most_of_the_kernels(proxies):
    kernel = int(Path("/proc/sys/vm/max_map_count").read_text())
    assert MAPS_SHARE == 0.8 and maps_limit() == int(kernel * 0.8) > 0    # the docs' 80 %
    proxy = proxies("numpy")
    assert proxy.restart_above_maps == maps_limit()
    assert 0 < proxy.process.held_maps < proxy.restart_above_maps


def test_the_maps_are_counted_every_fifth_of_a_second_in_at_most_5_percent_of_the_time(
        monkeypatch):
    """On a clock of the test's own: a count that takes no time is due again 0.2 s later,
    one that takes 1 s only 20 s later (5 %); each counts the lines of /proc/self/maps."""
    now, cost = [100.0], [0.0]

    def monotonic():            # a count reads it before and after: `cost` apart
        now[0] += cost[0]
        return now[0]

    monkeypatch.setattr(backend_host.time, "monotonic", monotonic)
    counter = backend_host.MapCounter()
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
    assert (backend_host.MAPS_EVERY, backend_host.MAPS_BUDGET) == (0.2, 0.05)  # the docs'


def plugin_defaults(*args) -> dict:
    """The plugin's options as pytest would parse them (the defaults, without args)."""
    parser = pytest.Parser(_ispytest=True)
    plugin.pytest_addoption(parser)
    return vars(parser.parse_known_args(list(args)))


def test_a_process_that_does_not_grow_serves_every_call(proxies):
    """By default there is no restart by count: 50 calls of a backend that does not
    leak are one process, and a leak under the limit does not restart it either."""
    options = plugin_defaults()
    assert options["restart_every"] == 0 and options["restart_above"] == 4096    # the docs'
    for reference, calls in (("numpy", 50), (f"{FAULTY / 'leaks.py'}:Leaks", 3)):
        proxy = proxies(reference, restart_every=options["restart_every"],
                        restart_above_mib=options["restart_above"])
        pids = set()
        for _ in range(calls):
            call(proxy, "softmax", {"x": np.ones((2, 3))})
            pids.add(pid(proxy))
        assert len(pids) == 1, (reference, pids)


@pytest.mark.parametrize("option, value", [
    (option, value) for option in ("--restart-above", "--case-timeout")
    for value in ("-1", "nan", "many")] + [("--restart-every", v) for v in ("-1", "1.5", "many")])
def test_a_limit_below_zero_or_not_a_number_is_a_usage_error(option, value):
    with pytest.raises(pytest.UsageError, match=option):
        plugin_defaults(option, value)
    assert plugin_defaults(option, "0")[option[2:].replace("-", "_")] == 0    # 0: off


@pytest.fixture
def counting(proxies):
    """An isolated backend whose sdpa answers with how many sdpa calls it has computed."""
    return proxies(f"{FAULTY / 'sent_ahead.py'}:Counts", timeout=2.0)


def _qkv(first: float):
    q = np.zeros((1, 2, 4), np.float32)
    q.flat[0] = first
    return {"q": q, "k": q, "v": q}


def test_a_call_sent_ahead_answers_the_same_call_once(counting):
    arrays = _qkv(0.0)
    assert counting.send_ahead("sdpa", arrays, {"scale": 0.5})
    assert not counting.send_ahead("sdpa", arrays, {"scale": 0.5})     # one ahead at most
    assert call(counting, "sdpa", arrays, scale=0.5).flat[0] == 1     # computed once, taken
    assert call(counting, "sdpa", arrays, scale=0.5).flat[0] == 2     # nothing left over
    other = {**arrays, "q": arrays["q"].copy()}     # equal contents, another object
    assert counting.send_ahead("sdpa", arrays, {"scale": 0.5})
    assert call(counting, "sdpa", other, scale=0.5).flat[0] == 4      # the one ahead was 3
    assert counting.send_ahead("sdpa", arrays, {"scale": 0.5})
    assert call(counting, "sdpa", arrays, scale=0.25).flat[0] == 6    # other params: 5 kept


def test_a_call_sent_ahead_by_content_answers_a_call_of_the_same_bytes(counting):
    """A property's call, sent ahead with the test's first, is built again when the
    property runs: arrays of the same dtype, shape and bytes take its answer, others
    do not. Such calls may go PLANNED_ROOM beyond the calls ahead."""
    arrays = _qkv(0.0)
    twin = lambda: {n: a.copy() for n, a in arrays.items()}     # noqa: E731
    assert counting.send_ahead("sdpa", arrays, {})                  # the test's first
    for _ in range(PLANNED_ROOM):
        assert counting.send_ahead("sdpa", twin(), {}, by_content=True)
    assert not counting.send_ahead("sdpa", arrays, {}, by_content=True)   # no more room
    assert not counting.send_ahead("sdpa", _qkv(1.0), {})                 # nor ahead
    assert call(counting, "sdpa", arrays).flat[0] == 1
    assert call(counting, "sdpa", twin()).flat[0] == 2                    # the same bytes
    assert call(counting, "sdpa", _qkv(5.0)).flat[0] == 4                 # not them: 3 kept
    assert call(counting, "sdpa", twin()).flat[0] == 3                    # the kept one
    assert counting.send_ahead("sdpa", twin(), {}, by_content=True)
    same_bytes = {n: a.view("int32") for n, a in arrays.items()}         # another dtype
    assert call(counting, "sdpa", same_bytes).flat[0] == 6                # 5 kept


def test_a_call_sent_ahead_that_hangs_or_crashes_is_blamed_on_no_other_call(counting):
    fine = _qkv(0.0)
    for poison in (_qkv(42.0), _qkv(13.0)):           # hangs, then segfaults
        first = pid(counting)
        assert counting.send_ahead("sdpa", {**fine, "q": poison["q"]}, {})
        started = time.monotonic()
        assert call(counting, "sdpa", fine).flat[0] == 1        # a fresh process's first
        assert pid(counting) != first
        assert time.monotonic() - started < 30


def test_a_crash_in_a_call_sent_ahead_belongs_to_the_call_that_asks(counting):
    poison = _qkv(13.0)
    assert counting.send_ahead("sdpa", poison, {})
    with pytest.raises(BackendCrashed, match="SIGSEGV"):
        call(counting, "sdpa", poison)
    assert not counting.send_ahead("sdpa", poison, {})   # no process to send to


def test_a_restart_takes_over_a_process_started_ahead(proxies):
    proxy = proxies("numpy", restart_every=3)
    call(proxy, "softmax", {"x": X})
    standby = proxy.standby.proc.pid          # started ahead of the restart
    for _ in range(3):
        call(proxy, "softmax", {"x": X})
    assert pid(proxy) == standby
    proxy.close()
    assert proxy.process is None and proxy.standby is None and not proxy.retired


def test_closing_removes_every_log_and_ends_every_process(proxies):
    """A run leaves nothing behind: close() ends every process (the standby's too) with
    everything it started, and deletes their logs, at once (no waiting for an exit)."""
    proxy = proxies(f"{FAULTY / 'stray_thread.py'}:StrayThread", restart_every=3)
    call(proxy, "softmax", {"x": X})
    processes = [proxy.process, proxy.standby]
    logs = [p.log.name for p in processes]
    assert all(os.path.exists(name) for name in logs)
    started = time.monotonic()
    proxy.close()
    assert time.monotonic() - started < 5
    assert not any(os.path.exists(name) for name in logs)
    assert all(p.proc.poll() is not None for p in processes)      # ended and reaped


def test_a_single_call_larger_than_the_limit_is_still_sent_ahead_alone(proxies):
    """Up to AHEAD calls sent ahead (the judge's), at most AHEAD_BYTES of inputs unless one
    call alone is larger, on sockets that hold that and its answers each way."""
    assert AHEAD == 4 and AHEAD_BYTES == 32 * 1024 and PLANNED_ROOM == 2
    assert spawn.SOCKET_BYTES >= 4 * AHEAD_BYTES
    proxy = proxies("numpy", ahead=4)
    big = np.zeros((AHEAD_BYTES // 8 + 1,), np.float64).reshape(1, 1, -1)
    small = np.zeros((1, 2, 4))
    assert proxy.send_ahead("softmax", {"x": big}, {})            # alone: over the limit
    assert not proxy.send_ahead("softmax", {"x": small}, {})      # not beside it
    assert proxy.sent_ahead() == 1
    assert call(proxy, "softmax", {"x": big}).shape == big.shape
    assert proxy.send_ahead("softmax", {"x": small}, {}) and proxy.send_ahead("softmax", {"x": small}, {})
    assert proxy.sent_ahead() == 2


@pytest.mark.parametrize("reference", ["numpy", f"{FAULTY / 'segfaults.py'}:Segfaults"])
def test_inputs_past_the_threshold_reach_the_process_as_files_and_leave_none(
        reference, tmp_path, monkeypatch):
    """With arrays of 16 KiB or more sent as files (spill.py; 64 MiB in a run), a call's
    large input reaches the backend's process through the run's folder and the answer is
    the adapter's; a process that crashes on it costs its test alone; either way no file
    is left in the folder (only the process's log, until the proxy closes)."""
    from attention_conformance.process import wire
    from attention_conformance.process.spill import SpillFolder

    monkeypatch.setattr(wire, "SPILL_BYTES", 16 << 10)
    written, write = [], SpillFolder.write
    monkeypatch.setattr(SpillFolder, "write",
                        lambda self, a: written.append(a.shape) or write(self, a))
    options = JudgeOptions(reference=reference, device=None, spec_dir=None, case_timeout=60.0,
                           restart_every=0, restart_above_mib=0.0, log_dir=str(tmp_path))
    proxy = BackendProxy(options)
    try:
        proxy.wait_loaded()
        x = np.random.default_rng(0).standard_normal((2, 64, 64))          # 64 KiB
        if reference == "numpy":
            from attention_conformance.backends.numpy import NumpyBackend
            np.testing.assert_array_equal(call(proxy, "softmax", {"x": x}),
                                          NumpyBackend().softmax(x))
        else:
            with pytest.raises(BackendCrashed, match="SIGSEGV"):
                call(proxy, "sdpa", {"q": x, "k": x, "v": x})
        assert written and set(written) == {x.shape}
        assert not [p.name for p in tmp_path.iterdir() if not p.name.endswith(".log")]
    finally:
        proxy.close()
    assert list(tmp_path.iterdir()) == []
