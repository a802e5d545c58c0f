"""The command line, as a user runs it: every command, its options, its exit status."""

from __future__ import annotations

import re
import shlex
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from _cli_support import ROOT, TINY, adapter, cli, make_spec, run
from attention_conformance.cli import build_parser, certify_argv, main, passthrough_problem


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_spec(tmp_path_factory.mktemp("tiny"))


def test_help_lists_every_command(capsys):
    result = run(capsys, "--help")
    assert result.returncode == 0
    for command in ("certify", "list", "validate", "golden", "export", "report", "fuzz",
                    "new-backend"):
        assert command in result.stdout


def test_list_groups_by_topic_and_filters(tiny, capsys):
    result = run(capsys, "--spec-dir", tiny, "list")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("tiny (5 cases)")
    assert re.search(r"tiny-sdpa-default-scale\s+sdpa\s+8 tests", result.stdout)
    assert "5 cases of the quick profile in 1 topics, 18 tests per backend" in result.stdout
    only = run(capsys, "--spec-dir", tiny, "list", "--op", "sdpa", "--ids")
    assert only.stdout.split() == ["tiny-sdpa-default-scale", "tiny-empty-row"]
    keyword = run(capsys, "list", "--spec-dir", tiny, "-k", "ONE-HOT", "--dtype", "float64")
    assert "tiny-weights-causal" in keyword.stdout and "tiny-softmax" not in keyword.stdout
    assert "1 cases of the quick profile in 1 topics, 1 tests per backend" in keyword.stdout


def test_list_validate_and_certify_count_alike(tiny, capsys, tmp_path):
    """The three commands give the same cases and tests, and name the profile they count."""
    listed = re.search(r"(\d+) cases of the quick profile in \d+ topics, (\d+) tests",
                       run(capsys, "--spec-dir", tiny, "list").stdout).groups()
    validated = re.search(r"quick profile (\d+) cases, (\d+) tests",
                          run(capsys, "--spec-dir", tiny, "validate").stdout).groups()
    certified = cli("--spec-dir", tiny, "certify", "numpy", "-q", "-p", "no:cacheprovider")
    summary = re.search(r"(\d+) cases of the quick profile \(of \d+\)", certified.stdout).groups()
    ran = re.search(r"(\d+) passed", certified.stdout).group(1)
    assert listed == validated == (summary[0], ran), (listed, validated, summary, ran)


def test_list_of_the_real_spec_names_the_worked_examples(capsys):
    result = run(capsys, "list", "--topic", "worked_examples", "--ids")
    assert result.returncode == 0
    assert "unnormalised-scores-softmax" in result.stdout.split()


def test_validate_reports_every_problem_at_once(tmp_path, capsys):
    cases = make_spec(tmp_path)
    assert run(capsys, "--spec-dir", cases, "validate").returncode == 0
    broken = TINY.replace("op: softmax", "op: softmaxx").replace("seed: 7", "seed: -7")
    (cases / "tiny.yaml").write_text(broken)
    result = run(capsys, "--spec-dir", cases, "validate")
    assert result.returncode == 1
    assert "'tiny-softmax'" in result.stdout and "'tiny-self-attention'" in result.stdout
    assert "3 valid cases" in result.stdout and "2 problems" in result.stdout


def test_golden_regenerate_shows_which_cases_changed_and_by_how_much(tmp_path, capsys):
    cases = make_spec(tmp_path)
    assert run(capsys, "--spec-dir", cases, "golden", "check").returncode == 0
    unchanged = run(capsys, "--spec-dir", cases, "golden", "regenerate")
    assert "0 golden arrays changed" in unchanged.stdout
    (cases / "tiny.yaml").write_text(TINY.replace("seed: 9}", "seed: 19}"))
    stale = run(capsys, "--spec-dir", cases, "golden", "check")
    assert stale.returncode == 1 and "tiny-self-attention" in stale.stdout
    result = run(capsys, "--spec-dir", cases, "golden", "regenerate")
    assert result.returncode == 0
    assert "2 golden arrays changed" in result.stdout       # float64 and float32
    assert re.search(r"1 cases changed:\n  tiny-self-attention: 2 changed "
                     r"\(max abs change \d\.\d+(e[-+]\d+)?\)", result.stdout), result.stdout
    assert run(capsys, "--spec-dir", cases, "golden", "check").returncode == 0


#: TINY with exact values the reference does not give: the causal first row is [1, 0, 0, 0],
#: and under fully_masked_rows=zeros the empty second row is 0
WRONG_EXACT = TINY.replace('exact: {"[0]": [1, 0, 0, 0]}', 'exact: {"[0]": [0.5, 0.5, 0, 0]}') \
    .replace("zeros: {golden: true}", 'zeros: {golden: true, exact: {"[1]": 1}}')


def _wrong_exact_lines(text) -> list[str]:
    """The lines golden regenerate and golden check must print for WRONG_EXACT."""
    weights, empty = (_line_of(text, needle) for needle in ("[0.5, 0.5, 0, 0]", '"[1]": 1'))
    return [f"spec/cases/tiny.yaml:{weights}: case 'tiny-weights-causal': exact '[0]': the "
            "float64 reference gives 1 at [0] of the selection [float64], the case states 0.5",
            f"spec/cases/tiny.yaml:{empty}: case 'tiny-empty-row': exact '[1]' under "
            "fully_masked_rows=zeros: the float64 reference gives 0 at [0] of the selection "
            "[float64], the case states 1"]


def _line_of(text, needle) -> int:
    return [n for n, row in enumerate(text.splitlines(), 1) if needle in row][0]


def test_golden_commands_refuse_an_exact_value_the_reference_does_not_give(tmp_path, capsys):
    cases = tmp_path / "spec" / "cases"
    cases.mkdir(parents=True)
    (cases / "tiny.yaml").write_text(WRONG_EXACT)
    assert run(capsys, "--spec-dir", cases, "validate").returncode == 0   # valid, as written
    refused = run(capsys, "--spec-dir", cases, "golden", "regenerate")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stderr.splitlines()[:2] == _wrong_exact_lines(WRONG_EXACT), refused.stderr
    assert not list(tmp_path.glob("spec/golden/*")), "regenerate wrote golden data"
    make_spec(tmp_path)                 # right golden data, then the wrong values again
    (cases / "tiny.yaml").write_text(WRONG_EXACT)
    checked = run(capsys, "--spec-dir", cases, "golden", "check")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert checked.stderr.splitlines()[:2] == _wrong_exact_lines(WRONG_EXACT), checked.stderr


def test_certify_passes_pytest_options_through_and_writes_junit_xml(tiny, tmp_path):
    junit = tmp_path / "partial.xml"
    result = cli("--spec-dir", tiny, "certify", adapter("Float32Only"), "--dtype", "float32",
                 "--dtype", "bfloat16", "-k", "softmax or causal", f"--junitxml={junit}", "-v")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tiny-softmax[float32] PASSED" in result.stdout          # -v went through
    assert "2 passed, 1 skipped, 6 deselected" in result.stdout     # --dtype: 9 collected
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    assert sorted(cases) == ["tiny-softmax[bfloat16]", "tiny-softmax[float32]",
                             "tiny-weights-causal[float32]"]
    skipped = cases["tiny-softmax[bfloat16]"].find("skipped")
    assert skipped.get("message") == "unsupported: backend does not declare dtype bfloat16"
    assert cases["tiny-softmax[float32]"].find("skipped") is None
    page = (ROOT / "docs" / "cli.md").read_text()         # the classname docs/cli.md gives
    said = re.search(r"with a classname made\s+from [^(]*\(`([^`]+)`\)", page).group(1)
    assert {c.get("classname") for c in cases.values()} == {said.replace("TOPIC", "tiny")}


def test_certify_exit_status_and_failure_message(tiny):
    bad = cli("--spec-dir", tiny, "certify", adapter("WrongDefaultScale"), "-p", "no:cacheprovider",
              "-q", "--", "-x")                                   # after --: pytest's -x
    assert bad.returncode == 1
    assert "1 failed" in bad.stdout                               # -x stopped it
    assert "tiny/tiny-sdpa-default-scale[L3-D4-float64] on backend 'bad-scale'" in bad.stdout
    assert "worst abs error" in bad.stdout and "tolerance" in bad.stdout
    unknown = cli("certify", "no-such-backend")
    assert unknown.returncode == 4 and "unknown backend 'no-such-backend'" in unknown.stderr


def test_certify_builds_the_pytest_command_line():
    args, unknown = build_parser().parse_known_args(
        ["--spec-dir", "x/cases", "certify", "numpy", "--dtype", "float16", "-k", "mask",
         "--report", "out", "--junitxml", "j.xml", "-n", "2"])
    argv = certify_argv(args, unknown)
    assert argv[argv.index("--backend") + 1] == "numpy"
    assert argv[-4:] == ["--junitxml", "j.xml", "-n", "2"]
    for pair in (["--dtype", "float16"], ["-k", "mask"], ["--report", "out"]):
        assert " ".join(pair) in " ".join(argv)
    assert str(Path("x/cases").resolve()) in argv


def test_show_command_prints_a_line_a_shell_runs_with_the_same_argv(tiny, monkeypatch, capsys):
    """--show-command joined the argv with spaces: in a shell `-W ignore:Module already
    imported ...` fell apart into words (pytest: "file or directory not found: already").
    Quoted, bash hands pytest the very argv that certify passes to pytest.main."""
    from attention_conformance import terminal

    ran = []
    monkeypatch.setattr(pytest, "main", lambda argv: ran.append(argv) or 0)
    monkeypatch.setattr(terminal, "default_threads", lambda: [])     # os.environ untouched
    result = run(capsys, "--spec-dir", tiny, "certify", "numpy", "-k", "softmax and float32",
                 "--show-command")
    assert result.returncode == 0, result.stderr
    line = result.stdout.splitlines()[0]
    shell = subprocess.run(["bash", "-c", 'printf "%s\\0" ' + line], capture_output=True,
                           text=True, check=True)
    assert shell.stdout.split("\0")[:-1] == ["pytest", *ran[0]], line
    assert shlex.split(line) == ["pytest", *ran[0]]


@pytest.mark.parametrize("option", [["-n", "2"], ["-nauto"], ["--numprocesses=2"],
                                    ["--", "--dist", "load"]])
def test_certify_refuses_xdist_options_without_xdist_in_one_line(option, capsys, monkeypatch):
    """pytest-xdist is the test extra's, not the package's: without it `certify -n 2`
    is refused in one line that says how to install it (pytest said `unrecognized
    arguments: -n 2` and `inifile: /dev/null`); with it, -n reaches pytest."""
    import attention_conformance.cli as cli_module

    assert cli_module._xdist_installed()                  # the test extra installs it
    assert cli_module.xdist_problem(option[-2:]) is None
    monkeypatch.setattr(cli_module, "_xdist_installed", lambda: False)
    refused = run(capsys, "certify", "numpy", *option)
    assert refused.returncode == 4 and refused.stdout == "", refused.stdout
    line, = refused.stderr.splitlines()
    flag = option[1] if option[0] == "--" else option[0]
    assert line == (f"ERROR: {flag} needs pytest-xdist, which is not installed: "
                    "pip install pytest-xdist"), line
    assert cli_module.xdist_problem(["--noconftest", "--junitxml", "j.xml"]) is None


def test_certify_help_says_that_n_needs_pytest_xdist(capsys):
    help_text = " ".join(run(capsys, "certify", "--help").stdout.split())
    assert "-n 2 with pytest-xdist installed: pip install pytest-xdist" in help_text


def test_certify_refuses_a_missing_or_empty_cases_folder_in_one_line(tmp_path):
    """An empty folder ran nothing ('no tests ran', exit 5) without saying why; a
    missing one got pytest's "Directory ... not found. Check your '--rootdir' option"."""
    empty = tmp_path / "spec" / "cases"
    empty.mkdir(parents=True)
    (empty / "notes.txt").write_text("not a case file")
    for folder, why in ((empty, "no case files (*.yaml) in this folder"),
                        (tmp_path / "nowhere" / "cases", "no such folder of case files")):
        result = cli("--spec-dir", folder, "certify", "numpy", "-q")
        assert result.returncode == 4, result.stdout + result.stderr
        assert result.stderr.strip() == f"ERROR: {folder}: {why}", result.stderr


def test_other_commands_refuse_unknown_options(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["list", "--frobnicate"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --frobnicate" in capsys.readouterr().err


def _documented_commands(text: str) -> list[list[str]]:
    """The attention-conformance command lines of every bash block of a document."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("attention-conformance "):
                commands.append(shlex.split(line)[1:])
    return commands


def test_every_documented_command_exists():
    """Every attention-conformance command that the README and docs/ show in a bash
    block parses with the real command line: no unknown command or option."""
    parser = build_parser()
    used = set()
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for command in _documented_commands(doc.read_text()):
            used.add(command[0])
            args, unknown = parser.parse_known_args(command)
            passthrough = args.command == "certify"     # certify hands the rest to pytest
            assert passthrough or not unknown, f"{doc.name}: {command}: unknown {unknown}"
    assert {"list", "certify", "report", "export", "fuzz", "validate", "golden",
            "new-backend"} <= used


def test_the_cli_page_names_every_built_in_backend():
    """docs/cli.md's list of built-in names is the registry's (a new backend adds itself)."""
    from attention_conformance.backends import BUILTIN
    page = (ROOT / "docs" / "cli.md").read_text()
    listed = page.split("- `BACKEND`: a built-in name (")[1].split("), the name of an")[0]
    assert set(re.findall(r"`([\w-]+)`", listed)) == set(BUILTIN)


def test_the_readme_shows_the_installed_path_first():
    """The README's first commands install the package from a fresh clone (not editable:
    the package is on no public index) and run it, before any development install."""
    text = (ROOT / "README.md").read_text()
    first = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    assert first.splitlines()[0].startswith("pip install . ")
    assert "attention-conformance certify numpy" in first
    assert text.index("pip install . ") < text.index("pip install -e")


@pytest.mark.parametrize("given, line", [
    (["--case-timeout", "-1"], "argument --case-timeout: must be 0 (off) or more, not -1"),
    (["--case-timeout=abc"], "argument --case-timeout: not a number: 'abc'"),
    (["--restart-every", "1.5"], "argument --restart-every: not a whole number: '1.5'"),
    (["-x", "--case-timeout", "30", "--junitxml", "out.xml"], None)])
def test_a_bad_value_of_an_option_certify_passes_through_is_one_line(given, line):
    """The plugin's options certify leaves to pytest are checked by their own types first:
    pytest would print pytest.main()'s usage and its settings file, /dev/null."""
    assert passthrough_problem(given) == line


def test_certify_refuses_a_bad_passed_through_value_before_any_backend_starts():
    result = cli("certify", "numpy", "--case-timeout", "-1")
    assert result.returncode == 4
    assert result.stderr.strip() == "ERROR: argument --case-timeout: must be 0 (off) or more, not -1"


def test_the_synopses_name_every_profile():
    from attention_conformance.options import PROFILES
    page = (ROOT / "docs" / "cli.md").read_text()
    shown = re.findall(r"\[--profile ([\w|]+)\]", page)
    assert len(shown) >= 3 and all(s.split("|") == list(PROFILES) for s in shown), shown
