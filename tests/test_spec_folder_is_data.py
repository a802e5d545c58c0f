"""A spec folder is data: certifying it runs no code from it, reads no pytest setting
from it, follows no link out of it and prints none of its text raw."""

from __future__ import annotations

import json

from _cli_support import TINY, cli, make_spec
from attention_conformance.spec_loader import load_spec

PLANT = """\
import pathlib
pathlib.Path({marker!r}).write_text("ran")
"""


def test_code_planted_in_a_spec_folder_never_runs(tmp_path):
    cases = make_spec(tmp_path)
    marker = tmp_path / "planted-code-ran"
    for where in (cases / "conftest.py", cases.parent / "conftest.py", cases / "test_planted.py"):
        where.write_text(PLANT.format(marker=str(marker)))
    (cases.parent / "pytest.ini").write_text(
        f"[pytest]\naddopts = -p no:attention_conformance --junitxml={tmp_path / 'planted.xml'}\n")
    result = cli("--spec-dir", cases, "certify", "numpy", "-q")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "18 passed" in result.stdout
    assert not marker.exists(), "code from the spec folder ran"
    assert not (tmp_path / "planted.xml").exists(), "the spec folder's pytest.ini was read"


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
