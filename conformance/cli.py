"""The command line: attention-conformance (also python -m attention_conformance).

Commands: certify, list, validate, golden check|regenerate, export, report, fuzz,
new-backend.
docs/cli.md documents each of them.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from pathlib import Path

from .golden import freeze
from .model.case import CASE_PROFILES, profile_counts
from .model.dtypes import DTYPES
from .golden.store import GoldenError
from .model.ops import OPS
from .model.files import write_file
from .options import (BY_FLAG, FORWARDED, PASSTHROUGH, PROFILES, forwarded_argv, not_negative,
                      passthrough_text, rows)
from .model.folder import SpecFolder
from .specs.exact import exact_problems
from .specs.loader import load_spec, missing_cases_folder


def _folder(args) -> SpecFolder:
    return SpecFolder.from_option(args.spec_dir)


def _cases_dir(args) -> Path:
    return _folder(args).cases_dir


def _err(*text):
    print(*text, file=sys.stderr, flush=True)


# --- validate, golden ------------------------------------------------------------------

def _validate(args) -> int:
    spec = load_spec(_folder(args))
    for error in spec.errors:
        print(error)
    counts = {p: profile_counts(spec.cases, p) for p in CASE_PROFILES}
    print(f"{len(spec.cases)} valid cases: "
          + "; ".join(f"{p} profile {n} cases, {t} tests per backend" for p, (n, t) in counts.items())
          + f"; {len(spec.errors)} problems")
    return 1 if spec.errors else 0


def _case_of(key: str) -> str:
    return key.split("/", 1)[0]


def _change_summary(changes) -> list[str]:
    """One line per case: how many arrays were added, removed or changed, and by how much."""
    per_case: dict[str, dict] = {}
    for key, what in changes:
        entry = per_case.setdefault(_case_of(key), {"changed": 0, "added": 0, "removed": 0,
                                                    "max": 0.0, "shape": 0})
        if what.startswith("added"):
            entry["added"] += 1
        elif what.startswith("removed"):
            entry["removed"] += 1
        elif what.startswith("shape"):
            entry["shape"] += 1
        else:
            entry["changed"] += 1
            try:
                entry["max"] = max(entry["max"], float(what.rsplit(" ", 1)[1]))
            except (IndexError, ValueError):
                pass
    lines = []
    for case_id, e in sorted(per_case.items()):
        parts = []
        if e["changed"]:
            parts.append(f"{e['changed']} changed (max abs change {e['max']:.3g})")
        for kind in ("shape", "added", "removed"):
            if e[kind]:
                parts.append(f"{e[kind]} {'reshaped' if kind == 'shape' else kind}")
        lines.append(f"  {case_id}: " + ", ".join(parts))
    return lines


def _golden(args) -> int:
    folder = _folder(args)
    spec = load_spec(folder)
    # an exact value the reference does not give is the spec's error, not every backend's
    problems = spec.errors or exact_problems(spec.cases, folder.tolerances)
    for error in problems:
        print(error, file=sys.stderr)
    if problems:
        print("fix the spec first: golden data are only made from valid cases whose exact "
              "values the float64 reference gives", file=sys.stderr)
        return 1
    if args.action == "regenerate":
        changes = freeze.regenerate(spec.cases, folder)
        for key, what in changes:
            print(f"{key}: {what}")
        print(f"{len(changes)} golden arrays changed")
        summary = _change_summary(changes)
        if summary:
            print(f"{len(summary)} cases changed:")
            print("\n".join(summary))
        return 0
    problems = freeze.check(spec.cases, folder)
    for problem in problems:
        print(problem)
    print("golden data match the reference" if not problems else f"{len(problems)} problems")
    return 1 if problems else 0


# --- list ------------------------------------------------------------------------------

def _selected(case, args) -> bool:
    if args.topic and case.topic not in args.topic:
        return False
    if args.op and case.op not in args.op:
        return False
    if args.dtype and not set(args.dtype) & set(case.dtypes):
        return False
    if args.profile != "all" and case.profile != args.profile:
        return False
    if args.keyword:
        text = " ".join((case.id, case.topic, case.description, case.source)).lower()
        if args.keyword.lower() not in text:
            return False
    return True


def _unknown_names(spec, args) -> str:
    """What a selection's --topic and --op name that the spec lacks, with what it has."""
    parts = []
    for what, given in (("topic", args.topic), ("op", args.op)):
        known = sorted({getattr(c, what) for c in spec.cases})
        unknown = [name for name in given or () if name not in known]
        if unknown:
            parts.append(f"no {what} {', '.join(unknown)} ({what}s: {', '.join(known)})")
    return ": " + "; ".join(parts) if parts else ""


def _list(args) -> int:
    spec = load_spec(_folder(args), cache=True)
    cases = [c for c in spec.cases if _selected(c, args)]
    unknown = _unknown_names(spec, args)
    if unknown:
        _err("no case selected" + unknown)
        return 2
    if args.ids:
        for case in cases:
            print(case.id)
        return 0
    topics: dict[str, list] = {}
    for case in cases:
        topics.setdefault(case.topic, []).append(case)
    width = max((len(c.id) for c in cases), default=10)
    tests = 0
    for topic, topic_cases in topics.items():
        print(f"{topic} ({len(topic_cases)} cases)")
        for c in topic_cases:
            dtypes = [d for d in c.dtypes if not args.dtype or d in args.dtype]
            n = len(c.variants) * len(dtypes)
            tests += n
            mark = "" if c.profile == "quick" else f" [{c.profile}]"
            print(f"  {c.id:<{width}}  {c.op:<20} {n:>3} tests  {c.description}{mark}")
    print(f"{len(cases)} cases of the {args.profile} profile in {len(topics)} topics, "
          f"{tests} tests per backend"
          + (f"; {len(spec.errors)} spec problems (run: attention-conformance validate)"
             if spec.errors else ""))
    return 0


# --- certify ---------------------------------------------------------------------------

def _plugin_autoloads() -> bool:
    """Whether pytest loads the conformance plugin by itself (its pytest11 entry point)."""
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return False
    from importlib.metadata import entry_points
    return any(ep.value == "attention_conformance.plugin" for ep in entry_points(group="pytest11"))


def certify_argv(args, passthrough) -> list[str]:
    """The pytest command line that certify runs."""
    cases_dir = _cases_dir(args)
    argv = [] if _plugin_autoloads() else ["-p", "attention_conformance.plugin"]
    # this process imported conformance before pytest could mark it for assertion
    # rewriting; the plugin asserts nothing, so pytest's warning about it is noise
    argv += ["-W", "ignore:Module already imported so cannot be rewritten"
                   ":pytest.PytestAssertRewriteWarning"]
    # the spec folder is data: no ini file, conftest.py or cache of pytest's is read
    # from it or from where certify runs, and nothing is written into it
    argv += ["-c", os.devnull, "--rootdir", str(_folder(args).root), "--noconftest",
             "-p", "no:cacheprovider"]
    argv += [str(cases_dir), "--backend", args.backend]
    if args.spec_dir:
        argv += ["--spec-dir", str(cases_dir)]
    if args.keyword:
        argv += ["-k", args.keyword]
    argv += forwarded_argv(args)
    return argv + list(passthrough)


#: pytest-xdist's options (a short -n may hold its value: -n2, -nauto)
XDIST_OPTIONS = re.compile(r"-n|--numprocesses(=|$)|--maxprocesses(=|$)|--dist(=|$)")


def _xdist_installed() -> bool:
    from importlib.util import find_spec
    return find_spec("xdist") is not None


def xdist_problem(passthrough) -> str | None:
    """Why certify refuses these pytest options: one of pytest-xdist's without it
    installed (else pytest's 'unrecognized arguments', with 'inifile: /dev/null')."""
    given = next((a for a in passthrough if XDIST_OPTIONS.match(a)), None)
    if given is None or _xdist_installed():
        return None
    return f"{given} needs pytest-xdist, which is not installed: pip install pytest-xdist"


class _Refused(Exception):
    pass


class _Checking(argparse.ArgumentParser):
    def error(self, message):
        raise _Refused(message)


def passthrough_problem(passthrough) -> str | None:
    """A bad value of a plugin option certify hands to pytest unparsed (--case-timeout -1),
    in one line: pytest would print pytest.main()'s usage and its settings file."""
    parser = _Checking(add_help=False, allow_abbrev=False)
    for option in rows(PASSTHROUGH):
        parser.add_argument(option.flag, **option.kwargs())
    try:
        parser.parse_known_args(list(passthrough))
    except _Refused as exc:
        return str(exc)
    return None


def _certify(args, passthrough) -> int:
    import pytest

    from .reports.markdown import report_problem
    from .terminal import default_threads

    missing = missing_cases_folder(_cases_dir(args))
    problem = (missing and str(missing)) or report_problem(args.report) \
        or xdist_problem(passthrough) or passthrough_problem(passthrough)
    if problem:                 # before pytest: no backend is started for nothing
        _err(f"ERROR: {problem}")
        return int(pytest.ExitCode.USAGE_ERROR)
    default_threads()       # one OpenMP and one OpenBLAS thread, unless the user set them
    argv = certify_argv(args, passthrough)
    if args.show_command:
        print(shlex.join(["pytest", *argv]))       # a line a shell runs as it is
    return int(pytest.main(argv))


# --- export ----------------------------------------------------------------------------

def _export(args) -> int:
    from .export import ExportError, check_target, export

    try:
        check_target(Path(args.directory), args.force)      # before the spec is loaded
    except ExportError as exc:
        _err(f"export: {exc}")
        return 2
    spec = load_spec(_folder(args), cache=True)
    for error in spec.errors:
        _err(f"skipped (invalid): {error}")
    cases = [c for c in spec.cases if _selected(c, args)
             and (not args.case or c.id in args.case)]
    missing = sorted(set(args.case or ()) - {c.id for c in cases})
    if missing:
        _err(f"no such case (or not selected): {', '.join(missing)}")
        return 2
    if not cases:
        _err("no case selected" + _unknown_names(spec, args))
        return 2
    step = max(1, len(cases) // 10)

    def progress(done, total, case_id):
        if done % step == 0 or done == total:
            _err(f"export: {done}/{total} cases ({case_id})")

    try:
        index = export(cases, Path(args.directory), args.format,
                       golden_dir=_folder(args).golden_dir, dtypes=args.dtype,
                       spec_dir=_folder(args).root, progress=progress, force=args.force)
    except ExportError as exc:
        _err(f"export: {exc}")
        return 2
    except GoldenError as exc:
        _err(f"golden data: {exc}")
        return 1
    files = sum(len(c["entries"]) for c in index["cases"])
    print(f"exported {len(index['cases'])} cases ({files} {args.format} files) to "
          f"{args.directory}; the format is described in {Path(args.directory) / 'README.md'}")
    return 0


# --- report ----------------------------------------------------------------------------

def _report(args) -> int:
    from .reports.markdown import load_results, matrix_markdown
    from .reports.html import write_matrix

    directory = Path(args.directory)
    results = load_results(directory) if directory.is_dir() else []
    if not results:
        _err(f"no backend reports (BACKEND.json) in {directory}; "
             "make them with: attention-conformance certify BACKEND --report "
             f"{directory}")
        return 1
    out = Path(args.output) if args.output else directory
    try:
        paths = write_matrix(results, out)
    except OSError as exc:
        _err(f"report: {exc}")
        return 2
    print(matrix_markdown(results, brief=True), end="")
    print(f"\nmatrix of {len(results)} backends: " + ", ".join(str(p) for p in paths))
    return 0


# --- fuzz ------------------------------------------------------------------------------

def _fuzz(args) -> int:
    from .fuzz import case_file_yaml, fuzz
    from .backend.resolve import BackendLoadError, load_backend

    try:
        import hypothesis  # noqa: F401
    except ImportError:
        _err("fuzz needs Hypothesis: pip install 'attention-conformance[fuzz]'")
        return 2

    try:
        backend = load_backend(args.backend, args.device)
    except BackendLoadError as exc:
        _err(str(exc))
        return 2
    step = max(1, args.examples // 10)

    def progress(tried, total):
        if tried % step == 0:
            _err(f"fuzz: {tried} cases tried" + (" (shrinking a failure)" if tried > total else ""))

    try:
        report = fuzz(backend, examples=args.examples, seed=args.seed, dtypes=args.dtype,
                      ops=args.op, progress=None if args.quiet else progress)
    except ValueError as exc:
        _err(str(exc))
        return 2
    command = (f"attention-conformance fuzz {args.backend} --examples {args.examples} "
               f"--seed {args.seed}")
    print(report.text(command), end="")
    if report.failure and args.save:
        path = Path(args.save)
        topic = re.sub(r"[^a-z0-9_-]", "_", path.stem.lower())
        if topic != path.stem or path.suffix != ".yaml":
            path = path.with_name(f"{topic}.yaml")   # a case file's topic is its name
        try:
            write_file(path, case_file_yaml([report.failure.doc], topic=topic))
        except OSError as exc:
            _err(f"fuzz: not saved: {exc}")
            return 1
        _err(f"saved as a case file: {path}")
    return 1 if report.failure else 0


# --- new-backend -----------------------------------------------------------------------

def _new_backend(args) -> int:
    from .scaffold import ScaffoldError, placeholders, write

    try:
        written = write(args.name, Path(args.directory))
    except ScaffoldError as exc:
        _err(f"new-backend: {exc}")
        return 2
    for path in written:
        print(path)
    names = placeholders(args.name)
    print(f"next: pip install -e {args.directory}, then attention-conformance certify "
          f"{args.name} (the {names['class']} of {names['package']}/adapter.py; "
          "docs/adding-a-backend.md)")
    return 0


# --- the parser ------------------------------------------------------------------------

def _filters(p, what="cases"):
    p.add_argument("--topic", action="append", help=f"only {what} of this topic (repeatable)")
    p.add_argument("--op", action="append", help=f"only {what} of this op (repeatable)")
    p.add_argument("--dtype", action="append", choices=DTYPES,
                   help="only this dtype (repeatable)")
    p.add_argument("-k", dest="keyword", default=None,
                   help="only cases whose id, topic, description or source contains this text")
    p.add_argument("--profile", choices=PROFILES, default="quick",
                   help="quick (default), long (long-sequence cases), scale (the largest) or all")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attention-conformance",
        description="The attention specification as data, and the suite that certifies "
                    "implementations of it. Documentation: docs/cli.md.")
    parser.add_argument("--spec-dir", default=None,
                        help="folder of case files (default spec/cases); golden data are "
                             "read from its sibling folder golden/")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name, help_text, **kw):
        p = sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False, **kw)
        p.add_argument("--spec-dir", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        return p

    c = command("certify", "run the conformance cases on a backend (pytest underneath); "
                "options not listed here go to pytest (e.g. --junitxml=PATH, -x; -n 2 with "
                "pytest-xdist installed: pip install pytest-xdist), "
                "as does everything after --",
                epilog=passthrough_text())
    c.add_argument("backend", metavar="BACKEND", help=BY_FLAG["--backend"].help)
    for option in rows(FORWARDED):
        c.add_argument(option.flag, **option.kwargs(default=False))
    c.add_argument("-k", dest="keyword", default=None,
                   help="pytest -k expression over test ids (topic/case-id[variant-dtype])")
    c.add_argument("--show-command", action="store_true",
                   help="print the pytest command line first")

    ls = command("list", "list the cases by topic")
    _filters(ls)
    ls.add_argument("--ids", action="store_true", help="print only the ids, one a line")

    command("validate", "check every spec file against the schema; print every problem")

    g = command("golden", "check the frozen golden data against the reference, or "
                "regenerate them (and show which cases changed, by how much)")
    g.add_argument("action", choices=("check", "regenerate"))

    e = command("export", "write each case's inputs, params, golden outputs and tolerances "
                "as plain files (npz or json) with an index and a README")
    e.add_argument("directory", metavar="DIR")
    e.add_argument("--format", choices=("npz", "json"), default="npz")
    e.add_argument("--force", action="store_true",
                   help="replace DIR whole if it is not empty (links inside are removed, "
                        "never followed)")
    e.add_argument("--case", action="append", metavar="ID", help="only this case (repeatable)")
    _filters(e)

    r = command("report", "combine the backend reports of DIR (BACKEND.json) into one "
                "matrix: Markdown on stdout, matrix.md and matrix.html")
    r.add_argument("directory", metavar="DIR")
    r.add_argument("--output", metavar="OUT", default=None,
                   help="write matrix.md and matrix.html here (default DIR)")

    n = command("new-backend", "write an adapter package to start from: a small NumPy "
                "attention library, its adapter and the entry point that names it "
                "(docs/adding-a-backend.md)")
    n.add_argument("name", metavar="NAME", help="the backend's name, e.g. my-kernel "
                   "(package my_kernel_attention, class MyKernelBackend)")
    n.add_argument("directory", metavar="DIR", help="a new or empty folder")

    f = command("fuzz", "compare a backend with the reference on random cases drawn by "
                "Hypothesis; print a failure as a YAML case ready to paste into the spec")
    f.add_argument("backend", metavar="BACKEND")
    f.add_argument("--device", default=None, metavar="DEVICE",
                   help="build the backend with device=DEVICE (as for certify)")
    f.add_argument("--examples", type=not_negative(int, least=1), default=100,
                   help="cases to draw (default 100)")
    f.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    f.add_argument("--dtype", action="append", choices=DTYPES,
                   help="only this dtype (repeatable; default: every dtype the backend declares)")
    fuzzed = [o.name for o in OPS.values() if o.fuzzed]
    f.add_argument("--op", action="append", choices=fuzzed,
                   help=f"only this op (repeatable; default: {', '.join(fuzzed)}, those of "
                        "them that take the chosen dtypes: an fp8 one only sdpa's)")
    f.add_argument("--save", metavar="FILE.yaml", default=None,
                   help="also write the failing case as a complete case file")
    f.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    after = []
    if "--" in argv:
        at = argv.index("--")
        argv, after = argv[:at], argv[at + 1:]
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command == "certify":
        return _certify(args, unknown + after)
    if unknown or after:
        parser.error(f"unrecognized arguments: {' '.join(unknown + after)}")
    handlers = {"validate": _validate, "golden": _golden, "list": _list, "export": _export,
                "report": _report, "fuzz": _fuzz, "new-backend": _new_backend}
    try:
        return handlers[args.command](args)
    except BrokenPipeError:          # e.g. `attention-conformance list | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
