"""Golden data, stored: outputs of the float64 reference, frozen under spec/golden.

One npz per topic holds, for each case, variant, dtype (and policy choice where a case
has one), every output and the error of the plain same-dtype computation that sets its
tolerance. The arrays are packed into two members, ``values`` (every array flattened
and concatenated, float64) and ``index`` (JSON text as bytes: each array's name,
offset and shape), so that a topic loads with two reads instead of one per array;
``load_topic`` unpacks them into named read-only views. SHA256SUMS lists every file's
hash; a file that is missing or does not match its hash fails the cases that need it,
with that reason. Files are written with fixed zip timestamps, so regenerating
unchanged data changes no byte.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .compute import ACCUMULATION_DTYPES, FLOAT32_TIER, compute, entry_key
from ..model.case import frozen
from ..model.ops import OPS
from ..model.files import write_file
from ..model.folder import SpecFolder, default_folder
from ..model.tolerances import Tolerances

MANIFEST = "SHA256SUMS"
PACK_FORMAT = "golden-pack-1"


class GoldenError(Exception):
    """Golden data missing, truncated or not matching the manifest."""


def write_npz(path: Path, arrays: dict, level: int | None = None) -> None:
    """Write arrays as an npz file whose bytes depend on the arrays alone (fixed dates,
    sorted names); level: zlib's compression level (None: its default, 6)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(arrays):
            data = io.BytesIO()
            np.lib.format.write_array(data, np.asarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data.getvalue(), compresslevel=level)
    write_file(path, buffer.getvalue())


def write_topic(path: Path, arrays: dict) -> None:
    """Pack a topic's float64 arrays into values + index (see the module docstring)."""
    names = sorted(arrays)
    flat = [np.asarray(arrays[name], dtype=np.float64).ravel() for name in names]
    offsets = np.cumsum([0] + [a.size for a in flat]).tolist()
    index = [[name, offsets[i], list(np.shape(arrays[name]))] for i, name in enumerate(names)]
    text = json.dumps({"format": PACK_FORMAT, "arrays": index}, separators=(",", ":"))
    write_npz(path, {"values": np.concatenate(flat) if flat else np.zeros(0),
                     "index": np.frombuffer(text.encode(), dtype=np.uint8)})


def _unpack(data) -> dict[str, np.ndarray]:
    index = json.loads(data["index"].tobytes())
    if index.get("format") != PACK_FORMAT:
        raise ValueError(f"not a packed golden file ({PACK_FORMAT})")
    values = data["values"]
    values.setflags(write=False)
    return {name: values[offset:offset + math.prod(shape)].reshape(shape)
            for name, offset, shape in index["arrays"]}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


#: a line as sha256sum writes it: the digest (either case), two spaces or a space and
#: the binary marker '*', the file name
_MANIFEST_LINE = re.compile(r"([0-9a-fA-F]{64}) [ *](\S.*)")


def read_manifest(directory: Path) -> dict[str, str]:
    """file name -> lower-case sha256 of the manifest; GoldenError naming the line when
    a line is not as sha256sum writes it, or lists a file twice with two digests."""
    manifest = directory / MANIFEST
    if not manifest.exists():
        return {}
    try:
        text = manifest.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GoldenError(f"{manifest} cannot be read: {type(exc).__name__}: {exc}") from None
    entries, lines = {}, {}
    for number, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        match = _MANIFEST_LINE.fullmatch(line)
        if not match:
            raise GoldenError(f"{manifest}:{number}: malformed line {line[:80]!r}: expected "
                              "'<64 hex digits>  <file name>' as sha256sum writes it "
                              "(run: attention-conformance golden regenerate)")
        digest, name = match.group(1).lower(), match.group(2)
        if name in entries and entries[name] != digest:
            raise GoldenError(f"{manifest}:{number}: {name} is listed again with another "
                              f"sha256 (first at line {lines[name]})")
        entries[name], lines[name] = digest, number
    return entries


def write_manifest(directory: Path) -> None:
    paths = sorted(directory.glob("*.npz"))
    for path in paths:
        if "\n" in path.name or "\r" in path.name or path.name != path.name.strip():
            raise GoldenError(f"golden file name {path.name!r} cannot be listed in {MANIFEST}: "
                              "a line break or an outer space would break its lines")
    lines = [f"{sha256(p)}  {p.name}" for p in paths]
    write_file(directory / MANIFEST, "\n".join(lines) + "\n")


def load_topic(directory: Path, topic: str) -> dict[str, np.ndarray]:
    """Every array of a topic's golden file, verified against the manifest."""
    path = directory / f"{topic}.npz"
    if not path.exists():
        raise GoldenError(f"golden file {path} is missing (run: attention-conformance golden regenerate)")
    expected = read_manifest(directory).get(path.name)
    if expected is None:
        raise GoldenError(f"golden file {path} is not listed in {directory / MANIFEST}")
    found = sha256(path)
    if found != expected:
        raise GoldenError(f"golden file {path} does not match its sha256 in {MANIFEST} "
                          f"(listed {expected[:12]}..., file has {found[:12]}...; "
                          f"{path.stat().st_size} bytes: truncated or changed by hand?)")
    try:
        with np.load(path, allow_pickle=False) as data:
            return _unpack(data)
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, EOFError,
            zlib.error) as exc:
        raise GoldenError(f"golden file {path} cannot be read (truncated or corrupt): "
                          f"{type(exc).__name__}: {exc}") from None


@dataclass
class GoldenStore:
    """Golden arrays, loaded once per topic and only when first needed."""

    directory: Path | None = None         # default: the default spec folder's golden/
    tolerances: Tolerances | None = None  # default: those of the folder above directory

    @classmethod
    def of(cls, folder: SpecFolder) -> "GoldenStore":
        """The golden data of a SpecFolder, with its tolerance rule."""
        return cls(folder.golden_dir, folder.tolerances)

    def __post_init__(self):
        if self.directory is None:
            self.directory = default_folder().golden_dir
        self.directory = Path(self.directory)
        if self.tolerances is None:
            self.tolerances = SpecFolder(self.directory.parent).tolerances
        self._topics: dict[str, dict | GoldenError] = {}

    def topic(self, topic: str) -> dict:
        if topic not in self._topics:
            try:
                self._topics[topic] = load_topic(self.directory, topic)
            except GoldenError as exc:
                self._topics[topic] = exc
        found = self._topics[topic]
        if isinstance(found, GoldenError):
            raise found
        return found

    def get(self, case, variant, dtype, policy=None,
            accumulation=None) -> dict[str, tuple[np.ndarray, float]]:
        """output -> (golden, plain_error); frozen for quick cases, live for the others.
        accumulation="float32" takes the float32 tier's plain error where the dtype has
        one (float16, bfloat16); anything else, the input-dtype tier."""
        if not frozen(case):
            return compute(case, variant, dtype, self.tolerances, policy, accumulation)
        data = self.topic(case.topic)
        key = entry_key(case.id, variant.label, dtype, policy)
        tier = (FLOAT32_TIER if accumulation == "float32" and dtype in ACCUMULATION_DTYPES
                else ".plain_error")
        try:
            return {name: (data[f"{key}/{name}"], float(data[f"{key}/{name}{tier}"]))
                    for name in OPS[case.op].outputs_for(case.inputs)}
        except KeyError:
            raise GoldenError(f"no golden entry {key} in {case.topic}.npz "
                              "(run: attention-conformance golden regenerate)") from None
