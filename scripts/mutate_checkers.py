#!/usr/bin/env python3
"""Every checker is pinned: turn each one into a no-op in turn and show that the suite's
own tests then fail.

A mutant replaces one checker (a property, a statistic, check_exact, check_golden,
policy_outcome, check_statistics, the spec cache's read, the expected-failure matcher,
...) with a version that checks nothing. For each mutant the script runs the test files
that pin that checker in a fresh pytest process, with the mutant applied at interpreter
start by a sitecustomize module on PYTHONPATH (so it reaches the subprocesses those tests
start too; it takes the place of any other sitecustomize for those runs). A mutant is pinned when at least one test fails; a mutant that cannot be
applied (its target renamed) is an error, not a pass. The unmutated files must pass
first, or nothing can be concluded (`--no-baseline` skips that run, for a caller that
runs those files unmutated itself: the suite does, in the same session).

    python scripts/mutate_checkers.py                    # every mutant; a Markdown table
    python scripts/mutate_checkers.py --only property:   # names starting with a prefix
    python scripts/mutate_checkers.py --write-doc docs/contributing.md
    python scripts/mutate_checkers.py --list
    python scripts/mutate_checkers.py --only check_exact --tests tests/spec/test_reference.py
    python scripts/mutate_checkers.py --only spec_cache. --first-failure   # -x per mutant

Exit status: 0 when every mutant run is pinned, 1 when one is not, 2 on an error (the
baseline fails, or a mutant could not be applied).
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = "ATTENTION_CONFORMANCE_MUTANT"
APPLIED_LOG = "ATTENTION_CONFORMANCE_MUTANT_LOG"
NOT_APPLIED = 97          # exit status of a process whose mutant could not be applied
HEADING = "## Every checker is pinned"

CHECKER_TESTS = ("tests/meta/test_checkers.py",)
CACHE_TESTS = ("tests/spec/test_spec_cache.py",)
EXPECTED_TESTS = ("tests/meta/test_expected_failures.py",)


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str             # what the mutant does, for the table
    tests: tuple          # the test files that pin it


# --- the mutants -----------------------------------------------------------------------
# Each is applied by _apply(name) in the mutated process; names are stable (the table in
# docs/contributing.md lists them).

def mutants() -> list[Mutant]:
    from attention_conformance.checking.properties import PROPERTIES
    from attention_conformance.checking.statistics import STATISTICS

    found = [Mutant(f"property:{name}", "passes whatever it sees", CHECKER_TESTS)
             for name in PROPERTIES]
    found += [Mutant(f"statistic:{name}", "returns 0 whatever the output", CHECKER_TESTS)
              for name in STATISTICS]
    found += [
        Mutant("check_exact", "no-op", CHECKER_TESTS),
        Mutant("check_close", "no-op", CHECKER_TESTS),
        Mutant("check_rows_or_nan", "no-op (ratio 0)", CHECKER_TESTS),
        Mutant("check_golden", "no-op (ratio 0)", CHECKER_TESTS),
        Mutant("check_properties", "no-op", CHECKER_TESTS),
        Mutant("check_statistics", "no-op", CHECKER_TESTS),
        Mutant("policy_outcome", "no-op", CHECKER_TESTS),
        Mutant("policy_outcome:any-choice", "accepts an undeclared or disallowed choice, "
               "checks nothing for it", CHECKER_TESTS),
        Mutant("check_outcome", "no-op", CHECKER_TESTS),
        Mutant("check_case", "no-op (an empty Result)", CHECKER_TESTS),
        Mutant("compare:no-tolerance", "every comparison is ok", CHECKER_TESTS),
        Mutant("worst_error:no-patterns", "NaN and inf positions ignored", CHECKER_TESTS),
        Mutant("accumulation:ignored", "every backend judged in the input tier",
               CHECKER_TESTS),
        Mutant("unchecked_positions:none", "an unchecked choice leaves nothing free",
               CHECKER_TESTS),
        Mutant("unchecked_positions:all", "an unchecked choice leaves every position free",
               CHECKER_TESTS),
        Mutant("plain_key_nan:none", "no dq element may be NaN in place of the golden",
               CHECKER_TESTS),
        Mutant("plain_key_nan:all", "every dq element may be NaN in place of the golden",
               CHECKER_TESTS),
        Mutant("spec_cache.read", "always a miss (None)", CACHE_TESTS),
        Mutant("spec_cache.write", "stores nothing", CACHE_TESTS),
        Mutant("spec_cache.file_key:no-bytes", "the key ignores the file's bytes", CACHE_TESTS),
        Mutant("expected.find", "no entry ever matches before the run", EXPECTED_TESTS),
        Mutant("expected.find_by_message", "no entry ever matches a failure", EXPECTED_TESTS),
        Mutant("expected.message-ignored", "a message entry matches any failure",
               EXPECTED_TESTS),
        Mutant("expected.ops-ignored", "an entry's ops filter is ignored", EXPECTED_TESTS),
        Mutant("expected.dtypes-ignored", "an entry's dtypes filter is ignored",
               EXPECTED_TESTS),
        Mutant("expected.strict-ignored", "every entry is strict", EXPECTED_TESTS),
    ]
    return found


def _noop_like(func, result=None):
    """A function with func's signature (validation reads it) that checks nothing."""
    @functools.wraps(func)
    def noop(*args, **kwargs):
        return result
    return noop


def _apply(name: str) -> None:
    """Patch the one checker `name` in this process (raises if it does not exist)."""
    import numpy as np

    from attention_conformance.checking import expectations as checks, comparison
    from attention_conformance.specs import expected, cache as spec_cache
    from attention_conformance.checking.properties import PROPERTIES
    from attention_conformance.checking.statistics import STATISTICS

    kind, _, rest = name.partition(":")
    if kind == "property":
        PROPERTIES[rest] = _noop_like(PROPERTIES[rest])
    elif kind == "statistic":
        STATISTICS[rest] = _noop_like(STATISTICS[rest], 0.0)
    elif name in ("check_exact", "check_close", "check_properties"):
        setattr(checks, name, _noop_like(getattr(checks, name)))
    elif name in ("check_golden", "check_statistics", "policy_outcome", "check_outcome",
                  "check_rows_or_nan"):
        setattr(checks, name, _noop_like(getattr(checks, name), 0.0))
    elif name == "policy_outcome:any-choice":
        original = checks.policy_outcome

        def any_choice(ctx, policies):
            declared = getattr(ctx.backend, "policy", {}) or {}
            allowed = {n: c for n, c in policies.items() if declared.get(n) in c}
            return original(ctx, allowed) if allowed else 0.0
        checks.policy_outcome = any_choice
    elif name == "check_case":
        checks.check_case = _noop_like(checks.check_case, checks.Result())
    elif name == "compare:no-tolerance":
        comparison.Comparison.ok = property(lambda self: True)
    elif name == "accumulation:ignored":
        checks.accumulation = lambda ctx: "input"
    elif name == "worst_error:no-patterns":
        def finite_only(actual, expected_):
            both = np.isfinite(actual) & np.isfinite(expected_)
            diff = np.where(both, np.abs(np.where(both, actual, 0) - np.where(both, expected_, 0)), 0)
            if diff.size == 0:
                return 0.0, (), ""
            index = np.unravel_index(int(np.argmax(diff)), diff.shape)
            return float(diff[index]), tuple(int(i) for i in index), ""
        comparison.worst_error = finite_only
    elif name == "unchecked_positions:none":
        checks.unchecked_positions = _noop_like(checks.unchecked_positions)
    elif name == "unchecked_positions:all":
        original = checks.unchecked_positions

        def everything(ctx, name_, shape, policy=None):
            free = original(ctx, name_, shape, policy)
            return None if free is None else np.ones(shape, dtype=bool)
        checks.unchecked_positions = everything
    elif name == "plain_key_nan:none":
        checks.plain_key_nan = _noop_like(checks.plain_key_nan)
    elif name == "plain_key_nan:all":
        def anywhere(ctx, name_, policy=None):
            return name_ == "dq" and policy != ("masked_key_nan", "propagates")
        checks.plain_key_nan = anywhere
    elif name == "spec_cache.read":
        spec_cache.read = _noop_like(spec_cache.read)
    elif name == "spec_cache.write":
        spec_cache.write = _noop_like(spec_cache.write)
    elif name == "spec_cache.file_key:no-bytes":
        original_key = spec_cache.file_key
        spec_cache.file_key = lambda data, schema, dtypes: original_key(b"", schema, dtypes)
    elif name == "expected.find":
        expected.ExpectedFailures.find = _noop_like(expected.ExpectedFailures.find)
    elif name == "expected.find_by_message":
        expected.ExpectedFailures.find_by_message = _noop_like(
            expected.ExpectedFailures.find_by_message)
    elif name == "expected.message-ignored":
        def by_any_message(self, test_id, op, dtype, failure):
            for entry in self.entries:
                if entry.message and entry.matches(test_id, op, dtype):
                    entry.used += 1
                    return entry
            return None
        expected.ExpectedFailures.find_by_message = by_any_message
    elif name in ("expected.ops-ignored", "expected.dtypes-ignored"):
        ignored = name.split(".")[1].split("-")[0]

        def matches(self, test_id, op, dtype):
            return (expected._pattern(self.match).fullmatch(test_id) is not None
                    and (ignored == "ops" or not self.ops or op in self.ops)
                    and (ignored == "dtypes" or not self.dtypes or dtype in self.dtypes))
        expected.Entry.matches = matches
    elif name == "expected.strict-ignored":
        original_entry = expected._entry

        def strict_entry(raw, path):
            entry = original_entry(raw, path)
            entry.strict = True
            return entry
        expected._entry = strict_entry
    else:
        raise KeyError(f"no mutant {name!r}")


def apply_from_environment() -> None:
    """Called by the injected sitecustomize: apply $ATTENTION_CONFORMANCE_MUTANT."""
    name = os.environ.get(ENV)
    if not name:
        return
    try:
        _apply(name)
    except Exception as exc:    # a checker renamed: say so, and never count it as pinned
        sys.stderr.write(f"mutate_checkers: mutant {name!r} could not be applied: "
                         f"{type(exc).__name__}: {exc}\n")
        sys.stderr.flush()
        os._exit(NOT_APPLIED)
    log = os.environ.get(APPLIED_LOG)
    if log:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()} {name}\n")


SITECUSTOMIZE = f"""\
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
import mutate_checkers
mutate_checkers.apply_from_environment()
sys.path.remove({str(Path(__file__).resolve().parent)!r})
"""


# --- running ----------------------------------------------------------------------------

#: a failed test's node id (a parametrized id may hold spaces, never ']')
_FAILED = re.compile(r"^(?:FAILED|ERROR) ([^\[\s]+(?:\[[^\]]*\])?)", re.MULTILINE)


@dataclass
class Outcome:
    mutant: Mutant | None
    returncode: int
    failed: list
    seconds: float
    applied: bool
    output: str

    @property
    def pinned(self) -> bool:
        return self.applied and self.returncode == 1 and bool(self.failed)


def run_tests(mutant: Mutant | None, files, folder: Path, python: str,
              first_failure: bool = False) -> Outcome:
    env = dict(os.environ)
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    env["PYTHONPATH"] = os.pathsep.join([str(folder)] + ([env["PYTHONPATH"]]
                                                         if env.get("PYTHONPATH") else []))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["ATTENTION_CONFORMANCE_CACHE"] = str(folder / "cache")   # never the user's cache
    log = folder / f"applied-{mutant.name if mutant else 'baseline'}.log".replace(":", "_")
    env[APPLIED_LOG] = str(log)
    if mutant:
        env[ENV] = mutant.name
    else:
        env.pop(ENV, None)
    start = time.perf_counter()
    done = subprocess.run(
        [python, "-m", "pytest", *files, "-q", "-rfE", "-p", "no:cacheprovider",
         "-p", "no:xdist", "-p", "no:randomly", "-p", "no:hypothesispytest", "-W", "ignore",
         *(["-x"] if first_failure and mutant else [])],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    applied = mutant is None or (done.returncode != NOT_APPLIED and log.exists()
                                 and mutant.name in log.read_text())
    failed = sorted(set(_FAILED.findall(done.stdout)))
    return Outcome(mutant, done.returncode, failed, seconds, applied,
                   done.stdout[-4000:] + done.stderr[-2000:])


def _short(test: str) -> str:
    return test.replace("tests/", "").replace(".py::", "::")


def table(outcomes) -> str:
    lines = ["| checker | mutant | tests that failed | pinned |", "|---|---|---|---|"]
    for o in outcomes:
        shown = ", ".join(f"`{_short(t)}`" for t in o.failed[:3])
        more = f" and {len(o.failed) - 3} more" if len(o.failed) > 3 else ""
        failed = f"{len(o.failed)}: {shown}{more}" if o.failed else "none"
        if not o.applied:
            failed = "mutant could not be applied"
        lines.append(f"| `{o.mutant.name}` | {o.mutant.what} | {failed} | "
                     f"{'yes' if o.pinned else '**no**'} |")
    return "\n".join(lines)


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def doc_section(outcomes, seconds, cpu, workers) -> str:
    files = sorted({f for o in outcomes for f in o.mutant.tests})
    return (f"{HEADING}\n\n"
            "A checker that passes everything would let every backend through, so each one "
            "is pinned by a test that fails without it. `python scripts/mutate_checkers.py` "
            "replaces each checker in turn with a no-op (every property and statistic of the "
            "registries, by name, so a new one is mutated too), runs the test files that pin "
            f"it ({', '.join(f'`{f}`' for f in files)}) in a fresh pytest process, and "
            "requires at least one failure; it exits non-zero if a mutant survives. "
            "`tests/meta/test_mutation.py` runs it in the suite on a representative subset, each "
            "mutant's run stopped at its first failure (`--first-failure`). When you add a "
            "checker, add a scenario to `SCENARIOS` in `tests/meta/test_checkers.py` (a right "
            "output that passes, a wrong one and the message it must fail with) and, for a "
            "checker outside the registries, a mutant to the script.\n\n"
            f"{table(outcomes)}\n\n"
            f"{len(outcomes)} mutants, {sum(o.pinned for o in outcomes)} pinned; "
            f"{seconds:.0f} s with {workers} parallel runs, {cpu:.0f} s of CPU (baseline "
            "included), on a 2-core machine.\n")


def write_doc(path: Path, section: str) -> None:
    """Replace the section under HEADING (to the next '## ' heading), or add it."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    pattern = re.compile(rf"^{re.escape(HEADING)}\n.*?(?=^## |\Z)", re.MULTILINE | re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + ("\n" if not section.endswith("\n\n") else ""),
                           text, count=1)
        text = text.rstrip("\n") + "\n"
    else:
        text = (text.rstrip("\n") + "\n\n" if text.strip() else "") + section
    path.write_text(text, encoding="utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[],
                        help="run the mutants whose name starts with this (repeatable)")
    parser.add_argument("--workers", type=int, default=max(2, os.cpu_count() or 2))
    parser.add_argument("--write-doc", type=Path, help=f"write the table under '{HEADING}'")
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--tests", nargs="+", metavar="FILE",
                        help="run these test files for every mutant instead of its own "
                             "(to see which files pin what; the suite checks with it that "
                             "a surviving mutant fails the script)")
    parser.add_argument("--first-failure", action="store_true",
                        help="stop each mutant's run at its first failing test (enough to "
                             "show it pinned; the table then names that test alone)")
    parser.add_argument("--no-baseline", dest="baseline", action="store_false",
                        help="skip the unmutated run of the files (the caller runs them "
                             "unmutated itself, as the suite does)")
    args = parser.parse_args(argv)

    if args.write_doc and (args.only or args.tests or not args.baseline or args.first_failure):
        parser.error("--write-doc writes the table of every mutant, baseline included: "
                     "not with --only, --tests, --no-baseline or --first-failure")
    chosen = [m for m in mutants() if not args.only or any(m.name.startswith(p) for p in args.only)]
    if args.tests:
        chosen = [Mutant(m.name, m.what, tuple(args.tests)) for m in chosen]
    if args.list:
        for m in chosen:
            print(f"{m.name}\t{m.what}\t{' '.join(m.tests)}")
        return 0
    if not chosen:
        print(f"no mutant starts with {args.only}", file=sys.stderr)
        return 2
    start, cpu_start = time.perf_counter(), _child_cpu()
    with tempfile.TemporaryDirectory(prefix="mutate-checkers-") as tmp:
        folder = Path(tmp)
        (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
        files = sorted({f for m in chosen for f in m.tests})
        baseline = run_tests(None, files, folder, args.python) if args.baseline else None
        if baseline is not None and baseline.returncode != 0:
            print(f"the unmutated tests fail (exit {baseline.returncode}); nothing can be "
                  f"concluded:\n{baseline.output}", file=sys.stderr)
            return 2
        with ThreadPoolExecutor(args.workers) as pool:
            outcomes = list(pool.map(lambda m: run_tests(m, m.tests, folder, args.python,
                                                         args.first_failure), chosen))
    seconds, cpu = time.perf_counter() - start, _child_cpu() - cpu_start
    print(table(outcomes))
    pinned = sum(o.pinned for o in outcomes)
    before = f"baseline {baseline.seconds:.1f} s" if baseline else "no baseline run"
    print(f"\n{len(outcomes)} mutants, {pinned} pinned; {before}; "
          f"{seconds:.0f} s in all with {args.workers} parallel runs, {cpu:.0f} s of CPU")
    for o in outcomes:
        if not o.pinned:
            print(f"\n--- {o.mutant.name}: exit {o.returncode}, "
                  f"{'applied' if o.applied else 'NOT applied'}\n{o.output}", file=sys.stderr)
    if args.write_doc:
        write_doc(args.write_doc, doc_section(outcomes, seconds, cpu, args.workers))
    if not all(o.applied for o in outcomes):
        return 2
    return 0 if pinned == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
