"""Expected failures of a backend: findings kept as cases, each with its reason.

A file (backends/expected_failures/NAME.yaml for a built-in backend, or any file given
with --expected-failures) lists entries:

    backend: torch
    entries:
      - match: "causal/some-case[*float16]"   # test id pattern (fnmatch)
        reason: "why the native op differs from the spec"

A matching test is an expected failure (strict: if it passes, the run fails and says
the entry is stale); an entry that matches no test at all gets a warning.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

from .spec import SpecError, parse_yaml

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "backends" / "expected_failures"


@dataclass
class Entry:
    match: str
    reason: str
    where: str
    used: int = 0


@dataclass
class ExpectedFailures:
    entries: list = field(default_factory=list)

    def find(self, test_id: str) -> Entry | None:
        for entry in self.entries:
            if fnmatch.fnmatchcase(test_id, entry.match):
                entry.used += 1
                return entry
        return None

    def unused(self) -> list:
        return [e for e in self.entries if not e.used]


def load_expected(path: Path) -> ExpectedFailures:
    data = parse_yaml(path.read_text(encoding="utf-8"), str(path))
    if not isinstance(data, dict) or not isinstance(data.get("entries", []), list):
        raise SpecError(path, 1, None, "an expected-failures file is a mapping with 'entries'")
    entries = []
    for raw in data.get("entries") or []:
        if not isinstance(raw, dict) or set(raw) != {"match", "reason"} or not raw["reason"]:
            raise SpecError(path, getattr(raw, "line", 0), None,
                            "each entry needs exactly 'match' and a non-empty 'reason'")
        entries.append(Entry(str(raw["match"]), str(raw["reason"]), f"{path}:{raw.line}"))
    return ExpectedFailures(entries)


def expected_for(backend, extra_files=()) -> ExpectedFailures:
    files = [Path(f) for f in extra_files]
    builtin = BUILTIN_DIR / f"{getattr(backend, 'name', '')}.yaml"
    own = getattr(backend, "expected_failures_file", None)
    if own:
        files.insert(0, Path(own))
    elif builtin.exists() and type(backend).__module__.startswith("backends."):
        files.insert(0, builtin)
    merged = ExpectedFailures()
    for path in files:
        merged.entries += load_expected(path).entries
    return merged
