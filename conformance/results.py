"""The results of one certification run, kept for the summary and the reports."""

from __future__ import annotations

import hashlib
import json
import platform
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .paths import SPEC_DIR

STATUSES = ("pass", "fail", "xfail", "xpass", "unsupported")


def suite_version() -> str:
    try:
        from importlib.metadata import version
        return version("attention-conformance")
    except Exception:
        return "unknown"


def spec_hash(spec_dir: Path = SPEC_DIR) -> str:
    digest = hashlib.sha256()
    for path in sorted(spec_dir.rglob("*")):
        if path.is_file() and path.suffix in (".yaml", ".json") or path.name == "SHA256SUMS":
            digest.update(str(path.relative_to(spec_dir)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@dataclass
class ResultLog:
    info: dict
    spec: object
    records: list = field(default_factory=list)

    def record(self, item, status, message, seconds, ratio=0.0):
        expected = getattr(item, "expected_reason", None)
        if expected is not None:
            status = {"fail": "xfail", "pass": "xpass"}.get(status, status)
        self.records.append({
            "id": item.test_id, "topic": item.case.topic, "case": item.case.id,
            "variant": item.variant.label, "dtype": item.dtype, "status": status,
            "message": message if status != "xfail" else f"{expected}\n{message}",
            "seconds": round(seconds, 6), "error_over_tolerance": ratio,
        })

    def finish(self):
        pass

    def counts(self, key=None) -> dict:
        table = defaultdict(Counter)
        for r in self.records:
            table[r[key] if key else "all"][r["status"]] += 1
        return {k: dict(v) for k, v in sorted(table.items())}

    def worst_ratio_by_dtype(self) -> dict:
        worst = {}
        for r in self.records:
            if r["status"] == "pass":
                worst[r["dtype"]] = max(worst.get(r["dtype"], 0.0), r["error_over_tolerance"])
        return worst

    def as_dict(self) -> dict:
        return {
            "backend": self.info,
            "versions": {"python": platform.python_version(), "suite": suite_version(),
                         **self.info.get("versions", {})},
            "spec_hash": spec_hash(),
            "cases": len(self.spec.cases),
            "totals": self.counts().get("all", {}),
            "by_topic": self.counts("topic"),
            "by_dtype": self.counts("dtype"),
            "worst_error_over_tolerance": self.worst_ratio_by_dtype(),
            "results": self.records,
        }

    def write(self, directory: Path) -> list[Path]:
        from .report import backend_markdown

        directory.mkdir(parents=True, exist_ok=True)
        data = self.as_dict()
        name = self.info["name"]
        json_path = directory / f"{name}.json"
        json_path.write_text(json.dumps(data, indent=1, default=str))
        md_path = directory / f"{name}.md"
        md_path.write_text(backend_markdown(data))
        return [json_path, md_path]
