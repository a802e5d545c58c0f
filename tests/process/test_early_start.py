"""The plugin starts the judge's process (and so the backend's) as early as pytest knows
the options, with the standard library alone, so that the framework's import overlaps
pytest's start-up; and an isolated run captures nothing in pytest's own process."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import pytest

from attention_conformance import plugin, pytest_cases
from attention_conformance.backend.resolve import load_backend
from attention_conformance.process import spawn

from test_isolation import certify

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
                          restart_every=0, restart_above=0, spec_dir=None, capture="fd",
                          case_timeout=60.0)
    next(plugin.pytest_load_initial_conftests(early_config=config, parser=None, args=[]))
    return config       # the plugin's part of the hook is done when it yields (a wrapper)


def _taken(config):
    """What pytest_configure hands the certification run: the judge started early."""
    early = config.__dict__.pop(plugin.EARLY_ATTR, None)
    return pytest_cases.JudgeProxy(early[0], launched=early[1]) if early else None


def test_an_isolated_run_starts_the_judge_before_pytest_configures():
    """The framework's import overlaps pytest's start-up: the judge's process (which
    starts the backend's) is running when the options are first known, and the run takes
    it, once."""
    config = _early()
    judge = _taken(config)
    try:
        assert judge is not None and judge._proc.poll() is None
        assert _taken(config) is None
        declared, adapter = judge.wait_loaded(), load_backend(EARLY_REFERENCE)
        assert (declared.name, declared.dtypes) == (adapter.name, frozenset(adapter.dtypes))
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
                                              capture="fd", case_timeout=60.0)
    class pluginmanager:
        def set_blocked(name): pass
    def getini(self, name): return None
    def add_cleanup(self, func): self.cleanup = func
config = Config()
next(plugin.pytest_load_initial_conftests(early_config=config, parser=None, args=[]))
process = getattr(config, {plugin.EARLY_ATTR!r})[1][0]
print(process.poll() is None, "numpy" in sys.modules)
config.cleanup()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]      # running, and no NumPy yet


def test_a_process_started_early_that_no_run_takes_is_ended_at_cleanup():
    config = _early()
    process, _, log, tag = getattr(config, plugin.EARLY_ATTR)[1]
    deadline = time.monotonic() + 60
    while len(spawn.tree(process.pid, tag)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)                            # the judge, and the backend it starts
    started = spawn.tree(process.pid, tag)
    assert len(started) == 2, started
    for cleanup in config.cleanups:
        cleanup()
    assert not os.path.exists(log.name)             # its log removed with it
    assert process.poll() is not None and not spawn.tree(None, tag)     # both ended


def test_an_in_process_run_starts_no_process_early():
    config = _early(in_process=True)
    assert _taken(config) is None
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
