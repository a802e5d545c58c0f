"""The certification run: every case x variant x dtype of the spec becomes a test item.

plugin.py registers this module when --backend is given (and only then). Test ids
read ``topic/case-id[variant-dtype]``; the node ids are
``spec/cases/TOPIC.yaml::case-id[variant-dtype]``, so ``-k`` selects by case id,
variant or dtype.
"""

from __future__ import annotations

import contextlib
import time
import traceback
import warnings
from pathlib import Path

import pytest

from .case import in_profile
from .expected import expected_for
from .golden_compute import rounded_inputs
from .golden_store import GoldenStore
from .interface import describe
from .isolation import IsolatedBackend, take_early
from .launch import isolation_options
from .loading import BackendLoadError, load_backend
from .outcomes import BackendCrashed, BackendRaised, CheckFailure, SuiteError, Unsupported
from .report import summary_lines, write_backend_report
from .results import ResultLog, record_for
from .runner import run_case, send_ahead
from .spec_folder import SpecFolder
from .spec_loader import SpecError, load_spec
from .spec_yaml import printable
from .timeout import CaseTimeout, time_limit


class State:
    """What the plugin holds for one session."""

    def __init__(self, config):
        self.config = config
        reference = config.getoption("backend")
        isolated = not config.getoption("in_process")
        if isolated:    # its process imports the framework while this one loads the spec
            self.backend = take_early(config) or IsolatedBackend(
                reference, wait=False, **isolation_options(config.getoption))
        else:
            self.backend = load_backend(reference, config.getoption("device"))
        try:
            self.folder = SpecFolder.from_option(config.getoption("spec_dir"))
            self.cases_dir = self.folder.cases_dir
            self.spec = load_spec(self.folder, cache=True)
            self.golden = GoldenStore.of(self.folder)
            if isolated:
                self.backend.wait_loaded()
        except BaseException:
            if isolated:
                self.backend.close()
            raise
        self.info = describe(self.backend)
        self.expected = expected_for(self.backend, config.getoption("expected_failures"))
        self.log = ResultLog(self.info, self.spec, spec_dir=self.folder.root,
                             selection=_selection(config))


def _selection(config) -> dict:
    """What part of the spec this run was asked to run (printed in the report)."""
    return {"profile": config.getoption("profile"), "dtypes": config.getoption("dtype"),
            "keyword": config.getoption("keyword", ""),
            "markexpr": config.getoption("markexpr", "")}


_STATE = pytest.StashKey["State"]()
_COLLECTOR = pytest.StashKey["_Collector"]()
_NEXT_ITEM = pytest.StashKey["pytest.Item | None"]()


def start(config):
    """Load the backend and the spec, and register the hooks of a certification run."""
    try:
        config.stash[_STATE] = State(config)
        config.stash[_COLLECTOR] = _Collector(config.stash[_STATE])
        config.pluginmanager.register(config.stash[_COLLECTOR], "attention-conformance-results")
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


def pytest_ignore_collect(collection_path: Path, config):
    """Nothing in the spec folder is collected but its case files: no test module, no
    other file, no subfolder (with --backend, the plugin also turns conftest.py off)."""
    state = _state(config)
    if state is None:
        return None
    root, cases = state.folder.root, state.cases_dir
    path = Path(collection_path).resolve()
    if path == cases or path in cases.parents:
        return None
    if path.parent == cases and path.suffix == ".yaml" and not path.is_symlink():
        return None
    if root == path or root in path.parents or cases in path.parents:
        return True
    return None


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
            if Path(case.file).name != name or not in_profile(case, profile):
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

    prepared = None             # this test's inputs, when its first call was sent ahead

    def runtest(self):
        state = _state(self.config)
        try:
            self._run(state)
        finally:
            self._send_next_ahead(state.backend)

    def _run(self, state):
        start = time.perf_counter()
        prepared, self.prepared = self.prepared, None
        try:
            with self._time_limit(state.backend):
                result = run_case(state.backend, self.case, self.variant, self.dtype, state.golden,
                                  prepared)
        except Unsupported as exc:
            self._record("unsupported", str(exc), start)
            pytest.skip(f"unsupported: {exc}")
        except BackendCrashed as exc:        # never an expected failure
            self._record("crash", str(exc), start)
            raise CheckFailure(str(exc)) from None
        except CaseTimeout as exc:
            self._failed(str(exc), start, status="timeout")
            raise
        except CheckFailure as exc:
            self._failed(str(exc), start)
            raise
        except BackendRaised as exc:
            message = f"the backend raised {exc}"
            if exc.remote_traceback:
                message += "\n" + exc.remote_traceback.rstrip()
            self._failed(message, start)
            raise CheckFailure(message) from exc.__cause__
        except Exception as exc:       # the suite's own code: never blamed on the backend
            message = (f"suite error on case {self.case.id} ({self.case.where()}): "
                       f"{type(exc).__name__}: {exc}")
            self._record("fail", message, start)
            raise SuiteError(message) from exc
        self._record("pass", "", start, result.worst_ratio)

    def _send_next_ahead(self, backend):
        """Isolated, the next test's first call goes to the backend's process now and is
        computed there while pytest reports this test (two processes, two cores)."""
        following = self.stash.get(_NEXT_ITEM, None)
        if not getattr(backend, "isolated", False) or not isinstance(following, CaseItem):
            return
        try:
            following.prepared = send_ahead(backend, following.case, following.variant,
                                            following.dtype)
        except Exception:         # that test meets the same error again, and reports it
            following.prepared = None

    def _time_limit(self, backend):
        """The case's deadline: kept by the backend's process when isolated (it is killed
        at the deadline, even inside native code), else a timer in this process."""
        seconds = self.config.getoption("case_timeout")
        if not getattr(backend, "isolated", False):
            return time_limit(seconds)
        backend.deadline = time.monotonic() + seconds if seconds else None
        backend.timeout_text = f"the backend did not return within {seconds:g} s (--case-timeout)"
        return contextlib.nullcontext()

    def _failed(self, message, start, status="fail"):
        """Record a failure; one an expected-failure entry names by its message is xfail."""
        entry = _state(self.config).expected.find_by_message(
            self.test_id, self.case.op, self.dtype, message)
        if entry is not None:
            self.expected_reason = entry.reason
        self._record(status, message, start)
        if entry is not None:
            pytest.xfail(f"{entry.reason} [{message.splitlines()[0][:200]}]")

    def _record(self, status, message, start, ratio=0.0):
        """Kept on the item; pytest_runtest_makereport puts it on the test report, so
        that it reaches the results log in the main process, with or without xdist."""
        self.conformance_record = record_for(self, status, message,
                                             time.perf_counter() - start, ratio)

    def header(self) -> str:
        state = _state(self.config)
        try:
            shapes = ", ".join(f"{n} {tuple(a.shape)}" for n, a in
                               rounded_inputs(self.case, self.variant, self.dtype).items())
        except Exception:
            shapes = "(inputs could not be built)"
        params = ", ".join(f"{k}={v!r}" for k, v in self.case.params.items()) or "none"
        return (f"  test:   {self.test_id} on backend {state.info['name']!r}, dtype {self.dtype}\n"
                f"  case:   {printable(self.case.description)} ({self.case.where()})\n"
                f"  op:     {self.case.op}; inputs: {shapes}; params: {params}\n")

    def repr_failure(self, excinfo):
        """The reason first (pytest's short summary shows that line), then the test, the
        case and its op, then every other broken expectation; at -q only the reason and
        the test, the rest being in the report."""
        error = excinfo.value
        if isinstance(error, pytest.xfail.Exception):
            # an expected failure: its reason is the message; rendering the traceback
            # would parse the framework's source files (~0.4 s an item for TF and JAX)
            return str(error)
        if not isinstance(error, (CheckFailure, CaseTimeout)):
            detail = f"the suite failed on this case: {type(error).__name__}: {error}"
            return detail + "\n" + self.header() + str(excinfo.getrepr(style="short"))
        lines = str(error).rstrip().splitlines() or ["(no message)"]
        if error.__cause__ is not None:
            lines += "".join(traceback.format_exception(error.__cause__, limit=-3)).splitlines()
        if self.config.get_verbosity() < 0:
            header = self.header().splitlines()[0]
            more = f" ({len(lines) - 1} more lines in the report, or rerun without -q)" \
                if len(lines) > 1 else ""
            return f"{lines[0]}\n{header}{more}"
        return lines[0] + "\n" + self.header() + "".join(f"  {line}\n" for line in lines[1:])

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


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Note the test that runs next (what CaseItem sends ahead); the protocol goes on."""
    item.stash[_NEXT_ITEM] = nextitem


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    entry = getattr(item, "conformance_record", None)
    if entry is not None and call.when == "call":
        report.conformance = entry
        if report.skipped and isinstance(report.longrepr, tuple):   # unsupported: at its case
            report.longrepr = (str(item.path), item.case.line, report.longrepr[2])
    return report


class _Collector:
    """Adds each test's record to the results log, in the process that writes reports
    (under pytest-xdist the records arrive on the reports sent by the workers). Every
    selected test gets exactly one record: a test that failed without one (a worker
    crashed, a hook raised) is an error, and one that never ran is counted at the end."""

    def __init__(self, state):
        self.state = state
        self.selected: set[str] = set()
        self.recorded: set[str] = set()

    def pytest_collection_finish(self, session):
        self.selected.update(i.nodeid for i in session.items if isinstance(i, CaseItem))

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        self.selected.update(i for i in ids if "::" in i and "spec-error:" not in i)

    def pytest_runtest_logreport(self, report):
        entry = getattr(report, "conformance", None)
        if entry is not None and report.nodeid not in self.recorded:
            self.recorded.add(report.nodeid)
            self.state.log.add(entry)
        elif report.failed and report.nodeid in self.selected and report.nodeid not in self.recorded:
            self.recorded.add(report.nodeid)
            self.state.log.add(_error_record(report))

    def pytest_keyboard_interrupt(self, excinfo):
        self.state.log.interrupted = True

    def not_run(self) -> list[str]:
        return sorted(self.selected - self.recorded)


def _error_record(report) -> dict:
    """The record of a test that failed outside the runner (no record of its own)."""
    path, _, name = report.nodeid.partition("::")
    topic = Path(path).stem
    case, _, rest = name.partition("[")
    label = rest.rstrip("]")
    variant, _, dtype = label.rpartition("-")
    text = str(report.longrepr or "")
    return {"id": f"{topic}/{name}", "topic": topic, "case": case, "variant": variant,
            "dtype": dtype, "status": "error", "message": text.strip()[-2000:],
            "seconds": round(getattr(report, "duration", 0.0), 6), "error_over_tolerance": 0.0}


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    state = _state(config)
    if not state or hasattr(config, "workerinput"):  # an xdist worker: the main process reports
        return
    collector = config.stash.get(_COLLECTOR, None)
    missing = collector.not_run() if collector else []
    state.log.not_run = len(missing)
    state.log.finish()
    for line in summary_lines(state.log):
        terminalreporter.write_line(line)
    for record in state.log.records:        # one line per failing test, with its reason
        if record["status"] not in ("pass", "xfail", "unsupported"):
            reason = (record["message"].splitlines() or [""])[0][:300]
            terminalreporter.write_line(f"  {record['status'].upper()} {record['id']}: {reason}")
    if _whole_run(config):
        for entry in state.expected.entries:
            if entry.message and not any(r["status"] == "xfail" and entry.message in r["message"]
                                         for r in state.log.records):
                terminalreporter.write_line(f"warning: expected failure {entry.match!r} with message "
                                            f"{entry.message!r} ({entry.where}) matched no failure")
    if state.log.interrupted or missing:
        terminalreporter.write_line(
            f"  INCOMPLETE: {'the run was interrupted; ' if state.log.interrupted else ''}"
            f"{len(missing)} selected tests never ran (the report says so)")
    directory = config.getoption("report")
    if directory:
        paths = write_backend_report(state.log, Path(directory))
        terminalreporter.write_line("report: " + ", ".join(str(p) for p in paths))


def pytest_unconfigure(config):
    state = _state(config)
    if state is not None and isinstance(state.backend, IsolatedBackend):
        state.backend.close(wait=False)     # the backend's own process: not waited for
