"""The matrix on more than one machine (.github/workflows/matrix.yml): one job per tox
environment, each uploading its report, and a last job that merges them; its job list
cannot drift from tox.ini's env_list and its `long` label, and a real workflow linter (actionlint) passes it."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "matrix.yml"


def _tox() -> configparser.ConfigParser:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    return tox


def _env_list() -> list[str]:
    return [e.strip() for e in _tox()["tox"]["env_list"].split(",")]


def _long() -> list[str]:
    """The environments of tox.ini's `long` label: outside env_list, each a job."""
    labels = {}
    for line in _tox()["tox"]["labels"].strip().splitlines():
        name, envs = line.split("=", 1)
        labels[name.strip()] = [e.strip() for e in envs.split(",")]
    return labels["long"]


def _jobs() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"]


def test_each_tox_environment_is_a_job_and_the_last_merges_the_reports():
    jobs = _jobs()
    envs = jobs["certify"]["strategy"]["matrix"]["env"]
    assert envs == _env_list()[:-1] + _long()           # env_list's order, then the long ones
    assert _env_list()[-1] == "report" and not set(_long()) & set(_env_list())
    steps = jobs["certify"]["steps"]
    assert any(s.get("run") == 'python -m tox -e "${{ matrix.env }}"' for s in steps)
    upload = next(s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert upload["with"]["path"] == "reports/*.json"      # one per backend the env certifies
    assert jobs["report"]["needs"] == "certify"
    assert any(s.get("run") == "attention-conformance report reports"
               for s in jobs["report"]["steps"])


def _actionlint() -> str | None:
    beside = Path(sys.executable).with_name("actionlint")
    return str(beside) if beside.exists() else shutil.which("actionlint")


def test_actionlint_passes_the_workflow(tmp_path):
    linter = _actionlint()
    if linter is None:
        pytest.skip("actionlint is not installed (the test extra installs it: "
                    "pip install -e '.[test]')")
    done = subprocess.run([linter, str(WORKFLOW)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    broken = tmp_path / "broken.yml"              # a linter that passes everything would not do
    broken.write_text(WORKFLOW.read_text().replace("matrix.env != 'suite'", "matrix.envs != 'suite'"))
    done = subprocess.run([linter, str(broken)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and 'property "envs" is not defined' in done.stdout, done.stdout
