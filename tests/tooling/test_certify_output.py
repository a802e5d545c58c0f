"""What `attention-conformance certify` prints around its tests, as a user sees it from a
folder of their own: a header with the threads line and no `configfile:` line, then one
progress line per case file named from the spec folder. And the threads it gives."""

from __future__ import annotations

import json
import re

from _cli_support import adapter, cli, make_spec

UNSET = {"OMP_NUM_THREADS": "", "OPENBLAS_NUM_THREADS": ""}


def test_a_real_certify_run_prints_a_plain_header_and_progress(tmp_path):
    run = cli("certify", "numpy", "-k", "worked_examples or lse-plain", cwd=tmp_path, env=UNSET)
    assert run.returncode == 0, run.stdout + run.stderr
    header, _, rest = run.stdout.partition("collected ")
    assert "rootdir: " in header and "configfile" not in header
    assert ("threads: OMP_NUM_THREADS=1 (set by certify; export OMP_NUM_THREADS to change), "
            "OPENBLAS_NUM_THREADS=1 (set by certify; export OPENBLAS_NUM_THREADS to change)"
            ) in header
    named = re.findall(r"^(\S+\.yaml) [.]", rest, re.M)
    assert named == ["cases/lse.yaml", "cases/worked_examples.yaml"], rest[:2000]
    assert "site-packages" not in run.stdout and "../" not in run.stdout


def test_certify_gives_one_thread_unless_the_user_says_otherwise(tmp_path):
    cases = make_spec(tmp_path)
    reports = {}
    for name, env in (("default", UNSET), ("yours", {"OMP_NUM_THREADS": "3",
                                                     "OPENBLAS_NUM_THREADS": ""})):
        run = cli("--spec-dir", cases, "certify", adapter("ThreadsSeen"), "-k", "softmax",
                  "--report", tmp_path / name, env=env)
        assert run.returncode == 0, run.stdout + run.stderr
        reports[name] = json.loads((tmp_path / name / "threads-seen.json").read_text())["versions"]
        if name == "yours":
            assert "threads: OMP_NUM_THREADS=3 (yours), OPENBLAS_NUM_THREADS=1 (set by" in run.stdout
    assert (reports["default"]["OMP_NUM_THREADS"], reports["default"]["OPENBLAS_NUM_THREADS"]) \
        == ("1", "1")
    assert (reports["yours"]["OMP_NUM_THREADS"], reports["yours"]["OPENBLAS_NUM_THREADS"]) \
        == ("3", "1")
