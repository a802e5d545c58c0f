"""A spec folder is one object that every step reads: its own tolerances are the ones
that validation, golden data, the checks and their messages use.

A spec folder is data: certifying it runs no code from it, reads no pytest setting
from it, follows no link out of it and prints none of its text raw.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from _cli_support import ROOT, TINY, cli, make_spec
from attention_conformance.backends.numpy import NumpyBackend
from attention_conformance.backend.in_process import InProcess
from attention_conformance.checking.verdict import run_case
from attention_conformance.golden.store import GoldenStore
from attention_conformance.model.errors import CheckFailure
from attention_conformance.model.folder import SpecFolder, packaged_spec_dir
from attention_conformance.pytest_cases import PYTEST_FILES
from attention_conformance.specs.loader import load_spec

LOOSE = """\
multiplier: 1.0e9
property_roundings: 4
dtypes:
  float64: {unit_roundoff: 1.1102230246251565e-16, plain_error_from: float32}
  float32: {unit_roundoff: 5.9604644775390625e-08}
  float16: {unit_roundoff: 4.8828125e-04}
  bfloat16: {unit_roundoff: 3.90625e-03}
"""


class Nudged(NumpyBackend):
    """The NumPy backend with every sdpa output moved by 1e-3: wrong at any real tolerance."""

    name = "nudged"

    def sdpa(self, *args, **kwargs):
        out = super().sdpa(*args, **kwargs)
        return (out + np.asarray(1e-3, dtype=out.dtype)).astype(out.dtype)


def _sdpa_case(folder):
    spec = load_spec(folder)
    assert not spec.errors, spec.errors
    return spec, next(c for c in spec.cases if c.id == "tiny-sdpa-default-scale")


@pytest.fixture
def folders(tmp_path):
    strict = SpecFolder.at(make_spec(tmp_path / "strict"))
    loose = SpecFolder.at(make_spec(tmp_path / "loose"))
    (loose.root / "tolerances.yaml").write_text(LOOSE)
    return strict, loose


def test_a_folder_is_found_from_its_root_or_its_cases(tmp_path):
    cases = make_spec(tmp_path)
    assert SpecFolder.at(cases).root == SpecFolder.at(cases.parent).root == cases.parent.resolve()
    assert SpecFolder.at(cases).golden_dir == cases.parent.resolve() / "golden"


def test_without_its_own_tolerances_a_folder_uses_the_packages(folders):
    strict, _ = folders
    assert strict.tolerances_file == packaged_spec_dir() / "tolerances.yaml"
    assert strict.tolerances.multiplier == 4


def test_the_folders_tolerances_judge_and_are_printed(folders):
    strict, loose = folders
    _, case = _sdpa_case(strict)
    variant = case.variants[0]
    with pytest.raises(CheckFailure, match=r"tolerance [0-9.e-]+ = 4 x max"):
        run_case(InProcess(Nudged()), case, variant, "float32", GoldenStore.of(strict))
    _, case = _sdpa_case(loose)
    assert loose.tolerances.multiplier == 1e9
    result = run_case(InProcess(Nudged()), case, variant, "float32", GoldenStore.of(loose))
    assert 0 < result.worst_ratio < 1       # judged by the folder's own rule


def test_validation_reads_the_folders_dtypes(folders):
    _, loose = folders
    two_dtypes = "\n".join(LOOSE.splitlines()[:5]) + "\n"    # no float16, no bfloat16
    (loose.root / "tolerances.yaml").write_text(two_dtypes)
    spec = load_spec(loose)
    assert any("has no tolerance" in e.message and "float16" in e.message for e in spec.errors)


def test_a_golden_store_of_a_folder_carries_its_tolerances(folders):
    _, loose = folders
    assert GoldenStore.of(loose).tolerances.multiplier == 1e9
    assert GoldenStore(loose.golden_dir).tolerances.multiplier == 1e9


PLANT = """\
import pathlib
pathlib.Path({marker!r}).write_text("ran")
"""


def test_code_planted_in_a_spec_folder_never_runs(tmp_path):
    """certify reads nothing of it, and refuses the folder: it is never run as if fine."""
    cases = make_spec(tmp_path)
    marker = tmp_path / "planted-code-ran"
    for where in (cases / "conftest.py", cases.parent / "conftest.py", cases / "test_planted.py"):
        where.write_text(PLANT.format(marker=str(marker)))
    (cases.parent / "pytest.ini").write_text(
        f"[pytest]\naddopts = -p no:attention_conformance --junitxml={tmp_path / 'planted.xml'}\n")
    result = cli("--spec-dir", cases, "certify", "numpy", "-q")
    assert result.returncode == 4, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stderr.strip() == (
        f"ERROR: {cases.parent.resolve() / 'conftest.py'}: pytest settings or code inside the "
        f"spec folder {cases.parent.resolve()} (a spec folder is data: move the file out of it)")
    assert "passed" not in result.stdout
    assert not marker.exists(), "code from the spec folder ran"
    assert not (tmp_path / "planted.xml").exists(), "the spec folder's pytest.ini was read"


#: where pytest finds a file of its settings or code in a spec folder
PLANTED = {name: ("cases" if name == "conftest.py" else ".") for name in PYTEST_FILES}


@pytest.mark.parametrize("name", PLANTED)
def test_plain_pytest_refuses_a_spec_folder_holding_pytest_settings(tmp_path, pytester, name):
    cases = make_spec(tmp_path)
    planted = (cases.parent / PLANTED[name] / name).resolve()
    planted.write_text({"setup.cfg": "[tool:pytest]\n", "tox.ini": "[pytest]\n",
                        "pytest.ini": "[pytest]\n", ".pytest.ini": "[pytest]\n"}.get(name, ""))
    # refused at configure: Hypothesis' plugin, kept out, would never see its session start
    result = pytester.runpytest_inprocess(str(cases), "--backend", "numpy", "--spec-dir",
                                          str(cases), "-q", "-p", "no:cacheprovider",
                                          "-p", "no:hypothesispytest")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    errors = [line for line in result.errlines if line.strip()]
    assert len(errors) == 1 and errors[0].startswith(f"ERROR: {planted}: pytest settings"), errors
    assert "passed" not in result.stdout.str()


def test_plain_pytest_from_inside_a_spec_folder_is_refused(tmp_path):
    """pytest reads the folder's pytest.ini and imports its -p plugin before ours loads:
    that cannot be stopped here, but the run is refused; the documented commands (tox's,
    which name their ini file) never read that file."""
    cases = make_spec(tmp_path)
    marker = tmp_path / "plugin-imported"
    (cases.parent / "pwnplugin.py").write_text(PLANT.format(marker=str(marker)))
    (cases.parent / "pytest.ini").write_text("[pytest]\naddopts = -p pwnplugin\n")
    for named, imported in (([], True), (["-c", ROOT / "pyproject.toml", "--rootdir", ROOT], False)):
        done = subprocess.run([sys.executable, "-m", "pytest", *map(str, named), "cases",
                               "--backend", "numpy", "--spec-dir", "cases", "-q",
                               "-p", "no:cacheprovider"], cwd=cases.parent, capture_output=True,
                              text=True, timeout=180)
        assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
        assert done.stderr.strip().startswith("ERROR: ") and "pytest.ini: pytest settings" in \
            done.stderr and "passed" not in done.stdout, done.stderr
        assert marker.exists() == imported
        marker.unlink(missing_ok=True)


def test_pytest_on_another_specs_case_files_says_how_to_certify_them(tmp_path):
    """Only the certified spec's files are collected (a wheel's own spec, unless told):
    a command line naming another spec's cases is refused in one line, which says how."""
    cases = make_spec(tmp_path)
    env = {key: value for key, value in os.environ.items() if key != "ATTENTION_CONFORMANCE_SPEC"}
    runs = [subprocess.run([sys.executable, "-m", "pytest", "-c", ROOT / "pyproject.toml",
                            "--rootdir", ROOT, cases, "--backend", "numpy", *told, "-q", "-p",
                            "no:cacheprovider"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=180, env=env) for told in ([], ["--spec-dir", cases])]
    refused, told = runs
    assert refused.returncode == pytest.ExitCode.USAGE_ERROR, refused.stdout + refused.stderr
    assert refused.stderr.strip() == (
        f"ERROR: {cases}: the case files of another spec than the one this run certifies "
        f"({packaged_spec_dir()}); certify them with --spec-dir {cases.parent} (or "
        f"ATTENTION_CONFORMANCE_SPEC={cases.parent})"), refused.stderr
    assert told.returncode == 0 and " passed" in told.stdout, told.stdout + told.stderr


def test_every_pytest_command_of_tox_and_the_docs_names_its_settings():
    """No documented pytest command lets pytest find an ini file by itself."""
    tox = [line.strip() for line in (ROOT / "tox.ini").read_text().splitlines()
           if line.strip().startswith("pytest ")]
    assert len(tox) >= 10
    for line in tox:
        assert "-c {tox_root}/pyproject.toml --rootdir {tox_root}" in line, line
    for page in ("cli.md", "failures.md", "adding-a-backend.md", "writing-cases.md"):
        for line in (ROOT / "docs" / page).read_text().splitlines():
            assert not re.search(r"\bpytest \S*spec/cases", line), f"docs/{page}: {line}"


def test_the_spec_folders_own_schema_is_not_used(tmp_path):
    cases = make_spec(tmp_path)
    (cases.parent / "schema.json").write_text(json.dumps(
        {"$ref": "http://127.0.0.1:9/never-fetched.json", "not": {}}))
    spec = load_spec(cases)
    assert not spec.errors and len(spec.cases) == 5     # the package's schema judged it


def test_a_linked_case_file_is_refused(tmp_path):
    cases = make_spec(tmp_path)
    outside = tmp_path / "outside.yaml"
    outside.write_text(TINY.replace("topic: tiny", "topic: linked"))
    (cases / "linked.yaml").symlink_to(outside)
    spec = load_spec(cases)
    assert [e.message for e in spec.errors] == [
        "a case file must be a regular file inside the folder (a link is refused)"]
    assert "linked.yaml" in spec.errors[0].file
    assert len(spec.cases) == 5                       # the regular file still loads


def test_control_characters_of_a_spec_reach_no_terminal_raw(tmp_path):
    text = TINY.replace("description: sdpa with the default scale and a key padding mask",
                        'description: "sdpa \\e[2J\\e[31mwith the default scale"')
    cases = make_spec(tmp_path, text)
    result = cli("--spec-dir", cases, "certify", "tests/cli_adapters.py:WrongDefaultScale",
                 "-k", "tiny-sdpa-default-scale")
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "case:   sdpa \\x1b[2J\\x1b[31mwith the default scale" in result.stdout
    assert "\x1b" not in result.stdout + result.stderr
