"""A cache of case files already found valid, so that a run does not re-validate them.

Validating the spec (YAML with line tracking, JSON Schema, static checks that build
every input) costs seconds, in every pytest process and every xdist worker. A case
file that loaded with no problem at all is stored here as plain JSON (its topic, and
each case's data and line), under a key that hashes the file's bytes, the schema, the
dtypes with a tolerance and the source of the package that validated it: any change
to one of them is a miss, and a miss validates in full. Files with a problem are
never stored, so every error is found afresh, with its file, line and case id.

The cache is an optimisation, never a source of truth: an entry is used only if it
carries an HMAC-SHA256, under this user's secret key, of its key and its text, which
only this code writes, after validating the very bytes the key hashes. The key lives
outside the cache folder (``$XDG_CONFIG_HOME/attention-conformance/cache-key``, else
``~/.config/...``, or $ATTENTION_CONFORMANCE_CACHE_KEY), created on first use with mode
0600; a key that is a link, not a regular file, not the user's or readable by others
turns the cache off. Whoever can write the cache folder but not read the key (an
entry edited by hand, a cache restored in CI from another job, a shared or copied
folder) cannot make an entry this code accepts: it is a miss, validated again from the
YAML. The alternatives defeat less: a hash of the validated form stored beside it is
recomputed by whoever edits it, and cheap invariants (limits, the schema) pass a forged
expectation that is valid (``expect: {properties: [finite]}``), while comparing with
the YAML costs the parse the cache saves. Who can read the key can also edit the
package or the spec itself.

JSON, not pickle: reading the cache cannot run code. A cache that cannot be read or
written is ignored. The folder is $ATTENTION_CONFORMANCE_CACHE (``off`` disables
it), else $XDG_CACHE_HOME/attention-conformance, else ~/.cache/attention-conformance.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import secrets
import stat
import struct
from pathlib import Path

from ..model.files import write_file

_FORMAT = "spec-cache-2"
KEY_ENV = "ATTENTION_CONFORMANCE_CACHE_KEY"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def cache_dir() -> Path | None:
    override = os.environ.get("ATTENTION_CONFORMANCE_CACHE")
    if override:
        return None if override.lower() in ("off", "0", "no", "false") else Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attention-conformance"


def key_file() -> Path:
    override = os.environ.get(KEY_ENV)
    if override:
        return Path(override)
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "attention-conformance" / "cache-key"


def _secret() -> bytes | None:
    """This user's key, made on first use; None (no entry is read or written) when it
    cannot be made or trusted, or lies inside the cache folder it would vouch for."""
    path, folder = Path(os.path.abspath(key_file())), cache_dir()
    if folder is None or Path(os.path.abspath(folder)) in (path, *path.parents):
        return None
    try:
        return _read_secret(path)
    except FileNotFoundError:
        pass
    except OSError:
        return None
    try:
        _make_secret(path)
        return _read_secret(path)
    except OSError:
        return None


def _read_secret(path: Path) -> bytes:
    descriptor = os.open(path, os.O_RDONLY | _NOFOLLOW)       # a link: ELOOP
    try:
        info = os.fstat(descriptor)
        owner = os.getuid() if hasattr(os, "getuid") else info.st_uid
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077 or info.st_uid != owner:
            raise PermissionError(f"{path}: not a private file of this user")
        secret = os.read(descriptor, 4096)
    finally:
        os.close(descriptor)
    if len(secret) < 32:
        raise PermissionError(f"{path}: too short to be a key")
    return secret


def _make_secret(path: Path) -> None:
    """Write a new key under another name, then link it into place: another process
    reads the whole key or none (a race lost to one leaves the winner's)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    try:
        os.write(descriptor, secrets.token_hex(32).encode())
    finally:
        os.close(descriptor)
    try:
        os.link(temporary, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(temporary)


def _mac(secret: bytes, key: str, text: bytes) -> bytes:
    return hmac.new(secret, key.encode() + b"\n" + text, hashlib.sha256).hexdigest().encode()


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
    """The stored {topic, cases: [{line, data}]} of a valid file, or None: no entry, or
    one this code did not write for this key (its MAC does not verify)."""
    folder, secret = cache_dir(), _secret()
    if folder is None or secret is None:
        return None
    try:
        mac, _, text = (folder / f"{key}.json").read_bytes().partition(b"\n")
        if not hmac.compare_digest(mac, _mac(secret, key, text)):
            return None
        stored = json.loads(text)
    except (OSError, ValueError):
        return None
    return stored if isinstance(stored, dict) and stored.get("format") == _FORMAT else None


def write(key: str, topic: str, cases: list[tuple[int, dict]]) -> None:
    """Store a valid file; silently skipped when its data do not survive JSON intact."""
    folder, secret = cache_dir(), _secret()
    if folder is None or secret is None:
        return
    entry = {"format": _FORMAT, "topic": topic,
             "cases": [{"line": line, "data": data} for line, data in cases]}
    text = json.dumps(entry, ensure_ascii=False)
    if not _same(json.loads(text), entry):   # e.g. a non-string key: validate every time
        return
    text = text.encode("utf-8")
    try:
        write_file(folder / f"{key}.json", _mac(secret, key, text) + b"\n" + text)
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
