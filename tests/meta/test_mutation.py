"""The mutation check of every checker (scripts/mutate_checkers.py), in the suite.

The suite runs a representative subset of the mutants, one of each kind (a property, a
statistic, the exact, golden and policy checkers, the comparison, the spec cache and the
expected-failure matcher), one test each so that xdist spreads them, without the script's
unmutated baseline run (the suite runs those files unmutated itself, in the same
session): the whole list takes about 40 s of CPU on two cores, and its
table is in docs/contributing.md, which test_the_table_lists_every_mutant_as_pinned keeps
current. Run the whole with `python scripts/mutate_checkers.py`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "mutate_checkers.py"
DOC = ROOT / "docs" / "contributing.md"

SUBSET = ("property:causal_future_independent", "statistic:rms", "check_exact",
          "check_golden", "policy_outcome:any-choice", "worst_error:no-patterns",
          "spec_cache.read", "expected.ops-ignored")

sys.path.insert(0, str(SCRIPT.parent))
import mutate_checkers  # noqa: E402

sys.path.remove(str(SCRIPT.parent))


def script(*args, env=None, timeout=900):
    full_env = dict(os.environ, **(env or {}))
    full_env.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def rows(table: str) -> dict:
    """mutant name -> pinned column of a table the script printed."""
    return {m[1]: m[2] for m in re.finditer(r"^\| `([^`]+)` \|.*\| (yes|\*\*no\*\*) \|$",
                                            table, re.MULTILINE)}


def test_the_representative_mutants_exist():
    names = {m.name for m in mutate_checkers.mutants()}
    assert set(SUBSET) <= names, sorted(set(SUBSET) - names)


@pytest.mark.parametrize("name", SUBSET)
def test_representative_mutant_is_pinned(name):
    done = script(f"--only={name}", "--workers", "1", "--no-baseline", "--first-failure")
    found = rows(done.stdout)
    assert found.get(name) == "yes", done.stdout + done.stderr
    # --first-failure: the run stopped at the first test that failed
    assert re.search(rf"^\| `{re.escape(name)}` \| [^|]+ \| 1: `", done.stdout, re.MULTILINE), \
        done.stdout
    assert "no baseline run" in done.stdout, done.stdout
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_mutant_that_no_test_pins_fails_the_script():
    """The script can fail: check_exact against tests that never call it survives."""
    done = script("--only=check_exact", "--tests", "tests/interface/test_op_policy.py")
    assert rows(done.stdout) == {"check_exact": "**no**"}, done.stdout + done.stderr
    assert done.returncode == 1, done.stdout + done.stderr
    assert "check_exact: exit 0, applied" in done.stderr


def test_a_mutant_that_cannot_be_applied_is_an_error_not_a_pass():
    done = subprocess.run(
        [sys.executable, "-c", "import mutate_checkers; mutate_checkers.apply_from_environment()"],
        cwd=SCRIPT.parent, env=dict(os.environ, **{mutate_checkers.ENV: "property:no_such"}),
        capture_output=True, text=True, timeout=120)
    assert done.returncode == mutate_checkers.NOT_APPLIED, done.stderr
    assert "mutant 'property:no_such' could not be applied" in done.stderr


def test_every_property_and_statistic_has_a_mutant():
    from attention_conformance.checking.properties import PROPERTIES
    from attention_conformance.checking.statistics import STATISTICS

    names = {m.name for m in mutate_checkers.mutants()}
    assert {f"property:{p}" for p in PROPERTIES} <= names
    assert {f"statistic:{s}" for s in STATISTICS} <= names


def test_the_table_lists_every_mutant_as_pinned():
    text = DOC.read_text(encoding="utf-8")
    assert mutate_checkers.HEADING in text
    section = text.split(mutate_checkers.HEADING, 1)[1].split("\n## ", 1)[0]
    found = rows(section)
    names = [m.name for m in mutate_checkers.mutants()]
    missing = [n for n in names if n not in found]
    assert not missing, (f"{DOC.name} lacks {missing}: run python scripts/mutate_checkers.py "
                         f"--write-doc docs/contributing.md")
    assert all(found[n] == "yes" for n in names), {n: found[n] for n in names if found[n] != "yes"}
