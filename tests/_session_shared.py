"""Work that several tests need, done once per pytest session, not once per xdist worker.

    value = once(tmp_path_factory, "known-bad/wrong_scale", compute, encode, decode)

The first process to ask computes the value while it holds a file lock, and writes it as
JSON under the session's temporary base (the folder every xdist worker's own base
lives in); any other process that asks waits on the lock and reads the file. Different
names are computed in parallel, each by whichever worker asks first. A computation that
raises writes nothing: the next asker computes again (and fails the same way, with its
own traceback).
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path


def session_root(tmp_path_factory) -> Path:
    """A folder shared by the session's processes (the workers' bases have one parent)."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return root / "session-shared"


def once(tmp_path_factory, name: str, compute, encode=lambda v: v, decode=lambda v: v):
    """compute() the first time any process of the session asks for name, else read it."""
    path = session_root(tmp_path_factory) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if path.exists():
                return decode(json.loads(path.read_text()))
            value = compute()
            temporary = path.with_suffix(".partial")
            temporary.write_text(json.dumps(encode(value)))
            temporary.replace(path)
            return value
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
