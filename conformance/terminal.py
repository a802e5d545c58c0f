"""What a certification run prints around its tests: the threads line of its header, no
`configfile:` line for the configuration certify keeps out (`-c os.devnull`), and the
case files named from the spec folder (`cases/masks.yaml ....`), never by a path out of
the folder the run started in (`../../lib/python3/site-packages/...`).

certify gives the frameworks one thread (default_threads): on the spec's tiny inputs a
thread hand-off costs more than the arithmetic (a torch-based adapter took 93-109 s
with every core's OpenMP thread, 25 s with one). A variable the user set wins. The
plugin registers this module with --backend (plugin.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: the variables certify sets to 1 when the user has not: OpenMP's (torch, paddle and
#: OpenBLAS read it) and OpenBLAS's (NumPy)
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")
#: the variables certify set, for the header (the run's processes inherit it)
SET_BY_CERTIFY = "ATTENTION_CONFORMANCE_THREADS_SET"


def default_threads(environ=os.environ) -> list[str]:
    """One thread for each of THREAD_VARIABLES that environ does not set; the names set."""
    chosen = [name for name in THREAD_VARIABLES if not environ.get(name)]
    for name in chosen:
        environ[name] = "1"
    environ[SET_BY_CERTIFY] = " ".join(chosen)
    return chosen


def threads_line(environ=os.environ) -> str:
    """The header's line: each variable's value, and who set it."""
    ours = environ.get(SET_BY_CERTIFY, "").split()
    parts = []
    for name in THREAD_VARIABLES:
        if name in ours:
            parts.append(f"{name}={environ[name]} (set by certify; export {name} to change)")
        elif environ.get(name):
            parts.append(f"{name}={environ[name]} (yours)")
        else:
            parts.append(f"{name} unset (every core)")
    return "threads: " + ", ".join(parts)


@pytest.hookimpl(wrapper=True)
def pytest_report_header(config):
    lines = yield
    if config.inipath is not None and str(config.inipath) == os.devnull:
        lines = [[line for line in group if not line.startswith("configfile:")]
                 if isinstance(group, list) else group for group in lines]
    return [threads_line()] + lines         # pytest prints the last hook's lines first


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    """Case files named by their path in the run's root folder (the spec folder, under
    certify), as their node ids are: `cases/masks.yaml`, not a path that climbs out of
    the folder the run started in."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    start = Path(session.config.invocation_params.dir).resolve()
    root = Path(session.config.rootpath).resolve()
    if reporter is not None and root != start and start not in root.parents:
        reporter.startpath = root
