"""A cache of case files already found valid, so that a run does not re-validate them.

Validating the spec (YAML with line tracking, JSON Schema, static checks that build
every input) costs seconds, in every pytest process and every xdist worker. A case
file that loaded with no problem at all is stored here as plain JSON (its topic, and
each case's data and line), under a key that hashes the file's bytes, the schema, the
dtypes with a tolerance and the source of the package that validated it: any change
to one of them is a miss, and a miss validates in full. Files with a problem are
never stored, so every error is found afresh, with its file, line and case id.

JSON, not pickle: reading the cache cannot run code. A cache that cannot be read or
written is ignored. The folder is $ATTENTION_CONFORMANCE_CACHE (``off`` disables
it), else $XDG_CACHE_HOME/attention-conformance, else ~/.cache/attention-conformance.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import struct
from pathlib import Path

from ..model.files import write_file

_FORMAT = "spec-cache-1"


def cache_dir() -> Path | None:
    override = os.environ.get("ATTENTION_CONFORMANCE_CACHE")
    if override:
        return None if override.lower() in ("off", "0", "no", "false") else Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attention-conformance"


@functools.cache
def _code_fingerprint() -> str:
    """The validating code itself: any edit of the package invalidates the cache."""
    digest = hashlib.sha256(_FORMAT.encode())
    package = Path(__file__).resolve().parents[1]
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def file_key(data: bytes, schema: Path, known_dtypes) -> str:
    digest = hashlib.sha256(_code_fingerprint().encode())
    digest.update(hashlib.sha256(schema.read_bytes()).digest())
    digest.update(repr(sorted(known_dtypes or ())).encode())
    digest.update(hashlib.sha256(data).digest())
    return digest.hexdigest()


def read(key: str) -> dict | None:
    """The stored {topic, cases: [{line, data}]} of a valid file, or None."""
    folder = cache_dir()
    if folder is None:
        return None
    try:
        stored = json.loads((folder / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return stored if isinstance(stored, dict) and stored.get("format") == _FORMAT else None


def write(key: str, topic: str, cases: list[tuple[int, dict]]) -> None:
    """Store a valid file; silently skipped when its data do not survive JSON intact."""
    folder = cache_dir()
    if folder is None:
        return
    entry = {"format": _FORMAT, "topic": topic,
             "cases": [{"line": line, "data": data} for line, data in cases]}
    text = json.dumps(entry, ensure_ascii=False)
    if not _same(json.loads(text), entry):   # e.g. a non-string key: validate every time
        return
    try:
        write_file(folder / f"{key}.json", text)
    except OSError:
        pass


def _same(a, b) -> bool:
    """Equal in type and value, a float bit for bit (a NaN's sign and payload, -0.0): a
    case read from the cache gives the backend the very inputs a fresh validation does."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    return a == b
