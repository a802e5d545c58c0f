"""Writing the files the suite makes (reports, the matrix, exports, golden data, cache
entries): whole or not at all, and never through a link.

A file is written under a new name of its own in its folder, then renamed over its
name (os.replace renames onto a link without following it): a symbolic link planted
at that name is replaced, never written through, and no reader sees half a file. The
folder must be a real folder: a link, a file or a folder that cannot be written is
refused with one line (FileRefused), which folder_problem() gives before a long run.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from pathlib import Path

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class FileRefused(OSError):
    """A file or folder the suite will not write (its message is one line)."""


def folder_problem(folder, *, probe: bool = False) -> str | None:
    """Why files may not be written into folder, or None (an absent folder is fine
    when it can be made). probe (a check before a run): try making an empty folder there,
    which permission bits miss on a read-only file system, and root passes them all;
    without it (before each file written) the bits alone, and a write that still fails
    raises its own OSError."""
    folder = Path(os.path.abspath(folder))
    if folder.is_symlink():
        return (f"{folder} is a symbolic link; name the folder itself "
                f"({os.path.realpath(folder)}) or a new one")
    existing = next(p for p in (folder, *folder.parents) if p.exists() or p.is_symlink())
    if existing != folder and not existing.is_dir():
        return f"{folder} cannot be made: {existing} is not a folder"
    if not existing.is_dir():
        return f"{folder} exists and is not a folder"
    if not probe:
        return None if os.access(existing, os.W_OK | os.X_OK) else f"{existing} is not writable"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".attention-conformance-probe-", dir=existing))
    except OSError as exc:
        return f"{existing} is not writable ({exc.strerror or exc})"
    return None


def make_folder(folder) -> Path:
    """folder, made if absent; FileRefused if it is a link, a file, or not writable."""
    problem = folder_problem(folder)
    if problem:
        raise FileRefused(problem)
    Path(folder).mkdir(parents=True, exist_ok=True)
    return Path(folder)


def write_file(path, data: str | bytes) -> Path:
    """Write path whole (text as UTF-8), replacing a link at its name, never following it."""
    path = Path(path)
    make_folder(path.parent)
    if path.is_dir() and not path.is_symlink():
        raise FileRefused(f"{path} is a folder, not a file")
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return path
