"""The results of one certification run, kept for the summary and the reports.

A report (``BACKEND.json``) is plain JSON; its keys are documented in docs/cli.md. The
``format`` key names its version, so that ``attention-conformance report`` can tell a
report from any other JSON file in the same folder.
"""

from __future__ import annotations

import datetime
import hashlib
import platform
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from ..model.case import profile_counts
from ..model.policies import POLICY_MEANING
from ..model.folder import default_folder

FORMAT = "attention-conformance-report/1"
#: how each status is printed in reports
STATUS_LABELS = {"pass": "pass", "fail": "fail", "timeout": "timeout", "crash": "crash",
                 "error": "error", "xfail": "expected failure", "xpass": "unexpected pass",
                 "unsupported": "unsupported"}
#: every status a test can end in (those of web-platform-tests' harness, plus expected
#: failure and unsupported), in the order reports print them
STATUSES = tuple(STATUS_LABELS)
#: the statuses that fail a run
FAILING = ("fail", "timeout", "crash", "error", "xpass")


def suite_version() -> str:
    try:
        from importlib.metadata import version
        return version("attention-conformance")
    except Exception:
        return "unknown"


def spec_hash(spec_dir: Path) -> str:
    """sha256 (first 16 hex digits) of the spec's case files, schema, tolerances and
    golden manifest: two reports with the same hash were made against the same spec."""
    spec_dir = Path(spec_dir)
    digest = hashlib.sha256()
    for path in sorted(spec_dir.rglob("*")):
        if path.is_file() and path.suffix in (".yaml", ".json") or path.name == "SHA256SUMS":
            digest.update(str(path.relative_to(spec_dir)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def record_for(item, status, message, seconds, ratio=0.0, traceback="") -> dict:
    """One test's entry of a report (plain data, so that it survives pytest-xdist);
    traceback: the frames behind a failure, kept whole (the message keeps every line too).
    A test an expected-failure entry names (item.expected_entry) is xfail when it fails,
    xpass when it passes."""
    entry = getattr(item, "expected_entry", None)
    if entry is not None:
        status = {"fail": "xfail", "pass": "xpass"}.get(status, status)
    return {
        "id": item.test_id, "topic": item.case.topic, "case": item.case.id,
        "variant": item.variant.label, "dtype": item.dtype, "status": status,
        "message": _expected_message(status, message, entry),
        "seconds": round(seconds, 6), "error_over_tolerance": float(ratio),
        "traceback": traceback,
    }


def _expected_message(status, message, entry) -> str:
    """An expected failure's message: the entry's reason, then the failure's; an
    unexpected pass's: the entry that went stale (its pattern, file:line and reason)."""
    if status == "xfail":
        return f"{entry.reason}\n{message}"
    if status == "xpass":
        return (f"unexpected pass: the expected failure {entry.match!r} ({entry.where}) "
                f"no longer fails; its reason: {entry.reason}")
    return message


@dataclass
class ResultLog:
    info: dict
    spec: object
    records: list = field(default_factory=list)
    spec_dir: Path | None = None        # the spec/ folder the cases came from
    selection: dict = field(default_factory=dict)
    interrupted: bool = False           # the run was stopped before its end
    not_run: list = field(default_factory=list)     # ids of selected tests that never ran

    def add(self, entry: dict) -> None:
        self.records.append(entry)

    def finish(self):
        self.records.sort(key=lambda r: r["id"])

    def counts(self, key=None) -> dict:
        table = defaultdict(Counter)
        for r in self.records:
            table[r[key] if key else "all"][r["status"]] += 1
        return {k: dict(v) for k, v in sorted(table.items())}

    def counts_by_topic_and_dtype(self) -> dict:
        table = defaultdict(lambda: defaultdict(Counter))
        for r in self.records:
            table[r["topic"]][r["dtype"]][r["status"]] += 1
        return {t: {d: dict(c) for d, c in sorted(v.items())} for t, v in sorted(table.items())}

    def worst_ratio_by_dtype(self) -> dict:
        """dtype -> largest error / tolerance over the golden comparisons of passing tests."""
        return {d: r for d, (r, _) in self._worst().items()}

    def _worst(self) -> dict:
        worst = {}
        for r in self.records:
            if r["status"] in ("pass", "xpass"):
                ratio = r["error_over_tolerance"]
                if r["dtype"] not in worst or ratio > worst[r["dtype"]][0]:
                    worst[r["dtype"]] = (ratio, r["id"])
        return dict(sorted(worst.items()))

    def as_dict(self) -> dict:
        spec_dir = Path(self.spec_dir) if self.spec_dir else default_folder().root
        policy = self.info.get("policy", {})
        return {
            "format": FORMAT,
            "backend": self.info,
            "versions": {"python": platform.python_version(), "suite": suite_version(),
                         **self.info.get("versions", {})},
            "platform": platform.platform(terse=True),
            "created": datetime.datetime.now(datetime.timezone.utc)
                               .isoformat(timespec="seconds"),
            "spec_hash": spec_hash(spec_dir),
            "spec_dir": str(spec_dir),
            "cases": len(self.spec.cases),
            "profile_cases": profile_counts(self.spec.cases,
                                            self.selection.get("profile") or "quick")[0],
            "spec_errors": len(getattr(self.spec, "errors", ())),
            "spec_problems": [str(e) for e in getattr(self.spec, "errors", ())],
            "selection": self.selection,
            "complete": not self.interrupted and not self.not_run,
            "interrupted": self.interrupted,
            "not_run": len(self.not_run),
            "not_run_tests": sorted(self.not_run),
            "totals": self.counts().get("all", {}),
            "by_topic": self.counts("topic"),
            "by_dtype": self.counts("dtype"),
            "by_topic_dtype": self.counts_by_topic_and_dtype(),
            "worst_error_over_tolerance": self.worst_ratio_by_dtype(),
            "worst_test_by_dtype": {d: t for d, (_, t) in self._worst().items()},
            "policies": {name: {"choice": choice, "meaning": POLICY_MEANING.get(name, "")}
                         for name, choice in sorted(policy.items())},
            "results": self.records,
        }


def safe_name(name: str) -> str:
    """A backend name usable as a file name."""
    cleaned = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(name))
    return cleaned.strip(".") or "backend"
