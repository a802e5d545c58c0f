"""The pytest plugin (entry point pytest11): inert until --backend is given.

pytest loads it in every run of every project installed beside this package, so it
imports nothing but pytest and the table of its options (options.py), and only registers
those. With --backend, it hands the
run to pytest_cases.py, which loads the backend and the spec and turns every case x
variant x dtype into a test item. Test ids read ``topic/case-id[variant-dtype]``.
"""

from __future__ import annotations

import pytest

from .options import OPTIONS


def pytest_addoption(parser):
    """The run's options: one row each in options.py, which certify reads too."""
    group = parser.getgroup("attention-conformance")
    for option in OPTIONS:
        group.addoption(option.flag, **option.kwargs())


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """A certification imports no conftest.py: a spec folder is data, and a conftest.py
    planted in it (or above it) must not run. An isolated run starts the backend's
    process here, the earliest hook that knows the options (before every other plugin's
    part of this hook), so that the framework's import (seconds) overlaps the rest of
    pytest's start-up and the spec's loading: the judge's process, which starts the
    backend's first thing (process/judge_host.py). Isolated, nothing of a test runs in
    pytest's own process (the backend's and the judge's output go to logs of their own),
    so pytest captures nothing there: capturing each test cost ~0.1 ms, and its logging
    plugin's capture of each test's log records ~0.03 ms (kept when the run asks for
    logs: a --log-* option, or log_cli or log_file in the ini file)."""
    known = early_config.known_args_namespace
    if getattr(known, "backend", None):
        known.noconftest = True
        if not known.in_process:
            known.capture = "no"
            if not _logs_asked(early_config, known):
                early_config.pluginmanager.set_blocked("logging-plugin")
            from .process.protocol import JudgeOptions     # the standard library alone
            start_early(early_config, JudgeOptions.of(lambda name: getattr(known, name)))
    return (yield)


#: the attribute of pytest's config that holds a judge started early
EARLY_ATTR = "_attention_conformance_early_judge"


def start_early(config, options) -> None:
    """Start the judge's process (and so the backend's) before pytest has configured the
    run; pytest_cases takes it over. Ended at the config's cleanup if nothing took it (a
    usage error, --help)."""
    from .process import spawn                          # the standard library alone
    launched = spawn.start_judge(options)
    setattr(config, EARLY_ATTR, (options, launched))

    def cleanup():
        if config.__dict__.pop(EARLY_ATTR, None) is not None:
            spawn.end_tree(launched[0], launched[3])
            spawn.remove_folder(launched[2])
    config.add_cleanup(cleanup)


def _logs_asked(config, known) -> bool:
    """Did the run ask pytest for logs: a --log-* option, or log_cli or log_file in its ini?"""
    if any(value not in (None, []) for name, value in vars(known).items()
           if name.startswith("log")):
        return True
    try:
        return bool(config.getini("log_cli") or config.getini("log_file"))
    except ValueError:              # a pytest without these ini options
        return False


def pytest_configure(config):
    config.addinivalue_line("markers", "conformance: a case of the attention spec")
    if config.getoption("backend"):
        from . import pytest_cases, terminal  # the whole runner, only when a run asks for it
        config.pluginmanager.register(terminal, "attention-conformance-terminal")
        config.pluginmanager.register(pytest_cases, "attention-conformance-cases")
        pytest_cases.start(config, early=config.__dict__.pop(EARLY_ATTR, None))
