"""Certification reports (JSON and Markdown) and the matrix of backends."""

from __future__ import annotations

import errno
import json
import re

import numpy as np
import pytest

from _cli_support import ROOT, adapter, cli, make_spec, run
from attention_conformance.backend.interface import Declaration, describe
from attention_conformance.golden.store import write_manifest, write_npz
from attention_conformance.model import files
from attention_conformance.model.files import FileRefused, folder_problem, write_file
from attention_conformance.model.policies import POLICIES
from attention_conformance.reports.markdown import report_problem
from attention_conformance.reports.results import FORMAT, spec_hash

EXPECTED = """\
backend: bad-scale
entries:
  - match: "tiny/tiny-sdpa-default-scale[*]"
    reason: "the default scale is 1/d_k (kept as a finding)"
  - match: "tiny/tiny-softmax[float64]"
    reason: "a stale entry: this test passes"
"""


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Reports of three backends on the tiny spec: all pass; partial; failing but expected."""
    root = tmp_path_factory.mktemp("reports")
    cases = make_spec(root)
    out = root / "reports"
    (root / "expected.yaml").write_text(EXPECTED)
    runs = {
        "numpy": cli("--spec-dir", cases, "certify", "numpy", "--report", out, "-q",
                     "-p", "no:cacheprovider"),
        "partial": cli("--spec-dir", cases, "certify", adapter("Float32Only"), "--report", out,
                       "-q", "-p", "no:cacheprovider"),
        "bad-scale": cli("--spec-dir", cases, "certify", adapter("WrongDefaultScale"),
                         "--report", out, "--expected-failures", root / "expected.yaml", "-q",
                         "-p", "no:cacheprovider"),
    }
    return cases, out, runs


def _load(out, name):
    return json.loads((out / f"{name}.json").read_text())


def test_a_passing_backend_report(reports):
    cases, out, runs = reports
    assert runs["numpy"].returncode == 0, runs["numpy"].stdout
    data = _load(out, "numpy")
    assert data["format"] == FORMAT
    assert data["backend"]["name"] == "numpy"
    assert data["totals"] == {"pass": 18}
    assert data["by_topic"] == {"tiny": {"pass": 18}}
    assert data["by_dtype"]["float16"] == {"pass": 3}
    assert data["by_topic_dtype"]["tiny"]["float64"] == {"pass": 6}
    assert {"python", "suite", "numpy"} <= set(data["versions"])
    assert data["spec_hash"] == spec_hash(cases.parent)
    assert data["cases"] == 5 and data["spec_errors"] == 0 and data["spec_problems"] == []
    assert set(data["policies"]) == set(POLICIES)
    assert data["policies"]["fully_masked_rows"]["choice"] == "zeros"
    assert data["selection"]["profile"] == "quick"
    worst = data["worst_error_over_tolerance"]
    assert set(worst) == {"float64", "float32", "float16", "bfloat16"}
    assert all(0 <= r <= 1 for r in worst.values()) and worst["float32"] > 0
    assert data["worst_test_by_dtype"]["float32"].endswith("-float32]") or \
        data["worst_test_by_dtype"]["float32"].endswith("[float32]")
    assert len(data["results"]) == 18
    assert "worst error / tolerance: bfloat16" in runs["numpy"].stdout


def _report_table() -> dict[str, str]:
    """docs/cli.md's table of a report's JSON: each key a row names -> the row's content."""
    page = (ROOT / "docs" / "cli.md").read_text()
    table = page.split('The JSON (`"format"')[1].split("\n\n")[1]
    rows = {}
    for line in table.splitlines()[2:]:
        keys, content = line.strip("|").split(" | ", 1)
        rows.update(dict.fromkeys(re.findall(r"`([^`]+)`", keys), content))
    return rows


def _declaring_everything() -> Declaration:
    """A declaration with every optional part: describe() puts each in the report."""
    return Declaration(name="all", dtypes=frozenset({"float32"}),
                       policy={"fully_masked_rows": "zeros"},
                       op_policy={"sdpa": {"fully_masked_rows": "nan"}},
                       policy_when=({"when": {"bias": True},
                                     "policy": {"fully_masked_rows": "nan"}},),
                       dtype_notes={"float16": "no float16 kernel"},
                       invariants=("deterministic",), distributed="spmd")


def test_docs_name_every_key_of_the_report(reports):
    """docs/cli.md's table of the JSON names every top-level key of a real report, and its
    `backend` row every key a declaration can put there (format, profile_cases,
    backend.policy_when and three more were missing)."""
    _, out, _ = reports
    data, rows = _load(out, "numpy"), _report_table()
    assert set(data) - set(rows) == set()
    named = set(re.findall(r"`([^`]+)`", rows["backend"]))
    assert (set(data["backend"]) | set(describe(_declaring_everything()))) - named == set()


def test_unsupported_is_reported_apart_from_failures(reports):
    _, out, runs = reports
    assert runs["partial"].returncode == 0
    data = _load(out, "partial")
    assert data["totals"] == {"pass": 10, "unsupported": 8}
    assert data["by_dtype"]["bfloat16"] == {"unsupported": 3}
    assert data["by_topic_dtype"]["tiny"]["float32"] == {"pass": 5, "unsupported": 1}
    md = (out / "partial.md").read_text()
    assert "- 3 tests: backend does not declare dtype float16" in md
    assert "- 2 tests: partial: no self_attention" in md


def test_expected_failures_and_stale_entries(reports):
    _, out, runs = reports
    assert runs["bad-scale"].returncode == 1          # the stale entry fails the run
    data = _load(out, "bad-scale")
    assert data["totals"] == {"pass": 9, "xfail": 8, "xpass": 1}
    statuses = {r["id"]: r["status"] for r in data["results"]}
    assert statuses["tiny/tiny-softmax[float64]"] == "xpass"
    assert statuses["tiny/tiny-sdpa-default-scale[L5-D8-bfloat16]"] == "xfail"
    xfail = next(r for r in data["results"] if r["status"] == "xfail")
    assert xfail["message"].startswith("the default scale is 1/d_k")
    md = (out / "bad-scale.md").read_text()
    assert "`tiny/tiny-softmax[float64]` (unexpected pass)" in md
    assert "(expected failure): the default scale is 1/d_k" in md


def test_an_unexpected_pass_names_the_stale_entry(reports):
    """The terminal says `[XPASS(strict)] REASON`: the report says which entry went
    stale, where it is and why it was there (its message and Markdown were empty)."""
    cases, out, runs = reports
    stale = next(r for r in _load(out, "bad-scale")["results"] if r["status"] == "xpass")
    entry_line = EXPECTED.splitlines().index('  - match: "tiny/tiny-softmax[float64]"') + 1
    where = f"{cases.parent.parent / 'expected.yaml'}:{entry_line}"
    assert stale["message"] == ("unexpected pass: the expected failure "
                                f"'tiny/tiny-softmax[float64]' ({where}) no longer fails; "
                                "its reason: a stale entry: this test passes"), stale
    md = (out / "bad-scale.md").read_text()
    block = md.split("### `tiny/tiny-softmax[float64]` (unexpected pass)\n\n```text\n")[1]
    assert block.split("\n```")[0] == stale["message"]
    assert "[XPASS(strict)] a stale entry: this test passes" in runs["bad-scale"].stdout



@pytest.mark.parametrize("backend, options", [
    ("WrongDefaultScale", ()), ("RaisingSoftmax", ()), ("RaisingSoftmax", ("--in-process",))])
def test_the_report_holds_every_line_the_terminal_leaves_out(backend, options, tmp_path):
    """At -q a failure prints its reason, its `test:` line and "(N more lines in the
    report ...)": the Markdown report holds those N + 2 lines, the JSON the message and
    the traceback (isolated, the backend's traceback is in the message; in-process, in
    `traceback`). N counted neither the `case:` nor the `op:` line."""
    cases = make_spec(tmp_path)
    run = cli("--spec-dir", cases, "certify", adapter(backend), "--report", tmp_path / "r",
              "-q", "-p", "no:cacheprovider", "-k", "default-scale or softmax",
              "--dtype", "float32", *options)
    assert run.returncode == 1, run.stdout + run.stderr
    more = re.search(r"\((\d+) more lines in the report", run.stdout)
    data = json.loads(next((tmp_path / "r").glob("*.json")).read_text())
    failure = next(r for r in data["results"] if r["status"] == "fail")
    lines = (failure["message"].rstrip() + "\n" + failure["traceback"]).strip().splitlines()
    assert len(lines) == (int(more.group(1)) if more else 0) + 2, (more, lines)
    md = next((tmp_path / "r").glob("*.md")).read_text()
    block = md.split(f"### `{failure['id']}` (fail)\n\n```text\n")[1].split("\n```")[0]
    assert block.splitlines() == lines
    if backend == "RaisingSoftmax":
        assert more and "in _kernel" in block
        assert ("in _kernel" in failure["traceback"]) == ("--in-process" in options)


def _terminal_failure(stdout: str, test_id: str) -> list[str]:
    """The lines pytest prints under a failure's `____ TEST-ID ____` heading."""
    heading = re.compile(r"_+ " + re.escape(test_id) + " _+")
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if heading.fullmatch(line)) + 1
    end = next(i for i in range(start, len(lines)) if not lines[i].strip()
               or lines[i].startswith(("____", "====")))
    return lines[start:end]


def test_the_report_holds_every_line_the_terminal_shows(tmp_path):
    """Without -q a failure prints its reason, then the test, the case with its file and
    line, the op with its inputs' shapes, then every other line: the JSON's message and
    the Markdown's block hold those very lines (they held the reason and the other lines,
    never the test, case and op)."""
    cases = make_spec(tmp_path)
    run = cli("--spec-dir", cases, "certify", adapter("WrongDefaultScale"), "--report",
              tmp_path / "r", "-p", "no:cacheprovider", "-k", "default-scale",
              "--dtype", "float32")
    assert run.returncode == 1, run.stdout + run.stderr
    data = json.loads(next((tmp_path / "r").glob("*.json")).read_text())
    failure = next(r for r in data["results"] if r["status"] == "fail")
    shown = _terminal_failure(run.stdout, failure["id"])
    assert [line.split(":")[0].strip() for line in shown[1:4]] == ["test", "case", "op"]
    assert "tiny.yaml:" in shown[2] and "inputs: q (" in shown[3], shown
    assert failure["message"].splitlines() == shown
    md = next((tmp_path / "r").glob("*.md")).read_text()
    block = md.split(f"### `{failure['id']}` (fail)\n\n```text\n")[1].split("\n```")[0]
    assert block.splitlines() == shown


def test_without_a_report_q_says_only_to_rerun_without_it(tmp_path):
    """With no --report there is no report to read the lines -q leaves out in: the hint
    said "(N more lines in the report, or rerun without -q)" all the same."""
    cases = make_spec(tmp_path)
    run = cli("--spec-dir", cases, "certify", adapter("RaisingSoftmax"), "-q",
              "-p", "no:cacheprovider", "-k", "softmax", "--dtype", "float32")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "in the report" not in run.stdout, run.stdout
    assert re.search(r"\(\d+ more lines left out: rerun without -q\)", run.stdout), run.stdout


def test_the_markdown_report_lists_each_backend_process_replaced(reports):
    """Each test that started a fresh backend process, and why (the JSON's `replaced`)."""
    from attention_conformance.reports.markdown import backend_markdown

    _, out, _ = reports
    data = _load(out, "numpy")
    assert "## Backend processes replaced" not in backend_markdown(data)
    first, second = data["results"][:2]
    first["replaced"] = "the last one ended"
    second["replaced"] = "it had grown by 130 MiB (--restart-above 100)"
    md = backend_markdown(data)
    assert "## Backend processes replaced" in md
    assert f"- `{first['id']}`: the last one ended" in md
    assert f"- `{second['id']}`: it had grown by 130 MiB (--restart-above 100)" in md


def test_markdown_report_sections(reports):
    _, out, _ = reports
    md = (out / "numpy.md").read_text()
    for heading in ("# Certification of backend `numpy`", "## Totals", "## By topic",
                    "## By dtype", "## Passed / run, per topic and dtype",
                    "## Worst error as a fraction of the tolerance", "## Declared policies"):
        assert heading in md
    assert "| tiny | 3/3 | 3/3 | 6/6 | 6/6 |" in md        # bfloat16 float16 float32 float64
    assert "| fully_masked_rows | zeros |" in md
    assert "Versions: python" in md and "numpy" in md


def test_matrix_puts_backends_side_by_side(reports, tmp_path, capsys):
    _, out, _ = reports
    (out / "unrelated.json").write_text("[1, 2, 3]")      # not a report: skipped
    result = run(capsys, "report", out)
    assert result.returncode == 0, result.stderr
    matrix = result.stdout
    assert "| topic | bad-scale | numpy | partial |" in matrix
    assert "| tiny | 17/18 (8 xfail) | 18/18 | 10/10, 8 unsupported |" in matrix
    assert "| fully_masked_rows | zeros | zeros | zeros |" in matrix
    written = (out / "matrix.md").read_text()
    assert re.search(r"\| tiny-softmax \| unexpected pass \| bad-scale \| tiny \| 1 of 4 \| "
                     r"unexpected pass: the expected failure 'tiny/tiny-softmax\[float64\]' "
                     r"\(\S+:5\) no longer fails; its reason: a stale entry: this test passes "
                     r"\| tiny/tiny-softmax\[float64\] \|", written), written
    assert "tiny-softmax" not in matrix          # the printed matrix counts them instead
    groups = written.count("\n| tiny-")
    assert f"tests in {groups} groups of backend, case and status" in matrix
    head = written.split("## Tests that do not pass, by case")[0]
    assert head == matrix.split("## Tests that do not pass, by case")[0]
    assert (out / "matrix.html").exists()
    elsewhere = run(capsys, "report", out, "--output", tmp_path / "m")
    assert (tmp_path / "m" / "matrix.html").exists() and elsewhere.returncode == 0
    empty = run(capsys, "report", tmp_path / "m")
    assert empty.returncode == 1 and "no backend reports" in empty.stderr


def test_reports_are_complete_under_xdist(tmp_path):
    pytest.importorskip("xdist")
    cases = make_spec(tmp_path)
    result = cli("--spec-dir", cases, "certify", "numpy", "--report", tmp_path / "r", "-n", "2",
                 "-q", "-p", "no:cacheprovider")
    assert result.returncode == 0, result.stdout
    assert _load(tmp_path / "r", "numpy")["totals"] == {"pass": 18}


# --- files the suite writes: never through a planted link ------------------------------

def _plant(links: dict, victim_folder) -> dict:
    """Each link -> a victim file of its own (the link's target); returns their texts."""
    victim_folder.mkdir(exist_ok=True)
    texts = {}
    for link in links:
        victim = victim_folder / f"victim-{link.name}"
        victim.write_text(f"precious {link.name}\n")
        link.symlink_to(victim)
        texts[victim] = victim.read_text()
    return texts


def _untouched(texts: dict, links) -> None:
    for victim, text in texts.items():
        assert victim.read_text() == text, f"{victim} was written through a link"
    for link in links:
        assert link.is_file() and not link.is_symlink(), f"{link} is still a link"


def test_certify_replaces_a_link_planted_at_a_report_file(tmp_path):
    cases, out = make_spec(tmp_path), tmp_path / "r"
    out.mkdir()
    links = [out / "numpy.json", out / "numpy.md"]
    texts = _plant(links, tmp_path / "elsewhere")
    result = cli("--spec-dir", cases, "certify", "numpy", "--report", out, "-q",
                 "-k", "tiny-softmax")
    assert result.returncode == 0, result.stdout + result.stderr
    _untouched(texts, links)
    assert _load(out, "numpy")["totals"] == {"pass": 4}


def test_report_replaces_a_link_planted_at_the_matrix(reports, tmp_path, capsys):
    _, out, _ = reports
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "numpy.json").write_bytes((out / "numpy.json").read_bytes())
    links = [copy / "matrix.html", copy / "matrix.md"]
    texts = _plant(links, tmp_path / "elsewhere")
    result = run(capsys, "report", copy)
    assert result.returncode == 0, result.stderr
    _untouched(texts, links)
    assert "<html" in (copy / "matrix.html").read_text()


def _unusable(tmp_path, kind):
    """A --report DIR the suite must refuse, and the words of its refusal."""
    (tmp_path / "a-file").write_text("not a folder\n")
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    return {"file": (tmp_path / "a-file", "exists and is not a folder"),
            "under_a_file": (tmp_path / "a-file" / "reports", "is not a folder"),
            "link": (tmp_path / "link", "is a symbolic link")}[kind]


UNUSABLE = ["file", "under_a_file", "link"]


@pytest.mark.parametrize("kind", UNUSABLE)
def test_certify_refuses_an_unusable_report_folder_before_the_run(tmp_path, kind):
    cases = make_spec(tmp_path)
    directory, words = _unusable(tmp_path, kind)
    result = cli("--spec-dir", cases, "certify", "numpy", "--report", directory, "-q")
    assert result.returncode == 4, result.stdout + result.stderr
    line = result.stderr.strip()
    assert line.startswith(f"ERROR: --report {directory}: ") and words in line, line
    assert "\n" not in line and "passed" not in result.stdout


@pytest.mark.parametrize("kind", UNUSABLE)
def test_the_plugin_refuses_an_unusable_report_folder_before_the_run(tmp_path, kind, pytester):
    cases = make_spec(tmp_path)
    directory, words = _unusable(tmp_path, kind)
    # refused at configure: Hypothesis' plugin, kept out, would never see its session start
    result = pytester.runpytest_inprocess(str(cases), "--backend", "numpy", "--spec-dir",
                                          str(cases), "--report", str(directory), "-q",
                                          "-p", "no:cacheprovider", "-p", "no:hypothesispytest")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.strip()]
    assert len(errors) == 1 and errors[0].startswith(f"ERROR: --report {directory}: "), errors
    assert words in errors[0] and "passed" not in result.stdout.str()


def test_a_spec_problem_is_named_in_the_summary_the_report_and_the_matrix(tmp_path, capsys):
    """A broken case file is the spec's problem, not the backend's: its file, line and
    message are printed at the end of the run, listed in the report, and the matrix's
    spec cell says the spec had problems (all green otherwise)."""
    cases = make_spec(tmp_path)
    (cases / "zz_broken.yaml").write_text("cases:\n  - id: x\n    op: sdpa\n"
                                          "    description: [oops\n")
    out = tmp_path / "reports"
    done = cli("--spec-dir", cases, "certify", "numpy", "--report", out, "-q", "-k", "not x")
    data = _load(out, "numpy")
    assert data["spec_errors"] == 1 and len(data["spec_problems"]) == 1
    assert data["spec_problems"][0].endswith(
        "zz_broken.yaml:5: case 'x': invalid YAML: did not find expected ',' or ']' (while "
        "parsing a flow sequence)"), data["spec_problems"]
    assert f"  spec problem (no test of it ran): {data['spec_problems'][0]}" in done.stdout
    page = (out / "numpy.md").read_text()
    assert "## Spec problems" in page and "zz\\_broken.yaml:5: case 'x': invalid YAML" in page
    assert run(capsys, "report", out).returncode == 0
    assert f"| {data['spec_hash']}, 1 spec problems |" in (out / "matrix.md").read_text()


def test_a_folder_where_nothing_can_be_made_is_refused_whatever_its_bits_say(tmp_path,
                                                                            monkeypatch):
    """A read-only file system, or root's view of /sys: before a run the folder is probed
    by making (and removing) an empty folder in it, not judged by its permission bits;
    before each file written (make_folder) no probe is made, the bits alone."""
    assert folder_problem(tmp_path / "reports", probe=True) is None
    assert not list(tmp_path.iterdir())

    def read_only(**kw):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(files.tempfile, "mkdtemp", read_only)
    assert folder_problem(tmp_path / "reports", probe=True) == \
        f"{tmp_path} is not writable (Read-only file system)"
    assert report_problem(tmp_path / "reports") == \
        f"--report {tmp_path / 'reports'}: {tmp_path} is not writable (Read-only file system)"
    assert folder_problem(tmp_path / "reports") is None      # no probe on the write path


FILLS_THE_REPORTS_PLACE = """
import os

from attention_conformance.backends.numpy import NumpyBackend


class FillsTheReportsPlace(NumpyBackend):
    \"\"\"Makes a file where the run's report folder is to be, once the run has begun.\"\"\"

    def softmax(self, x, **kw):
        folder = os.environ["REPORT_UNDER_TEST"]
        if not os.path.exists(folder):
            open(folder, "w").close()
        return super().softmax(x, **kw)
"""


def test_a_report_that_cannot_be_written_after_the_run_fails_the_run(tmp_path):
    """Refused before the run, a folder can still go (a disk full, a file made in its
    place): the run says NOT WRITTEN and exits 4, so that no CI passes without a report."""
    cases = make_spec(tmp_path)
    (tmp_path / "fills.py").write_text(FILLS_THE_REPORTS_PLACE)
    directory = tmp_path / "reports"
    result = cli("--spec-dir", cases, "certify", f"{tmp_path / 'fills.py'}:FillsTheReportsPlace",
                 "--report", directory, "-q", env={"REPORT_UNDER_TEST": str(directory)})
    assert result.returncode == 4, result.stdout + result.stderr
    assert f"report: NOT WRITTEN: {directory} exists and is not a folder" in result.stdout
    assert " passed" in result.stdout and directory.is_file()


#: the writers of the other files the suite makes, each -> the file it wrote
WRITERS = {
    "golden npz": lambda folder: write_npz(folder / "t.npz", {"a": np.zeros(2)}) or folder / "t.npz",
    "golden manifest": lambda folder: write_manifest(folder) or folder / "SHA256SUMS",
    "any file": lambda folder: write_file(folder / "f.txt", "text\n"),
}


@pytest.mark.parametrize("writer", WRITERS)
def test_every_writer_replaces_a_planted_link_and_refuses_a_linked_folder(tmp_path, writer):
    folder = tmp_path / "out"
    folder.mkdir()
    name = WRITERS[writer](tmp_path / "probe").name
    texts = _plant([folder / name], tmp_path / "elsewhere")
    assert WRITERS[writer](folder) == folder / name
    _untouched(texts, [folder / name])
    (tmp_path / "linked").symlink_to(folder)
    with pytest.raises(FileRefused, match="is a symbolic link"):
        WRITERS[writer](tmp_path / "linked")


def test_a_suite_error_is_recorded_as_an_error_never_as_the_backends_failure(
        tmp_path, pytester, monkeypatch):
    """A verdict of status "error" (the suite's own code failed on the case, as for an
    input too large to build) is "error" in the results log and the summary, and is shown
    as the suite's failure."""
    from attention_conformance.checking import verdict

    def suite_fails(*args, **kwargs):
        raise MemoryError("the inputs could not be built")

    monkeypatch.setattr(verdict, "run_case", suite_fails)
    cases, out = make_spec(tmp_path), tmp_path / "r"
    result = pytester.runpytest_inprocess(str(cases), "--backend", "numpy", "--spec-dir",
                                          str(cases), "--in-process", "--report", str(out),
                                          "-k", "tiny-softmax", "-q", "-p", "no:cacheprovider")
    data = _load(out, "numpy")
    assert data["totals"] == {"error": 4}, data["totals"]
    assert all(r["message"].startswith("suite error on case tiny-softmax (") for r in data["results"])
    result.stdout.fnmatch_lines(["*the suite failed on this case: SuiteError: suite error on case"
                                 " tiny-softmax*MemoryError: the inputs could not be built*",
                                 "*ERROR tiny/tiny-softmax[[]float64]: suite error on case*"])
    assert "FAIL tiny/" not in result.stdout.str()
