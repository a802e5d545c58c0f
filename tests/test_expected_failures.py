"""Expected failures: a listed finding is xfail, a stale entry warns, a fixed one fails."""

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from attention_conformance import golden_store

ROOT = Path(__file__).resolve().parent.parent
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
