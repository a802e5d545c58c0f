"""The certification run: every case x variant x dtype of the spec becomes a test item.

plugin.py registers this module when --backend is given (and only then). Test ids
read ``topic/case-id[variant-dtype]``; the node ids are
``spec/cases/TOPIC.yaml::case-id[variant-dtype]``, so ``-k`` selects by case id,
variant or dtype.
"""

from __future__ import annotations

import atexit
import gc
import os
import reprlib
import signal
import threading
import warnings
from pathlib import Path

import pytest

from .backend.in_process import InProcess
from .backend.interface import describe
from .backend.resolve import BackendLoadError, load_backend
from .checking.verdict import verdict_of
from .golden.compute import rounded_inputs
from .golden.store import GoldenStore
from .model.case import in_profile, test_name
from .model.errors import CaseTimeout, CheckFailure, SuiteError
from .model.folder import ENV_VAR, SpecFolder
from .model.text import printable
from .model.tolerances import TolerancesError
from .process.judge_proxy import JudgeProxy
from .process.protocol import JudgeOptions
from .reports.markdown import report_problem, summary_lines, write_backend_report
from .reports.results import FAILING, ResultLog, record_for
from .specs.expected import ExpectedFailures, expected_for
from .specs.loader import SpecError, load_spec


class State:
    """What the plugin holds for one session. Isolated, the judge's process runs and
    checks every test, and the backend's declaration (its name, dtypes, policy: info,
    expected failures and the results log) is taken only when first needed, after
    collection, so that pytest collects while the framework imports."""

    def __init__(self, config, early=None):
        """early: (options, launched) of the judge plugin.start_early() started."""
        self.config = config
        self.judge = self.backend = None
        if config.getoption("in_process"):
            self.backend = InProcess(load_backend(config.getoption("backend"),
                                                  config.getoption("device")),
                                     config.getoption("case_timeout"))
        elif early:     # the framework imports in the backend's process as this one starts
            self.judge = JudgeProxy(early[0], launched=early[1])
        else:
            self.judge = JudgeProxy(JudgeOptions.of(config.getoption))
        try:
            self.folder = SpecFolder.from_option(config.getoption("spec_dir"))
            self.cases_dir = self.folder.cases_dir
            _refuse_other_cases(config, self.folder)
            self.spec = load_spec(self.folder, cache=True)
            self.golden = GoldenStore.of(self.folder)
        except BaseException:
            self.close()
            raise
        self._by_file = {}
        for case in self.spec.cases:
            self._by_file.setdefault(Path(case.file).name, []).append(case)
        self.interrupted = False
        self.log = None                 # with info and expected: once the declaration is taken
        self.load_failed = False
        if self.backend is not None:
            self.declared()

    def cases_in(self, file_name: str) -> list:
        """The cases of one case file, in order."""
        return self._by_file.get(file_name, [])

    def declared(self, wait: bool = True) -> "State":
        """The backend's declaration taken (once): info, expected, log. wait=False (an
        interrupted run): a judge still loading is not waited for, and the log says only
        the backend's reference."""
        if self.load_failed:
            raise pytest.UsageError("the backend failed to load (see above)")
        if self.log is None:
            declaration = self._declaration(wait)
            self.info = describe(declaration) if declaration else \
                {"name": self.config.getoption("backend"), "dtypes": [], "policy": {},
                 "versions": {}, "paths": {}}
            self.expected = self._expected(declaration)
            self.log = ResultLog(self.info, self.spec, spec_dir=self.folder.root,
                                 selection=_selection(self.config))
        return self

    def _expected(self, declaration) -> ExpectedFailures:
        """The backend's expected failures; a file that cannot be read is a usage error."""
        if not declaration:
            return ExpectedFailures()
        try:
            return expected_for(declaration, self.config.getoption("expected_failures"))
        except SpecError as exc:
            self.load_failed = True
            self.close()
            raise pytest.UsageError(f"expected failures: {exc}") from None

    def _declaration(self, wait: bool):
        if self.backend is not None:
            return self.backend.declaration
        if self.judge.declaration is None and wait:
            try:
                self.judge.wait_loaded()
            except BackendLoadError as exc:
                self.load_failed = True
                self.close()
                raise pytest.UsageError(str(exc)) from None
        return self.judge.declaration

    def close(self) -> None:
        if self.judge is not None:
            self.judge.close()      # the judge and every process of its run


def _refuse_other_cases(config, folder: SpecFolder) -> None:
    """Only the certified spec's case files are collected: a command line that names
    another spec's cases folder is refused in one line, not answered 'no tests ran'."""
    mine = folder.cases_dir.resolve()
    for arg in config.args:
        path = Path(config.invocation_params.dir, arg.split("::")[0]).resolve()
        cases = path / "cases" if (path / "cases").is_dir() else \
            path if path.is_dir() else path.parent
        if cases != mine and cases.name == "cases" and any(cases.glob("*.yaml")):
            raise pytest.UsageError(
                f"{arg}: the case files of another spec than the one this run certifies "
                f"({folder.root}); certify them with --spec-dir {cases.parent} (or "
                f"{ENV_VAR}={cases.parent})")


def _selection(config) -> dict:
    """What part of the spec this run was asked to run (printed in the report)."""
    return {"profile": config.getoption("profile"), "dtypes": config.getoption("dtype"),
            "keyword": config.getoption("keyword", ""),
            "markexpr": config.getoption("markexpr", "")}


#: at the interpreter's exit everything is frozen again: its last collection walks none of it
atexit.register(gc.freeze)

#: a param's value in a failure's header: a list shortened past 16 items (a scale case's
#: block table lists 16,384 pages)
_SHORT = reprlib.Repr()
_SHORT.maxlist, _SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 16, 4, 200, 200

_STATE = pytest.StashKey["State"]()
_SESSION = pytest.StashKey[pytest.Session]()
_COLLECTOR = pytest.StashKey["_Collector"]()


def start(config, early=None):
    """Load the backend and the spec, and register the hooks of a certification run.
    early: (options, launched) of the judge plugin.start_early() started, if it did."""
    # gc.freeze() at the run's start is undone once pytest's own clean-up, which collects
    # five times, is over (cleanups run last in, first out: pytest's plugins register
    # theirs after this), for an interpreter that runs pytest again (pytest.main)
    config.add_cleanup(gc.unfreeze)
    _interrupt_on_termination(config)
    try:
        config.stash[_STATE] = State(config, early)
        config.stash[_COLLECTOR] = _Collector(config.stash[_STATE])
        config.pluginmanager.register(config.stash[_COLLECTOR], "attention-conformance-results")
        if hasattr(config, "workerinput"):
            config.pluginmanager.register(_AskAsTheyCome(), "attention-conformance-xdist")
    except (BackendLoadError, SpecError, TolerancesError, OSError) as exc:
        raise pytest.UsageError(str(exc)) from None
    problem = report_problem(config.getoption("report")) or _pytest_file_in_spec(config)
    if problem:     # before the first test (the judge, started, ends at unconfigure)
        raise pytest.UsageError(problem)
    stray = _errors_outside_case_files(config.stash[_STATE])
    if stray:   # no test item could carry them: the spec folder itself is unusable
        raise pytest.UsageError("\n".join(str(e) for e in stray))


def _interrupt_on_termination(config) -> None:
    """SIGTERM and SIGHUP end a run as Ctrl-C does (KeyboardInterrupt): its report is
    written, marked incomplete, and every process of the run is ended. Only where no
    handler of another's is set, and only for the run."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _interrupt)
            config.add_cleanup(lambda sig=sig: signal.signal(sig, signal.SIG_DFL))


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"{signal.Signals(signum).name} received")


#: the files pytest takes settings (`addopts = -p plugin`: a module to import) or code from
PYTEST_FILES = ("conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml",
                "tox.ini", "setup.cfg", "pyproject.toml")


def _pytest_file_in_spec(config) -> str | None:
    """Why this run is refused: its ini file, or a file pytest reads, lies in the spec
    folder (its root, its cases folder and any folder between: where pytest looks for
    them; nothing below the cases is collected). pytest reads an ini file and imports
    its -p plugins before this plugin loads: such a folder is refused, so that it is
    never run as if fine."""
    folder = SpecFolder.from_option(config.getoption("spec_dir"))
    root, cases = folder.root.resolve(), folder.cases_dir.resolve()
    if not cases.is_dir():          # no spec there: the loader's error says so
        return None
    looked = [p for p in (*reversed(cases.parents), cases) if root in (p, *p.parents)]
    found = [Path(config.inipath)] if config.inipath else []
    found += [where / name for where in looked for name in PYTEST_FILES
              if os.path.lexists(where / name)]
    inside = [p for p in found if root in (p.resolve(), *p.resolve().parents)]
    if not inside:
        return None
    return (f"{inside[0]}: pytest settings or code inside the spec folder {root} (a spec "
            "folder is data: move the file out of it)")


#: files of the cases folder collected: its case files, and a stray .yml, whose one item
#: fails with the loader's error while the good cases run; any other file is not the spec's
COLLECTED = (".yaml", ".yml")


def _errors_outside_case_files(state) -> list:
    names = {p.name for p in state.cases_dir.glob("*") if p.suffix in COLLECTED}
    return [e for e in state.spec.errors if Path(e.file).name not in names]


def _state(config) -> State | None:
    return config.stash.get(_STATE, None)


def _declared(config) -> State | None:
    """The state with the backend's declaration taken; None without a run, or when the
    backend failed to load (a usage error, already raised)."""
    state = _state(config)
    return state.declared() if state is not None and not state.load_failed else None


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
    if path.parent == cases and path.suffix in COLLECTED and not path.is_symlink():
        return None
    if root == path or root in path.parents or cases in path.parents:
        return True
    return None


def pytest_collect_file(file_path: Path, parent):
    state = _state(parent.config)
    if state and file_path.suffix in COLLECTED and file_path.parent == state.cases_dir:
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
        for case in state.cases_in(name):
            if not in_profile(case, profile):
                continue
            for variant in case.variants:
                for dtype in case.dtypes:
                    if dtypes and dtype not in dtypes:
                        continue
                    yield CaseItem.from_parent(self, name=test_name(case, variant, dtype),
                                               case=case, variant=variant, dtype=dtype)


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

    def runtest(self):
        verdict = verdict_for(self, _state(self.config))
        status, message, seconds = verdict["status"], verdict["message"], verdict["seconds"]
        self.replaced = verdict.get("replaced", "")     # why a fresh backend process, if one
        if status == "pass":
            self._record("pass", "", seconds, verdict["ratio"])
        elif status == "unsupported":
            self._record("unsupported", message, seconds)
            pytest.skip(f"unsupported: {message}")
        elif status == "crash":             # never an expected failure
            self._record("crash", message, seconds, traceback=verdict["cause"])
            raise CheckFailure(message)
        elif status in ("fail", "timeout"):
            self._failed(message, seconds, status, verdict["cause"])
            failure = CaseTimeout(message) if status == "timeout" else CheckFailure(message)
            failure.cause = verdict["cause"]
            raise failure
        else:                               # the suite's own error: never the backend's
            self._record("error", message, seconds, traceback=verdict["cause"])
            raise SuiteError(message + ("\n" + verdict["cause"] if verdict["cause"] else ""))

    def _failed(self, message, seconds, status="fail", traceback=""):
        """Record a failure; one an expected-failure entry names by its message is xfail."""
        entry = _declared(self.config).expected.find_by_message(
            self.test_id, self.case.op, self.dtype, message)
        if entry is not None:
            self.expected_entry = entry
        self._record(status, message, seconds, traceback=traceback)
        if entry is not None:
            pytest.xfail(f"{entry.reason} [{message.splitlines()[0][:200]}]")

    def _record(self, status, message, seconds, ratio=0.0, traceback=""):
        """Kept on the item; pytest_runtest_makereport puts it on the test report, so
        that it reaches the results log in the main process, with or without xdist. A
        failure's message is the text the terminal shows (the traceback kept apart)."""
        if status in FAILING:
            message = "\n".join(self.failure_lines(message))
        self.conformance_record = record_for(self, status, message, seconds, ratio, traceback)
        if getattr(self, "replaced", ""):
            self.conformance_record["replaced"] = self.replaced

    def header(self) -> list[str]:
        """The test, the case (its file and line) and its op with the shapes of its
        inputs: the lines under a failure's reason (built once: a large case's inputs)."""
        if getattr(self, "_header", None) is None:
            self._header = self._header_lines()
        return self._header

    def _header_lines(self) -> list[str]:
        state = _declared(self.config)
        try:
            shapes = ", ".join(f"{n} {tuple(a.shape)}" for n, a in
                               rounded_inputs(self.case, self.variant, self.dtype).items())
        except Exception:
            shapes = "(inputs could not be built)"
        params = ", ".join(f"{k}={_SHORT.repr(v)}" for k, v in self.case.params.items()) or "none"
        return [f"  test:   {self.test_id} on backend {state.info['name']!r}, dtype {self.dtype}",
                f"  case:   {printable(self.case.description)} ({self.case.where()})",
                f"  op:     {self.case.op}; inputs: {shapes}; params: {params}"]

    def failure_lines(self, message: str, cause: str = "") -> list[str]:
        """Every line of a failure, as the terminal shows it and the report keeps it: the
        reason (pytest's short summary shows that line), the test, the case and its op,
        then every other line of the message and the traceback behind it."""
        lines = message.rstrip().splitlines() or ["(no message)"]
        rest = lines[1:] + cause.splitlines()
        return [lines[0], *self.header(), *(f"  {line}" for line in rest)]

    def repr_failure(self, excinfo):
        """A failure's lines (failure_lines); at -q only the reason and the test, with how
        many lines are left out (the report holds them)."""
        error = excinfo.value
        if isinstance(error, pytest.xfail.Exception):
            # an expected failure: its reason is the message; rendering the traceback
            # would parse the framework's source files (~0.4 s an item for TF and JAX)
            return str(error)
        if not isinstance(error, (CheckFailure, CaseTimeout)):
            detail = f"the suite failed on this case: {type(error).__name__}: {error}"
            return "\n".join(self.failure_lines(detail)) + "\n" + \
                str(excinfo.getrepr(style="short"))
        lines = self.failure_lines(str(error), getattr(error, "cause", ""))
        if self.config.get_verbosity() < 0:
            return f"{lines[0]}\n{lines[1]}{self._more_lines(len(lines) - 2)}"
        return "\n".join(lines) + "\n"

    def _more_lines(self, left_out: int) -> str:
        """Where the lines that -q leaves out are: the report, where --report writes one."""
        if not left_out:
            return ""
        where = "in the report, or rerun without -q" if self.config.getoption("report") \
            else "left out: rerun without -q"
        return f" ({left_out} more lines {where})"

    def reportinfo(self):
        return self.path, self.case.line - 1, self.test_id


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    collector = config.stash.get(_COLLECTOR, None)
    if collector is not None:                   # first: an interrupted wait below loses none
        collector.selected.update(i.nodeid for i in items if isinstance(i, CaseItem))
    state = _declared(config)
    if not state:
        return
    for item in items:
        if isinstance(item, CaseItem):
            entry = state.expected.find(item.test_id, item.case.op, item.dtype)
            if entry:
                item.add_marker(pytest.mark.xfail(reason=entry.reason, strict=entry.strict,
                                                  raises=(CheckFailure, CaseTimeout)))
                item.expected_entry = entry
    if _whole_run(config):
        for entry in state.expected.unused():
            if not entry.message:
                warnings.warn(f"expected failure {entry.match!r} ({entry.where}) matches no test",
                              pytest.PytestWarning)


def verdict_for(item: CaseItem, state: State) -> dict:
    """The test's verdict: the judge's (isolated), or judged here (--in-process)."""
    if state.judge is not None:
        return state.judge.verdict(item.test_id)
    return verdict_of(state.backend, item.case, item.variant, item.dtype, state.golden)


def ask_ahead(state: State, items) -> None:
    """Have the judge judge these tests ahead of the run, in this order."""
    if state.judge is not None:
        state.judge.ask([i.test_id for i in items if isinstance(i, CaseItem)])


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    """The judge is asked for every test the run will make, in order, before the first
    runs (under pytest-xdist a worker learns its tests one by one: see below)."""
    state = _declared(session.config)
    if state and not session.config.option.collectonly \
            and not hasattr(session.config, "workerinput"):
        ask_ahead(state, session.items)
    if state:
        gc.freeze()     # the spec and the items stay: collections need not walk them again


class _AskAsTheyCome:
    """Registered in a pytest-xdist worker, which learns its tests one by one: the judge
    is asked for each test and the next as they come."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item, nextitem):
        ask_ahead(_state(item.config), [item, nextitem])


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

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        self.selected.update(i for i in ids if "::" in i and "spec-error:" not in i)

    def pytest_runtest_logreport(self, report):
        self.state.declared()
        entry = getattr(report, "conformance", None)
        if entry is not None and report.nodeid not in self.recorded:
            self.recorded.add(report.nodeid)
            self.state.log.add(entry)
        elif report.failed and report.nodeid in self.selected and report.nodeid not in self.recorded:
            self.recorded.add(report.nodeid)
            self.state.log.add(_error_record(report))

    def pytest_keyboard_interrupt(self, excinfo):
        self.state.interrupted = True

    def not_run(self) -> list[str]:
        """The test ids (topic/case-id[variant-dtype]) of selected tests that never ran."""
        return sorted(_test_id(node) for node in self.selected - self.recorded)


def _test_id(nodeid: str) -> str:
    """topic/case-id[variant-dtype] of a node id (spec/cases/TOPIC.yaml::case-id[...])."""
    path, _, name = nodeid.partition("::")
    return f"{Path(path).stem}/{name}"


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
            "seconds": round(getattr(report, "duration", 0.0), 6), "error_over_tolerance": 0.0,
            "traceback": ""}


def pytest_sessionstart(session):
    session.config.stash[_SESSION] = session     # its exit status, should the report fail


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput"):              # an xdist worker: the main process reports
        return
    state = _state(config)
    if state is None or state.load_failed:
        return
    state.declared(wait=not state.interrupted)
    state.log.interrupted = state.interrupted
    collector = config.stash.get(_COLLECTOR, None)
    missing = collector.not_run() if collector else []
    state.log.not_run = missing
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
        try:
            paths = write_backend_report(state.log, Path(directory))
        except OSError as exc:     # refused before the run, this is a disk full or the like
            terminalreporter.write_line(f"report: NOT WRITTEN: {exc}")
            terminalreporter.config.stash[_SESSION].exitstatus = pytest.ExitCode.USAGE_ERROR
            return
        terminalreporter.write_line("report: " + ", ".join(str(p) for p in paths))


def pytest_unconfigure(config):
    state = _state(config)
    if state is not None:
        state.close()
