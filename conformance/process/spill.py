"""Arrays too large for a frame (wire.py): the judge writes each input array of
SPILL_BYTES or more to a file of its own in the run's temporary folder (the judge's,
which the runner removes whatever happens) and sends its name; the backend's process
reads it into a fresh array and deletes it. So a call whose inputs pass the frame limit
(a GPU-sized mask of 2^31 elements) crosses the process boundary, and every smaller
array goes in the frame as before.

The folder is opened once, without following a link (O_NOFOLLOW), and every file is
made and opened relative to it: a folder replaced by a link meanwhile is not written
through. A file is made new (O_EXCL, a random name, mode 0600) and a name that is not
one of these is refused. What the backend's process has not deleted (it died first)
the judge deletes when it ends that process (SpillFolder.clear()).
"""

from __future__ import annotations

import os
import re
import secrets
import stat

import numpy as np

#: arrays of this many bytes or more go through a file (those below in the frame)
SPILL_BYTES = 64 << 20
_NAME = re.compile(r"spill-[0-9a-f]{32}\.bin")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class SpillError(Exception):
    """A spilled array that is not what its message says."""


class SpillFolder:
    """The folder one end of a channel writes large arrays to (the judge's) or reads
    them from (the backend's)."""

    def __init__(self, path: str):
        self.path = path
        self.names: list[str] = []      # written here, maybe not yet deleted by the reader
        self._fd: int | None = None

    def _folder(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW | _CLOEXEC)
        return self._fd

    def write(self, array: np.ndarray) -> str:
        """The name of a new file holding the array's bytes (C order)."""
        folder = self._folder()
        self.names = [n for n in self.names if _exists(n, folder)]   # those the reader took
        name = f"spill-{secrets.token_hex(16)}.bin"
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600,
                     dir_fd=folder)
        self.names.append(name)
        try:
            with open(fd, "wb", buffering=0) as f:
                view = memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
                while view:
                    view = view[f.write(view):]
        except BaseException:
            _unlink(name, folder)
            raise
        return name

    def read(self, name, dtype: np.dtype, shape) -> np.ndarray:
        """The array a file holds, as a fresh base ndarray; the file is deleted."""
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise SpillError(f"not a spilled array's name: {name!r}"[:200])
        try:
            folder = self._folder()
            fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _CLOEXEC, dir_fd=folder)
        except OSError as exc:
            raise SpillError(f"spilled array {name} cannot be read: {exc}") from None
        try:
            array = np.empty(shape, dtype)
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size != array.nbytes:
                raise SpillError(f"spilled array {name} holds {info.st_size} bytes, "
                                 f"not the {array.nbytes} of {dtype}{list(shape)}")
            with open(fd, "rb", buffering=0, closefd=False) as f:
                view = memoryview(array.reshape(-1).view(np.uint8))
                while view:
                    got = f.readinto(view)
                    if not got:
                        raise SpillError(f"spilled array {name} ended early")
                    view = view[got:]
            return array
        finally:
            os.close(fd)
            _unlink(name, folder)

    def clear(self) -> None:
        """Delete what this end wrote and the reader did not take; close the folder."""
        if self._fd is not None:
            for name in self.names:
                _unlink(name, self._fd)
            os.close(self._fd)
        self.names, self._fd = [], None


def _exists(name: str, folder: int) -> bool:
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
        return True
    except OSError:
        return False


def _unlink(name: str, folder: int) -> None:
    try:
        os.unlink(name, dir_fd=folder)
    except OSError:
        pass
