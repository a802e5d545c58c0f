"""Expected failures: a listed finding is xfail, a stale entry warns, a fixed one fails.

Expected-failure entries with their filters: `ops`, `dtypes`, `message` and
`strict: false`, each where it applies and where it must not.

The first half asks the matcher (expected.py) directly; the second certifies a planted
bug on a small spec with one file of entries and checks the outcome of every test.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _cli_support import make_spec
from attention_conformance.golden import store as golden_store
from attention_conformance.specs.expected import load_expected

ROOT = Path(__file__).resolve().parents[2]
CASE = "worked_examples/wo-shi-xiao-gou-first-output-is-v0"

ADAPTER = '''
from attention_conformance.backends.numpy import NumpyBackend


class SkipsScale(NumpyBackend):
    """A planted finding: scales by 1/d_k whatever scale it is given."""
    name = "skips-scale"

    def sdpa(self, q, k, v, **kw):
        kw["scale"] = 1.0 / q.shape[-1]
        return super().sdpa(q, k, v, **kw)
'''


def small_spec(tmp_path):
    """A spec of the worked examples alone, so that a whole run (no -k) stays quick."""
    spec = tmp_path / "spec"
    (spec / "cases").mkdir(parents=True)
    (spec / "golden").mkdir()
    for name in ("schema.json", "tolerances.yaml", "cases/worked_examples.yaml",
                 "golden/worked_examples.npz"):
        shutil.copy(ROOT / "spec" / name, spec / name)
    golden_store.write_manifest(spec / "golden")
    return spec / "cases"


def run(tmp_path, entries, case=CASE, extra=(), select=True):
    """Certify the planted finding on a spec of the worked examples alone (a fresh
    pytest process, as a user runs it)."""
    (tmp_path / "adapter.py").write_text(ADAPTER)
    (tmp_path / "expected.yaml").write_text("backend: skips-scale\nentries:\n" +
                                            textwrap.indent(entries, "  "))
    cases = small_spec(tmp_path)
    cmd = [sys.executable, "-m", "pytest", str(cases), "--spec-dir", str(cases),
           "-p", "no:cacheprovider", "--backend", f"{tmp_path / 'adapter.py'}:SkipsScale",
           "--expected-failures", str(tmp_path / "expected.yaml"), "-rA", "-W", "always",
           *extra] + (["-k", case.split("/")[1]] if select else [])
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_listed_finding_is_an_expected_failure_with_its_reason(tmp_path):
    done = run(tmp_path, f'- match: "{CASE}[*]"\n  reason: "planted: scale 1/d_k"\n')
    assert done.returncode == 0, done.stdout[-3000:]
    assert "4 xfailed" in done.stdout
    assert "planted: scale 1/d_k" in done.stdout


def test_entry_matching_nothing_warns_on_a_whole_run(tmp_path):
    done = run(tmp_path, f'- match: "{CASE}[*]"\n  reason: "planted"\n'
                         '- match: "no-such-topic/no-such-case[*]"\n  reason: "stale"\n',
               select=False)
    assert "no-such-topic/no-such-case[*]" in done.stdout and "matches no test" in done.stdout


def test_listed_case_that_passes_fails_the_run(tmp_path):
    passing = "worked_examples/score-dot"
    done = run(tmp_path, f'- match: "{passing}[*]"\n  reason: "no longer true"\n', case=passing)
    assert done.returncode == 1
    assert "XPASS(strict)" in done.stdout


ENTRIES = """\
backend: anything
entries:
  - match: "masks/*"
    ops: [sdpa, sdpa_vjp]
    reason: "ops entry"
  - match: "causal/*"
    dtypes: [float16]
    reason: "dtypes entry"
  - match: "precision/*"
    message: "worst abs error"
    reason: "message entry"
  - match: "heads/heads-mha-*[*]"
    strict: false
    reason: "non-strict entry"
  - match: "policies/*"
    ops: [sdpa]
    dtypes: [float64, float32]
    message: "NaN pattern"
    strict: false
    reason: "every filter at once"
"""


@pytest.fixture
def entries(tmp_path):
    path = tmp_path / "expected.yaml"
    path.write_text(ENTRIES)
    return load_expected(path)


def reason(entry):
    return entry.reason if entry is not None else None


def test_ops_filter(entries):
    assert reason(entries.find("masks/masks-bool[float32]", "sdpa", "float32")) == "ops entry"
    assert reason(entries.find("masks/masks-bool[float32]", "sdpa_vjp", "float32")) == "ops entry"
    assert entries.find("masks/masks-bool[float32]", "attention_weights", "float32") is None
    assert entries.find("causal/masks-bool[float32]", "sdpa", "float32") is None


def test_dtypes_filter(entries):
    assert reason(entries.find("causal/causal-square[L4-float16]", "sdpa", "float16")) \
        == "dtypes entry"
    for dtype in ("float64", "float32", "bfloat16"):
        assert entries.find(f"causal/causal-square[L4-{dtype}]", "sdpa", dtype) is None, dtype


def test_message_entry_is_judged_after_the_run_on_its_message(entries):
    test_id = "precision/precision-softmax-spread[float16]"
    # before the run a message entry marks nothing (the test is run, not xfailed)
    assert entries.find(test_id, "softmax", "float16") is None
    failure = "golden out: worst abs error 0.1 at [0, 1] (got 0.2, expected 0.1)"
    assert reason(entries.find_by_message(test_id, "softmax", "float16", failure)) \
        == "message entry"
    assert entries.find_by_message(test_id, "softmax", "float16",
                                   "exact [0]: got 0.5, expected exactly 1") is None
    assert entries.find_by_message("masks/x[float16]", "softmax", "float16", failure) is None


def test_strict_is_the_default_and_false_is_kept(entries):
    by_reason = {e.reason: e for e in entries.entries}
    assert by_reason["non-strict entry"].strict is False
    assert by_reason["every filter at once"].strict is False
    assert all(by_reason[r].strict for r in ("ops entry", "dtypes entry", "message entry"))
    assert reason(entries.find("heads/heads-mha-gqa[H4-float32]", "multi_head_attention",
                               "float32")) == "non-strict entry"
    assert entries.find("heads/heads-gqa[H4-float32]", "multi_head_attention", "float32") is None


def test_every_filter_at_once(entries):
    failure = "golden out: NaN pattern differs at [1, 0] (got 0, expected nan)"
    hit = "policies/policies-empty-row[float32]"
    assert reason(entries.find_by_message(hit, "sdpa", "float32", failure)) \
        == "every filter at once"
    for test_id, op, dtype, text in (
            (hit, "sdpa_vjp", "float32", failure),                      # another op
            ("policies/policies-empty-row[float16]", "sdpa", "float16", failure),   # dtype
            (hit, "sdpa", "float32", "golden out: worst abs error 1"),  # another message
            ("masks/policies-empty-row[float32]", "sdpa", "float32", failure)):     # id
        assert entries.find_by_message(test_id, op, dtype, text) is None, (test_id, op, dtype, text)


def test_match_is_a_whole_id_with_literal_brackets(entries, tmp_path):
    path = tmp_path / "literal.yaml"
    path.write_text('entries:\n  - match: "t/a[float32]"\n    reason: "literal"\n')
    literal = load_expected(path)
    assert reason(literal.find("t/a[float32]", "sdpa", "float32")) == "literal"
    for other in ("t/a[float32]x", "xt/a[float32]", "t/af", "t/a[float16]"):
        assert literal.find(other, "sdpa", "float32") is None, other


def test_the_first_matching_entry_applies_and_star_crosses_every_character(tmp_path):
    path = tmp_path / "order.yaml"
    path.write_text('entries:\n'
                    '  - {match: "t/a[*", message: "boom", reason: "message first"}\n'
                    '  - {match: "t/*", reason: "broad first"}\n'
                    '  - {match: "t/a[float32]", reason: "specific second"}\n'
                    '  - {match: "u/a?b", reason: "question mark"}\n')
    found = load_expected(path)
    # before the run only entries without a message count; the first of them wins
    assert reason(found.find("t/a[float32]", "sdpa", "float32")) == "broad first"
    assert reason(found.find_by_message("t/a[float32]", "sdpa", "float32", "a boom here")) \
        == "message first"
    assert found.find_by_message("t/a[float32]", "sdpa", "float32", "other") is None
    assert reason(found.find("u/a?b", "sdpa", "float32")) == "question mark"
    assert found.find("u/axb", "sdpa", "float32") is None          # '?' is literal too


def test_a_relative_path_is_taken_from_the_working_directory(tmp_path, monkeypatch):
    from attention_conformance.specs.expected import expected_for

    (tmp_path / "own.yaml").write_text('entries:\n  - {match: "*", reason: "own file"}\n')
    (tmp_path / "extra.yaml").write_text('entries:\n  - {match: "x/*", reason: "extra"}\n')

    class Adapter:
        name = "own"
        expected_failures_file = "own.yaml"

    monkeypatch.chdir(tmp_path)
    merged = expected_for(Adapter(), ["extra.yaml"])
    assert [e.reason for e in merged.entries] == ["own file", "extra"]   # own file first


def test_an_unknown_key_or_a_missing_reason_is_refused(tmp_path):
    from attention_conformance.specs.yaml_reader import SpecError

    for text, words in (('entries:\n  - {match: "*", reason: "r", op: [sdpa]}\n', "unknown key(s) op"),
                        ('entries:\n  - {match: "*", reason: ""}\n', "non-empty 'reason'"),
                        ('colour: red\nentries: []\n', "bad.yaml:1: unknown key(s) colour")):
        path = tmp_path / "bad.yaml"
        path.write_text(text)
        with pytest.raises(SpecError, match=re.escape(words)):
            load_expected(path)
    with pytest.raises(SpecError, match="nosuch.yaml: cannot read this expected-failures file"):
        load_expected(tmp_path / "nosuch.yaml")


@pytest.mark.parametrize("text, words", [
    (None, ": cannot read this expected-failures file: No such file or directory"),
    ("entries: [oops\n", ":2: invalid YAML"),
    ("entries:\n  - {match: x, reason: y, colour: red}\n", ":2: unknown key(s) colour")])
@pytest.mark.parametrize("whose", ["given", "own"])
def test_a_bad_expected_failures_file_is_one_usage_error(tmp_path, text, words, whose):
    """Never an INTERNALERROR: a file given with --expected-failures, or an adapter's own,
    that cannot be read is one line naming it, its line and the problem; no test runs."""
    path = tmp_path / ("nosuch.yaml" if text is None else "expected.yaml")
    if text is not None:
        path.write_text(text)
    own = f"    expected_failures_file = {str(path)!r}\n" if whose == "own" else ""
    (tmp_path / "adapter.py").write_text(ADAPTER + own)
    given = ["--expected-failures", str(path)] if whose == "given" else []
    cases = small_spec(tmp_path)
    done = subprocess.run([sys.executable, "-m", "pytest", str(cases), "--spec-dir", str(cases),
                           "-p", "no:cacheprovider", "--backend",
                           f"{tmp_path / 'adapter.py'}:SkipsScale", *given],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith(f"ERROR: expected failures: {path}{words}"), \
        done.stderr
    assert "INTERNALERROR" not in done.stdout + done.stderr and " passed" not in done.stdout


# --- a whole run ------------------------------------------------------------------------

INFLATES_ADAPTER = '''
import numpy as np

from attention_conformance.backends.numpy import NumpyBackend


class Inflates(NumpyBackend):
    """A planted bug: softmax and sdpa outputs come back 1.5 times too large."""
    name = "inflates"

    def softmax(self, x, **kw):
        return (super().softmax(x, **kw) * 1.5).astype(x.dtype)

    def sdpa(self, q, k, v, **kw):
        return (super().sdpa(q, k, v, **kw) * 1.5).astype(q.dtype)
'''

RUN_ENTRIES = """\
backend: inflates
entries:
  - match: "tiny/*"
    ops: [softmax]
    reason: "ops: softmax only"
  - match: "tiny/tiny-sdpa-default-scale[*]"
    dtypes: [float64]
    reason: "dtypes: float64 only"
  - match: "tiny/tiny-sdpa-default-scale[*bfloat16]"
    strict: false
    reason: "not strict, and failing"
  - match: "tiny/tiny-empty-row[*]"
    message: "golden out under fully_masked_rows=zeros"
    reason: "message that the failure carries"
  - match: "tiny/tiny-sdpa-default-scale[*float32]"
    message: "text that no failure carries"
    reason: "message that the failure lacks"
  - match: "tiny/tiny-weights-causal[*]"
    strict: false
    reason: "not strict, and passing"
  - match: "tiny/tiny-self-attention[float64]"
    reason: "strict, and passing"
"""

SDPA = "tiny/tiny-sdpa-default-scale"

#: the outcome of every test of the run, from the entries above
OUTCOMES = {
    **{f"tiny/tiny-softmax[{d}]": "XFAIL" for d in ("float64", "float32", "float16", "bfloat16")},
    **{f"{SDPA}[{v}-float64]": "XFAIL" for v in ("L3-D4", "L5-D8")},
    **{f"{SDPA}[{v}-bfloat16]": "XFAIL" for v in ("L3-D4", "L5-D8")},
    **{f"{SDPA}[{v}-{d}]": "FAILED" for v in ("L3-D4", "L5-D8") for d in ("float32", "float16")},
    **{f"tiny/tiny-empty-row[{d}]": "XFAIL" for d in ("float64", "float32")},
    **{f"tiny/tiny-weights-causal[{d}]": "XPASS" for d in ("float64", "float32")},
    "tiny/tiny-self-attention[float64]": "FAILED",      # XPASS(strict) fails the run
    "tiny/tiny-self-attention[float32]": "PASSED",
}

_LINE = re.compile(r"^(PASSED|FAILED|XFAIL|XPASS|SKIPPED|ERROR) \S*?tiny\.yaml::(\S+)")


@pytest.fixture(scope="module")
def entries_run(tmp_path_factory):
    """Certify the planted bug on the small spec of tests/_cli_support.py."""
    tmp = tmp_path_factory.mktemp("entries")
    cases = make_spec(tmp)
    (tmp / "adapter.py").write_text(INFLATES_ADAPTER)
    (tmp / "expected.yaml").write_text(RUN_ENTRIES)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(cases), "--spec-dir", str(cases),
         "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:randomly", "-rA",
         "--backend", f"{tmp / 'adapter.py'}:Inflates",
         "--expected-failures", str(tmp / "expected.yaml")],
        capture_output=True, text=True, cwd=tmp, timeout=300)
    outcomes = {}
    for line in done.stdout.splitlines():
        found = _LINE.match(line)
        if found:
            outcomes[f"tiny/{found[2]}"] = found[1]
    return done, outcomes


def test_each_entry_applies_where_it_should_and_nowhere_else(entries_run):
    done, outcomes = entries_run
    assert outcomes, done.stdout[-3000:] + done.stderr[-3000:]
    wrong = {t: (outcomes.get(t), want) for t, want in OUTCOMES.items() if outcomes.get(t) != want}
    assert not wrong, "test: (outcome, expected): " + repr(wrong) + "\n" + done.stdout[-3000:]
    assert set(outcomes) == set(OUTCOMES), sorted(set(outcomes) ^ set(OUTCOMES))
    assert done.returncode == 1    # the unlisted failures and the strict XPASS


def test_the_reasons_are_reported(entries_run):
    done, _ = entries_run
    for reason in ("ops: softmax only", "dtypes: float64 only", "not strict, and failing",
                   "message that the failure carries"):
        assert reason in done.stdout, reason
    assert "XPASS(strict)" in done.stdout and "strict, and passing" in done.stdout
