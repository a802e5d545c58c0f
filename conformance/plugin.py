"""The pytest plugin (entry point pytest11): inert until --backend is given.

pytest loads it in every run of every project installed beside this package, so it
imports nothing but pytest and only registers its options. With --backend, it hands the
run to pytest_cases.py, which loads the backend and the spec and turns every case x
variant x dtype into a test item. Test ids read ``topic/case-id[variant-dtype]``.
"""

from __future__ import annotations

import argparse

import pytest

PROFILES = ("quick", "long", "all")
#: a backend's process that has grown by this many MiB since its load is replaced: a
#: leak, not a case (a quick case needs tens of MiB); a restart costs a framework's import
RESTART_ABOVE_MIB = 4096.0


def _not_negative(kind, least=0):
    """An option's type: a number of that kind, `least` or more (a least of 0: 0 turns
    the option off)."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if not value >= least:              # NaN included
            floor = "0 (off)" if least == 0 else least
            raise argparse.ArgumentTypeError(f"must be {floor} or more, not {text}")
        return value
    parse.__name__ = kind.__name__
    return parse


def pytest_addoption(parser):
    group = parser.getgroup("attention-conformance")
    group.addoption("--backend", help="backend to certify: numpy | torch | jax | tensorflow |"
                    " onnxruntime | onnx-reference | paddle | an entry point name |"
                    " package.module:attr | path/file.py:attr")
    group.addoption("--device", default=None,
                    help="build the backend with device=DEVICE (torch: cpu, cuda, cuda:N; "
                    "jax: cpu, gpu); default: the backend's own (the CPU for the built-in "
                    "ones); a device the machine lacks is a load error, never the CPU")
    group.addoption("--spec-dir", default=None, help="case files to run (default: the spec"
                    " the package carries, or $ATTENTION_CONFORMANCE_SPEC/cases)")
    group.addoption("--profile", choices=PROFILES, default="quick",
                    help="quick (default) skips the long-sequence cases; long runs only them")
    group.addoption("--dtype", action="append", default=None,
                    help="run only these dtypes (repeatable)")
    group.addoption("--expected-failures", action="append", default=[],
                    help="extra expected-failures file for this backend (repeatable)")
    group.addoption("--case-timeout", type=_not_negative(float), default=120.0,
                    help="seconds before a case is failed as hung (0: no limit)")
    group.addoption("--in-process", action="store_true", default=False,
                    help="run the backend in the runner's own process (for debugging: not"
                    " isolated, so a crash ends the run and the backend can reach the checks)")
    group.addoption("--restart-above", type=_not_negative(float), default=RESTART_ABOVE_MIB, metavar="MIB",
                    help="start a fresh backend process once its memory has grown by MIB"
                    " since it loaded (default %(default)g; 0: never for that)")
    group.addoption("--restart-every", type=_not_negative(int), default=0, metavar="N",
                    help="also start a fresh backend process every N calls (default 0:"
                    " only for memory, a crash or a timeout)")
    group.addoption("--report", default=None, metavar="DIR",
                    help="write this backend's results (JSON and Markdown) into DIR")


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
        from . import pytest_cases  # the whole runner, only when a run asks for it
        config.pluginmanager.register(pytest_cases, "attention-conformance-cases")
        pytest_cases.start(config, early=config.__dict__.pop(EARLY_ATTR, None))
