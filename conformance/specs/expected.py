"""Expected failures of a backend: findings kept as cases, each with its reason.

A file (backends/expected_failures/NAME.yaml for a built-in backend, or any file given
with --expected-failures) lists entries:

    backend: torch
    entries:
      - match: "causal/some-case[*float16]"   # test id; * matches anything
        reason: "why the native op differs from the spec"
      - match: "*"                             # optional filters narrow a broad pattern:
        ops: [sdpa, sdpa_vjp]                  #   the case's op
        dtypes: [float64]                      #   the test's dtype
        strict: false                          #   some matching tests may pass
        message: "text"                        #   the failure message must contain this
        reason: "..."

A matching test is an expected failure. Strict entries (the default) fail the run when
the test passes, saying the entry is stale; `strict: false` is for a broad finding that
some insensitive cases cannot see. An entry with a `message` is judged after the run:
a matching test that fails with that text in its message is an expected failure, any
other outcome counts as it is. An entry that matches no test before the run (and, with a
message, no failure) gets a warning.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

from .. import backends
from .yaml_reader import SpecError, parse_yaml

BUILTIN_DIR = Path(backends.__file__).resolve().parent / "expected_failures"


@dataclass
class Entry:
    match: str
    reason: str
    where: str
    ops: tuple = ()
    dtypes: tuple = ()
    strict: bool = True
    message: str = ""
    used: int = 0

    def matches(self, test_id: str, op: str, dtype: str) -> bool:
        return (_pattern(self.match).fullmatch(test_id) is not None
                and (not self.ops or op in self.ops)
                and (not self.dtypes or dtype in self.dtypes))


@dataclass
class ExpectedFailures:
    entries: list = field(default_factory=list)

    def find(self, test_id: str, op: str = "", dtype: str = "") -> Entry | None:
        """The entry that marks a test as expected to fail before it runs."""
        for entry in self.entries:
            if not entry.message and entry.matches(test_id, op, dtype):
                entry.used += 1
                return entry
        return None

    def find_by_message(self, test_id: str, op: str, dtype: str, failure: str) -> Entry | None:
        """The entry that names a failed test and the failure's message, if any."""
        for entry in self.entries:
            if entry.message and entry.message in failure and entry.matches(test_id, op, dtype):
                entry.used += 1
                return entry
        return None

    def unused(self) -> list:
        return [e for e in self.entries if not e.used]


@functools.cache
def _pattern(text: str) -> re.Pattern:
    """A test-id pattern: '*' matches any run of characters, everything else itself."""
    return re.compile(".*".join(re.escape(part) for part in text.split("*")))


_KEYS = {"match", "reason", "ops", "dtypes", "strict", "message"}


def _entry(raw, path) -> Entry:
    line = getattr(raw, "line", 0)
    if not isinstance(raw, dict) or not {"match", "reason"} <= set(raw) or not raw["reason"]:
        raise SpecError(path, line, None, "each entry needs 'match' and a non-empty 'reason'")
    unknown = set(raw) - _KEYS
    if unknown:
        raise SpecError(path, line, None, f"unknown key(s) {', '.join(sorted(unknown))} "
                        f"(known: {', '.join(sorted(_KEYS))})")
    return Entry(str(raw["match"]), str(raw["reason"]).strip(), f"{path}:{line}",
                 tuple(raw.get("ops", ())), tuple(raw.get("dtypes", ())),
                 bool(raw.get("strict", True)), str(raw.get("message", "")))


_FILE_KEYS = {"backend", "entries"}


def load_expected(path: Path) -> ExpectedFailures:
    """An expected-failures file's entries; any problem is a SpecError naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(path, 0, None, "cannot read this expected-failures file: "
                        f"{getattr(exc, 'strerror', None) or exc}") from None
    data = parse_yaml(text, str(path))
    if not isinstance(data, dict) or not isinstance(data.get("entries", []), list):
        raise SpecError(path, 1, None, "an expected-failures file is a mapping with 'entries'")
    unknown = set(data) - _FILE_KEYS
    if unknown:
        raise SpecError(path, 1, None, f"unknown key(s) {', '.join(sorted(map(str, unknown)))} "
                        f"(known: {', '.join(sorted(_FILE_KEYS))})")
    entries = []
    for raw in data.get("entries") or []:
        entries.append(_entry(raw, path))
    return ExpectedFailures(entries)


def expected_for(declaration, extra_files=()) -> ExpectedFailures:
    """The expected failures of a backend (its Declaration): its own file, or the
    built-in file of its name for a built-in adapter, then the extra files given."""
    files = [Path(f) for f in extra_files]
    builtin = BUILTIN_DIR / f"{declaration.name}.yaml"
    if declaration.expected_failures_file:
        files.insert(0, Path(declaration.expected_failures_file))
    elif builtin.exists() and declaration.module.startswith(backends.__name__ + "."):
        files.insert(0, builtin)
    merged = ExpectedFailures()
    for path in files:
        merged.entries += load_expected(path).entries
    return merged
