"""The pytest plugin: every case x variant x dtype of the spec becomes a test item.

Registered by entry point (pytest11), active only when --backend is given. Test ids
read ``topic/case-id[variant-dtype]``; the node ids are
``spec/cases/TOPIC.yaml::case-id[variant-dtype]``, so ``-k`` selects by case id,
variant or dtype.
"""

from __future__ import annotations

import time
import traceback
import warnings
from pathlib import Path

import pytest

from .expected import expected_for
from .golden import GoldenStore
from .interface import describe
from .loading import BackendLoadError, load_backend
from .paths import CASES_DIR
from .results import ResultLog, record_for
from .runner import CheckFailure, Unsupported, run_case
from .spec import SpecError, load_spec
from .timeout import CaseTimeout, time_limit


def pytest_addoption(parser):
    group = parser.getgroup("attention-conformance")
    group.addoption("--backend", help="backend to certify: numpy | torch | jax | tensorflow |"
                    " an entry point name | package.module:attr | path/file.py:attr")
    group.addoption("--device", default=None,
                    help="build the backend with device=DEVICE (torch: cpu, cuda, cuda:N; "
                    "jax: cpu, gpu); default: the backend's own (the CPU for the built-in "
                    "ones); a device the machine lacks is a load error, never the CPU")
    group.addoption("--spec-dir", default=None, help="case files to run (default spec/cases)")
    group.addoption("--profile", choices=("quick", "long", "all"), default="quick",
                    help="quick (default) skips the long-sequence cases; long runs only them")
    group.addoption("--dtype", action="append", default=None,
                    help="run only these dtypes (repeatable)")
    group.addoption("--expected-failures", action="append", default=[],
                    help="extra expected-failures file for this backend (repeatable)")
    group.addoption("--case-timeout", type=float, default=120.0,
                    help="seconds before a case is failed as hung (0: no limit)")
    group.addoption("--report", default=None, metavar="DIR",
                    help="write this backend's results (JSON and Markdown) into DIR")


class State:
    """What the plugin holds for one session."""

    def __init__(self, config):
        self.config = config
        self.backend = load_backend(config.getoption("backend"), config.getoption("device"))
        self.info = describe(self.backend)
        cases_dir = Path(config.getoption("spec_dir") or CASES_DIR).resolve()
        self.cases_dir = cases_dir
        self.spec = load_spec(cases_dir, cache=True)
        self.golden = GoldenStore(cases_dir.parent / "golden")
        self.expected = expected_for(self.backend, config.getoption("expected_failures"))
        self.log = ResultLog(self.info, self.spec, spec_dir=cases_dir.parent,
                             selection=_selection(config))


def _selection(config) -> dict:
    """What part of the spec this run was asked to run (printed in the report)."""
    return {"profile": config.getoption("profile"), "dtypes": config.getoption("dtype"),
            "keyword": config.getoption("keyword", ""),
            "markexpr": config.getoption("markexpr", "")}


_STATE = pytest.StashKey["State"]()


def pytest_configure(config):
    config.addinivalue_line("markers", "conformance: a case of the attention spec")
    if not config.getoption("backend"):
        return
    try:
        config.stash[_STATE] = State(config)
        config.pluginmanager.register(_Collector(config.stash[_STATE]),
                                      "attention-conformance-results")
    except (BackendLoadError, SpecError, OSError) as exc:
        raise pytest.UsageError(str(exc)) from None
    stray = _errors_outside_case_files(config.stash[_STATE])
    if stray:   # no test item could carry them: the spec folder itself is unusable
        raise pytest.UsageError("\n".join(str(e) for e in stray))


def _errors_outside_case_files(state) -> list:
    names = {p.name for p in state.cases_dir.glob("*.yaml")}
    return [e for e in state.spec.errors if Path(e.file).name not in names]


def _state(config) -> State | None:
    return config.stash.get(_STATE, None)


def pytest_collect_file(file_path: Path, parent):
    state = _state(parent.config)
    if state and file_path.suffix == ".yaml" and file_path.parent == state.cases_dir:
        return CaseFile.from_parent(parent, path=file_path)
    return None


class CaseFile(pytest.File):
    def collect(self):
        state = _state(self.config)
        profile = self.config.getoption("profile")
        dtypes = self.config.getoption("dtype")
        name = self.path.name
        for error in state.spec.errors:
            if Path(error.file).name == name:
                yield SpecErrorItem.from_parent(self, name=f"spec-error:{error.line}", error=error)
        for case in state.spec.cases:
            if Path(case.file).name != name or not _in_profile(case, profile):
                continue
            for variant in case.variants:
                for dtype in case.dtypes:
                    if dtypes and dtype not in dtypes:
                        continue
                    label = f"{variant.label}-{dtype}" if variant.label else dtype
                    yield CaseItem.from_parent(self, name=f"{case.id}[{label}]", case=case,
                                               variant=variant, dtype=dtype)


def _whole_run(config) -> bool:
    """Is every quick test selected (so that an unused expected failure is stale)?"""
    return (config.getoption("profile") == "quick" and not config.getoption("dtype")
            and not config.getoption("keyword") and not config.getoption("markexpr"))


def _in_profile(case, profile):
    return profile == "all" or case.profile == profile


class SpecErrorItem(pytest.Item):
    """A problem in a spec file, reported as one failing test; the run goes on."""

    def __init__(self, *, error, **kwargs):
        super().__init__(**kwargs)
        self.error = error

    def runtest(self):
        raise CheckFailure(f"invalid spec: {self.error}")

    def repr_failure(self, excinfo):
        return str(excinfo.value)

    def reportinfo(self):
        return self.path, self.error.line, f"spec error {self.error.file}:{self.error.line}"


class CaseItem(pytest.Item):
    def __init__(self, *, case, variant, dtype, **kwargs):
        super().__init__(**kwargs)
        self.case, self.variant, self.dtype = case, variant, dtype
        self.test_id = f"{case.topic}/{self.name}"
        self.add_marker("conformance")

    def runtest(self):
        state = _state(self.config)
        start = time.perf_counter()
        try:
            with time_limit(self.config.getoption("case_timeout")):
                result = run_case(state.backend, self.case, self.variant, self.dtype, state.golden)
        except Unsupported as exc:
            self._record("unsupported", str(exc), start)
            pytest.skip(f"unsupported: {exc}")
        except (CheckFailure, CaseTimeout) as exc:
            self._failed(str(exc), start)
            raise
        except Exception as exc:
            message = f"the backend raised {type(exc).__name__}: {exc}"
            self._failed(message, start)
            raise CheckFailure(message) from exc
        self._record("pass", "", start, result.worst_ratio)

    def _failed(self, message, start):
        """Record a failure; one an expected-failure entry names by its message is xfail."""
        entry = _state(self.config).expected.find_by_message(
            self.test_id, self.case.op, self.dtype, message)
        if entry is not None:
            self.expected_reason = entry.reason
        self._record("fail", message, start)
        if entry is not None:
            pytest.xfail(f"{entry.reason} [{message.splitlines()[0][:200]}]")

    def _record(self, status, message, start, ratio=0.0):
        """Kept on the item; pytest_runtest_makereport puts it on the test report, so
        that it reaches the results log in the main process, with or without xdist."""
        self.conformance_record = record_for(self, status, message,
                                             time.perf_counter() - start, ratio)

    def header(self) -> str:
        state = _state(self.config)
        from .golden import rounded_inputs
        try:
            shapes = ", ".join(f"{n} {tuple(a.shape)}" for n, a in
                               rounded_inputs(self.case, self.variant, self.dtype).items())
        except Exception:
            shapes = "(inputs could not be built)"
        params = ", ".join(f"{k}={v!r}" for k, v in self.case.params.items()) or "none"
        return (f"{self.test_id} failed on backend {state.info['name']!r}, dtype {self.dtype}\n"
                f"  case:   {self.case.description} ({self.case.where()})\n"
                f"  op:     {self.case.op}; inputs: {shapes}; params: {params}\n")

    def repr_failure(self, excinfo):
        error = excinfo.value
        if isinstance(error, pytest.xfail.Exception):
            # an expected failure: its reason is the message; rendering the traceback
            # would parse the framework's source files (~0.4 s an item for TF and JAX)
            return str(error)
        if not isinstance(error, (CheckFailure, CaseTimeout)):
            return self.header() + str(excinfo.getrepr(style="short"))
        detail = str(error)
        if error.__cause__ is not None:
            detail += "\n" + "".join(traceback.format_exception(error.__cause__, limit=-3))
        return self.header() + "  " + detail.rstrip().replace("\n", "\n  ")

    def reportinfo(self):
        return self.path, self.case.line - 1, self.test_id


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    state = _state(config)
    if not state:
        return
    for item in items:
        if isinstance(item, CaseItem):
            entry = state.expected.find(item.test_id, item.case.op, item.dtype)
            if entry:
                item.add_marker(pytest.mark.xfail(reason=entry.reason, strict=entry.strict,
                                                  raises=(CheckFailure, CaseTimeout)))
                item.expected_reason = entry.reason
    if _whole_run(config):
        for entry in state.expected.unused():
            if not entry.message:
                warnings.warn(f"expected failure {entry.match!r} ({entry.where}) matches no test",
                              pytest.PytestWarning)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    entry = getattr(item, "conformance_record", None)
    if entry is not None and call.when == "call":
        report.conformance = entry
    return report


class _Collector:
    """Adds each test's record to the results log, in the process that writes reports
    (under pytest-xdist the records arrive on the reports sent by the workers)."""

    def __init__(self, state):
        self.state = state

    def pytest_runtest_logreport(self, report):
        entry = getattr(report, "conformance", None)
        if entry is not None:
            self.state.log.add(entry)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    state = _state(config)
    if not state or hasattr(config, "workerinput"):  # an xdist worker: the main process reports
        return
    from .report import summary_lines

    state.log.finish()
    for line in summary_lines(state.log):
        terminalreporter.write_line(line)
    if _whole_run(config):
        for entry in state.expected.entries:
            if entry.message and not any(r["status"] == "xfail" and entry.message in r["message"]
                                         for r in state.log.records):
                terminalreporter.write_line(f"warning: expected failure {entry.match!r} with message "
                                            f"{entry.message!r} ({entry.where}) matched no failure")
    directory = config.getoption("report")
    if directory:
        paths = state.log.write(Path(directory))
        terminalreporter.write_line("report: " + ", ".join(str(p) for p in paths))
