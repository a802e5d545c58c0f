"""Golden data: outputs of the float64 reference, frozen under spec/golden.

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
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import reference
from .dtypes import UNIT_ROUNDOFF, round_to
from .inputs import build_inputs
from .interface import OUTPUTS
from .paths import GOLDEN_DIR
from .tolerances import load_tolerances

MANIFEST = "SHA256SUMS"
PACK_FORMAT = "golden-pack-1"
GOLDEN_RTOL = 1e-12   # the reference's own run-to-run spread (BLAS, machine) is ~1e-16


class GoldenError(Exception):
    """Golden data missing, truncated or not matching the manifest."""


def entry_key(case_id, variant, dtype, policy=None) -> str:
    parts = [case_id, variant or "_", dtype]
    if policy:
        parts.append("{}={}".format(*policy))
    return "/".join(parts)


_GENERATED: dict = {}


def generated_inputs(case, variant) -> dict[str, np.ndarray]:
    """The case's float64 inputs, generated once per variant (read-only, shared by dtypes)."""
    key = (repr(case.inputs), repr(variant.dims))
    if key not in _GENERATED:
        if len(_GENERATED) >= 256:
            _GENERATED.clear()
        arrays = build_inputs(case.inputs, variant.dims)
        for array in arrays.values():
            array.setflags(write=False)
        _GENERATED[key] = arrays
    return _GENERATED[key]


def rounded_inputs(case, variant, dtype) -> dict[str, np.ndarray]:
    """The case's inputs as the backend sees them, in float64 (bool masks unchanged)."""
    arrays = generated_inputs(case, variant)
    return {n: a.copy() if a.dtype == bool else round_to(a, dtype) for n, a in arrays.items()}


def golden_entries(case):
    """(policy or None) for every golden a case needs: the plain one and per choice."""
    if case.expect.get("golden"):
        yield None
    for name, choices in case.expect.get("policy", {}).items():
        for choice, outcome in choices.items():
            if outcome.get("golden"):
                yield (name, choice)


def compute(case, variant, dtype, policy=None) -> dict[str, tuple[np.ndarray, float]]:
    """output name -> (golden float64 array, plain same-dtype error)."""
    arrays = rounded_inputs(case, variant, dtype)
    policies = dict([policy]) if policy else None
    source = load_tolerances().plain_error_from.get(dtype, dtype)
    # NaN, inf and overflow are expected here: policies, poisoned inputs, plain float16
    with np.errstate(all="ignore"):
        exact = reference.run(case.op, arrays, case.params, policies)
        with reference.rounded_to(source):
            plain = reference.run(case.op, arrays, case.params, policies)
    factor = UNIT_ROUNDOFF[dtype] / UNIT_ROUNDOFF[source]
    roundings = math.sqrt(longest_reduction(arrays))
    result = {}
    for name, gold, approx in zip(OUTPUTS[case.op], exact, plain):
        both = np.isfinite(gold) & np.isfinite(approx)
        error = float(np.max(np.abs(gold - approx)[both], initial=0.0)) * factor
        largest = float(np.max(np.abs(gold[np.isfinite(gold)]), initial=0.0))
        result[name] = (gold, max(error, roundings * UNIT_ROUNDOFF[dtype] * largest))
    return result


def longest_reduction(arrays) -> int:
    """The longest sum an op can make over these inputs: their largest trailing dim."""
    dims = [max(a.shape[-2:]) for a in arrays.values() if a.ndim and a.dtype != bool]
    return max(dims, default=1)


def compute_case(case):
    """Every golden array of a case: {key/output: array, key/output.plain_error: scalar}."""
    arrays = {}
    for variant in case.variants:
        for dtype in case.dtypes:
            for policy in golden_entries(case):
                key = entry_key(case.id, variant.label, dtype, policy)
                for name, (gold, error) in compute(case, variant, dtype, policy).items():
                    arrays[f"{key}/{name}"] = gold
                    arrays[f"{key}/{name}.plain_error"] = np.array(error)
    return arrays


# --- files ----------------------------------------------------------------------------

def write_npz(path: Path, arrays: dict) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(arrays):
            data = io.BytesIO()
            np.lib.format.write_array(data, np.asarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data.getvalue())
    path.write_bytes(buffer.getvalue())


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


def read_manifest(directory: Path) -> dict[str, str]:
    manifest = directory / MANIFEST
    if not manifest.exists():
        return {}
    entries = {}
    for line in manifest.read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            entries[name.strip()] = digest
    return entries


def write_manifest(directory: Path) -> None:
    lines = [f"{sha256(p)}  {p.name}" for p in sorted(directory.glob("*.npz"))]
    (directory / MANIFEST).write_text("\n".join(lines) + "\n")


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

    directory: Path = GOLDEN_DIR

    def __post_init__(self):
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

    def get(self, case, variant, dtype, policy=None) -> dict[str, tuple[np.ndarray, float]]:
        """output -> (golden, plain_error); frozen for quick cases, live for long ones."""
        if case.profile == "long":
            return compute(case, variant, dtype, policy)
        data = self.topic(case.topic)
        key = entry_key(case.id, variant.label, dtype, policy)
        try:
            return {name: (data[f"{key}/{name}"], float(data[f"{key}/{name}.plain_error"]))
                    for name in OUTPUTS[case.op]}
        except KeyError:
            raise GoldenError(f"no golden entry {key} in {case.topic}.npz "
                              "(run: attention-conformance golden regenerate)") from None


# --- regenerate and check -------------------------------------------------------------

def _by_topic(cases):
    topics: dict[str, list] = {}
    for case in cases:
        if case.profile != "long":
            topics.setdefault(case.topic, []).append(case)
    return topics


def _changes(old: dict, new: dict) -> list[tuple[str, str]]:
    """(key, what changed) for every array added, removed or changed."""
    changes = []
    for key in sorted(set(old) | set(new)):
        if key.endswith(".plain_error"):
            continue
        if key not in old:
            changes.append((key, "added"))
        elif key not in new:
            changes.append((key, "removed"))
        elif old[key].shape != new[key].shape:
            changes.append((key, f"shape {old[key].shape} -> {new[key].shape}"))
        elif not np.array_equal(old[key], new[key], equal_nan=True):
            diff = np.nanmax(np.abs(old[key] - new[key]))
            changes.append((key, f"max abs change {diff:.3g}"))
    return changes


def regenerate(cases, directory: Path = GOLDEN_DIR) -> list[tuple[str, str]]:
    """Recompute and write every golden file; return what changed."""
    directory.mkdir(parents=True, exist_ok=True)
    changes = []
    topics = _by_topic(cases)
    for topic, topic_cases in topics.items():
        new = {}
        for case in topic_cases:
            new.update(compute_case(case))
        path = directory / f"{topic}.npz"
        old = {}
        if path.exists():
            with np.load(path, allow_pickle=False) as data:
                old = _unpack(data) if "index" in data.files else {n: data[n] for n in data.files}
        _keep_unchanged(old, new)
        changes += _changes(old, new)
        if new:
            write_topic(path, new)
        elif path.exists():
            path.unlink()
    for stale in directory.glob("*.npz"):
        if stale.stem not in topics:
            changes.append((stale.name, "removed (no quick cases left)"))
            stale.unlink()
    write_manifest(directory)
    return changes


def _close(old, now, rtol) -> bool:
    """Equal up to `rtol` of the array's magnitude, NaN where NaN (what check accepts)."""
    if old.shape != now.shape:
        return False
    scale = max(float(np.nanmax(np.abs(now), initial=0.0)), 1e-300)
    return bool(np.allclose(old, now, rtol=0, atol=rtol * scale, equal_nan=True))


def _keep_unchanged(old: dict, new: dict, rtol=GOLDEN_RTOL) -> None:
    """Keep the frozen array where the reference now differs only by its own rounding
    on this machine's BLAS (~1e-16): regenerating then changes only what changed."""
    for key, now in new.items():
        if key in old and not key.endswith(".plain_error") and _close(old[key], now, rtol):
            new[key] = old[key]
            error = key + ".plain_error"
            if error in old and error in new:
                new[error] = old[error]


def check(cases, directory: Path = GOLDEN_DIR, rtol=GOLDEN_RTOL) -> list[str]:
    """Problems found comparing the frozen golden data with the reference now."""
    problems = []
    for topic, topic_cases in _by_topic(cases).items():
        try:
            frozen = load_topic(directory, topic)
        except GoldenError as exc:
            problems.append(str(exc))
            continue
        new = {}
        for case in topic_cases:
            new.update(compute_case(case))
        for key, what in _changes(frozen, new):
            old, now = frozen.get(key), new.get(key)
            if old is not None and now is not None and _close(old, now, rtol):
                continue
            problems.append(f"{topic}.npz {key}: {what}")
    return problems
