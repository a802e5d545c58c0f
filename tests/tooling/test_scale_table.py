"""docs/running.md's table of the scale profile is the spec's: one row per case of
`profile: scale` (spec/cases), in the spec's order, the GPU-sized ones (min_memory_gb)
marked GB for every backend and no other; each backend a built-in one, and each cell a
figure per shape variant of its case or a word of the table's legend. A scale case
added, renamed or given variants fails here until the table says what ran of it."""

from __future__ import annotations

import re

import yaml

from _cli_support import ROOT
from attention_conformance.backends import BUILTIN

MARKER = "<!-- scale cases: spec/cases, profile scale -->\n"
WORDS = {"pass", "size", "GB", "no op", "–"}


def _table() -> list[list[str]]:
    text = (ROOT / "docs" / "running.md").read_text(encoding="utf-8")
    lines = text.split(MARKER, 1)[1].split("\n\n", 1)[0].splitlines()
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines
            if not line.startswith("|---")]


def _scale_cases() -> list[dict]:
    """The cases of profile scale, file by file (sorted) and in each file's order (only
    the files that name the profile are parsed)."""
    texts = [path.read_text(encoding="utf-8")
             for path in sorted((ROOT / "spec" / "cases").glob("*.yaml"))]
    return [case for text in texts if re.search(r"profile:\s*[\"']?scale", text)
            for case in yaml.safe_load(text)["cases"] if case.get("profile") == "scale"]


def test_the_scale_table_has_a_row_per_scale_case_in_the_spec_order():
    header, *rows = _table()
    cases = _scale_cases()
    assert [row[0].strip("`") for row in rows] == [case["id"] for case in cases], \
        "docs/running.md's scale table is not spec/cases' profile scale: add, rename or " \
        "reorder its rows"
    assert header[0] == "case" and set(header[1:]) <= set(BUILTIN), header
    for row, case in zip(rows, cases):
        figures = len(case.get("dims", [])) or 1
        assert len(row) == len(header), row
        for backend, cell in zip(header[1:], row[1:]):
            where = f"docs/running.md, scale table: {case['id']}, {backend}: {cell!r}"
            if "min_memory_gb" in case:
                assert cell == "GB", where
                continue
            assert cell != "GB", where
            numbers = re.fullmatch(r"\d+(?: / \d+)*(?: \(\w+\))?", cell)
            assert cell in WORDS or (numbers and cell.split(" (")[0].count("/") + 1 == figures), \
                f"{where}: a word of the legend or {figures} figure(s), one per variant"
