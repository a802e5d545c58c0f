"""The README is a front page whose every claim is checked: its topics are the spec's,
its statuses the reports', its run summary a real run's, its Python runs, and it links
every page of docs/. (Its table of backends: test_findings.py; its commands and first
block: test_cli.py; "the spec catches N of M": tests/meta/test_known_bad.py.)"""

from __future__ import annotations

import re

import yaml

from _cli_support import ROOT, cli
from attention_conformance.options import BY_FLAG
from attention_conformance.reports.results import STATUS_LABELS

README = (ROOT / "README.md").read_text(encoding="utf-8")


def _after(marker: str) -> str:
    """The README's text from an HTML comment marker to the next blank line."""
    return README.split(f"<!-- {marker} -->\n", 1)[1].split("\n\n", 1)[0]


def _bullets(marker: str) -> list[str]:
    """The bold or code word that starts each bullet after the marker."""
    return re.findall(r"^- (?:\*\*|`)([\w-]+)(?:\*\*|`) — ", _after(marker), re.M)


def test_the_readme_is_a_front_page():
    assert len(README.splitlines()) < 220
    cost = README.split("## Cost\n", 1)[1].split("\n## ", 1)[0].strip().splitlines()
    assert len(cost) <= 5 and "(docs/benchmarks.md)" in " ".join(cost)


def test_the_topics_are_the_specs():
    topics = [yaml.safe_load(p.read_text())["topic"]
              for p in sorted((ROOT / "spec" / "cases").glob("*.yaml"))]
    assert _bullets("topics: spec/cases/*.yaml") == topics


def test_the_statuses_are_the_reports():
    assert sorted(_bullets("statuses")) == sorted(STATUS_LABELS)
    timeout = BY_FLAG["--case-timeout"].default
    assert f"within `--case-timeout` ({timeout:g} s)" in _after("statuses")


def test_the_summary_is_a_real_runs(tmp_path):
    """The run's summary, as the README shows it (its spec hash aside: any change to a
    case file, the schema, the tolerances or the golden data moves it)."""
    run = cli("certify", "numpy", "-q", cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    shown = _after("summary: attention-conformance certify numpy").strip("`\n")
    shown = shown.removeprefix("text\n").splitlines()
    start = run.stdout.index("attention-conformance: backend 'numpy'")
    printed = run.stdout[start:].splitlines()[:len(shown)]
    hashless = [re.sub(r"in spec [0-9a-f]{16}", "in spec HASH", line) for line in shown]
    assert hashless == [re.sub(r"in spec [0-9a-f]{16}", "in spec HASH", line)
                        for line in printed], "\n".join(printed)


def test_the_quick_spec_is_as_many_tests_as_the_summary_counts():
    """The Cost section's count is the shown run's: every status of its summary line."""
    statuses = re.search(r"^  (\d+) pass, (\d+) fail, (\d+) xfail, (\d+) xpass, (\d+) "
                         r"unsupported$", README, re.M)
    cost = re.search(r"one pytest run of the quick spec \(([\d,]+) tests\)", README)
    assert statuses and cost, "the summary's counts and the Cost section's figure"
    assert int(cost[1].replace(",", "")) == sum(map(int, statuses.groups()))


def test_the_python_runs():
    for block in re.findall(r"```python\n(.*?)```", README, re.S):
        exec(compile(block, "README.md", "exec"), {})


def test_every_page_is_linked():
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    linked = set(re.findall(r"\]\((docs/[\w-]+\.md)\)", README.split("## Documentation", 1)[1]))
    assert linked == pages
