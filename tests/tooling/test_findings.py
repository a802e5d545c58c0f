"""docs/findings.md and the README's table of backends are what scripts/render_findings.py
makes of the expected-failure files and the adapters' declared policies, and those
declarations, read from the source without importing a framework, are what the
backends declare when they load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import declared_policies  # noqa: E402
import render_findings  # noqa: E402

#: load every built-in backend that this environment can build, in a process of its own
#: (several frameworks in the suite's processes cost seconds and memory), and print
#: what each declares
LOAD = """
import json, sys
from attention_conformance.backend.interface import op_policy
from attention_conformance.backend.resolve import load_backend
seen = {}
for name in sys.argv[1:]:
    try:
        backend = load_backend(name)
    except Exception as exc:
        seen[name] = repr(exc)[:200]
        continue
    seen[name] = {"policy": dict(backend.policy), "op_policy": op_policy(backend),
                  "policy_when": [dict(rule) for rule in getattr(backend, "policy_when", [])],
                  "dtype_notes": dict(getattr(backend, "dtype_notes", {}))}
print(json.dumps(seen))
"""


@pytest.mark.parametrize("page", sorted(render_findings.parts()))
def test_the_page_is_what_the_files_make(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    assert render_findings.render(text, render_findings.parts()[page]) == text, \
        f"{page} is stale: python scripts/render_findings.py"


def test_a_new_entry_changes_the_page(tmp_path, monkeypatch):
    """The page follows the files: an entry added to a file is on the page after."""
    for path in render_findings.EXPECTED_DIR.glob("*.yaml"):
        (tmp_path / path.name).write_text(path.read_text())
    with (tmp_path / "jax.yaml").open("a") as f:
        f.write('  - match: "masks/a-new-finding[*]"\n    reason: "a reason no file gives"\n')
    monkeypatch.setattr(render_findings, "EXPECTED_DIR", tmp_path)
    page = render_findings.expected_sections()
    assert "`masks/a-new-finding[*]` | - | before | a reason no file gives |" in page
    assert "[9](docs/findings.md#jax)" in render_findings.policies_table("docs/findings.md")


def test_conditional_policies_and_dtype_notes_are_on_the_page(monkeypatch):
    """A policy_when rule shows beside its backend in both tables, a dtype left out (and
    why) in the findings page's."""
    rule = {"when": {"causal": True, "mask": False}, "policy": {"masked_key_nan": "per_row"}}
    fake = {"x": {"policy": {"masked_key_nan": "propagates"}, "op_policy": {},
                  "policy_when": [rule], "dtype_notes": {"float64": "computed in float32"}}}
    monkeypatch.setattr(render_findings, "declarations", lambda: fake)
    page = render_findings.policies_table("", notes=True)
    assert "| x (when causal, not mask: masked_key_nan=per_row) (float64 left out: " \
           "computed in float32) |" in page
    readme = render_findings.policies_table("docs/findings.md")
    assert "when causal, not mask" in readme and "left out" not in readme


def test_the_source_declares_what_the_loaded_backends_declare():
    """For every built-in backend this environment can build (numpy everywhere; the
    others where their framework is installed and the machine has their device)."""
    static = declared_policies.declarations()
    done = subprocess.run([sys.executable, "-c", LOAD, *static], capture_output=True,
                          text=True, timeout=600, check=True)
    loaded = {n: d for n, d in json.loads(done.stdout.splitlines()[-1]).items()
              if isinstance(d, dict)}
    assert "numpy" in loaded
    for name, declared in loaded.items():
        assert static[name] == declared, name
