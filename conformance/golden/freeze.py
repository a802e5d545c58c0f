"""Golden data, frozen: regenerating the files from the reference, and checking that the
frozen data still match it. Regenerating keeps every array the reference reproduces
within GOLDEN_RTOL, so that another machine's BLAS (~1e-16) changes no byte."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .compute import FLOAT32_TIER, compute_case
from .store import GoldenError, GoldenStore, _unpack, load_topic, write_manifest, write_topic
from ..model.files import make_folder
from ..model.case import frozen
from ..model.folder import SpecFolder

GOLDEN_RTOL = 1e-12   # the reference's own run-to-run spread (BLAS, machine) is ~1e-16
#: the suffixes of the plain errors: how far a plain computation in the case's dtype
#: (or accumulating in float32) lands from the reference. They are that BLAS's own
#: rounding (its kernels, its thread count: 1 and 2 OpenBLAS threads differ by ~5 % of
#: a float16 error), so the frozen ones are kept, and never reported as a change
PLAIN_ERRORS = (".plain_error", FLOAT32_TIER)


def _golden_of(target) -> tuple[Path, object]:
    """(golden folder, tolerances) of a SpecFolder, or of a golden folder, as the
    GoldenStore of either finds them."""
    store = GoldenStore.of(target) if isinstance(target, SpecFolder) else GoldenStore(Path(target))
    return store.directory, store.tolerances


def _by_topic(cases):
    topics: dict[str, list] = {}
    for case in cases:
        if frozen(case):
            topics.setdefault(case.topic, []).append(case)
    return topics


def _changes(old: dict, new: dict) -> list[tuple[str, str]]:
    """(key, what changed) for every array added, removed or changed."""
    changes = []
    for key in sorted(set(old) | set(new)):
        if key.endswith(PLAIN_ERRORS):
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


def regenerate(cases, folder) -> list[tuple[str, str]]:
    """Recompute and write every golden file of a SpecFolder (or of a golden folder);
    return what changed."""
    directory, tolerances = _golden_of(folder)
    make_folder(directory)
    changes = []
    topics = _by_topic(cases)
    for topic, topic_cases in topics.items():
        new = {}
        for case in topic_cases:
            new.update(compute_case(case, tolerances))
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
        if key in old and not key.endswith(PLAIN_ERRORS) and _close(old[key], now, rtol):
            new[key] = old[key]
            for error in (key + suffix for suffix in PLAIN_ERRORS):
                if error in old and error in new:
                    new[error] = old[error]


def check(cases, folder, rtol=GOLDEN_RTOL) -> list[str]:
    """Problems found comparing a SpecFolder's (or a golden folder's) frozen golden data
    with the reference now."""
    directory, tolerances = _golden_of(folder)
    problems = []
    for topic, topic_cases in _by_topic(cases).items():
        try:
            frozen = load_topic(directory, topic)
        except GoldenError as exc:
            problems.append(str(exc))
            continue
        new = {}
        for case in topic_cases:
            new.update(compute_case(case, tolerances))
        for key, what in _changes(frozen, new):
            old, now = frozen.get(key), new.get(key)
            if old is not None and now is not None and _close(old, now, rtol):
                continue
            problems.append(f"{topic}.npz {key}: {what}")
    return problems
