"""Reports: the end-of-run summary, a backend's Markdown report, the matrix of backends."""

from __future__ import annotations

import json
from pathlib import Path

from .interface import POLICIES

_COLUMNS = ("pass", "fail", "xfail", "xpass", "unsupported")


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header, rows) -> list[str]:
    return [_row(header), _row(["---"] * len(header))] + [_row(r) for r in rows]


def summary_lines(log) -> list[str]:
    data = log.as_dict()
    totals = data["totals"]
    lines = ["", f"attention-conformance: backend {data['backend']['name']!r}, "
             f"{data['cases']} cases in spec {data['spec_hash']}"]
    lines.append("  " + ", ".join(f"{totals.get(c, 0)} {c}" for c in _COLUMNS))
    worst = data["worst_error_over_tolerance"]
    if worst:
        lines.append("  worst error / tolerance: " +
                     ", ".join(f"{d} {r:.2f}" for d, r in sorted(worst.items())))
    lines.append("  policies: " + ", ".join(f"{k}={v}" for k, v in
                                            sorted(data["backend"]["policy"].items())))
    return lines


def backend_markdown(data: dict) -> str:
    b = data["backend"]
    out = [f"# Certification of backend `{b['name']}`", "",
           f"Spec {data['spec_hash']}, {data['cases']} cases; versions: " +
           ", ".join(f"{k} {v}" for k, v in data["versions"].items()), "",
           "## Totals", ""]
    out += _table(("", *_COLUMNS), [("all", *(data["totals"].get(c, 0) for c in _COLUMNS))])
    for key, title in (("by_topic", "topic"), ("by_dtype", "dtype")):
        out += ["", f"## By {title}", ""]
        out += _table((title, *_COLUMNS),
                      [(k, *(v.get(c, 0) for c in _COLUMNS)) for k, v in data[key].items()])
    out += ["", "## Worst error as a fraction of the tolerance", ""]
    out += _table(("dtype", "worst error / tolerance"),
                  [(d, f"{r:.3f}") for d, r in sorted(data["worst_error_over_tolerance"].items())])
    out += ["", "## Declared policies", ""]
    out += _table(("policy", "choice"), sorted(b["policy"].items()))
    failures = [r for r in data["results"] if r["status"] in ("fail", "xpass", "xfail")]
    if failures:
        out += ["", "## Failures and expected failures", ""]
        for r in failures:
            first = r["message"].splitlines()[0] if r["message"] else ""
            out.append(f"- `{r['id']}` ({r['status']}): {first}")
    return "\n".join(out) + "\n"


def load_results(directory: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(directory).glob("*.json"))]


def matrix_markdown(results: list[dict]) -> str:
    """All backends side by side: totals, per topic, worst errors, declared policies."""
    names = [r["backend"]["name"] for r in results]
    out = ["# Attention conformance matrix", ""]
    out += _table(("backend", *_COLUMNS, "spec"),
                  [(r["backend"]["name"], *(r["totals"].get(c, 0) for c in _COLUMNS),
                    r["spec_hash"]) for r in results])
    topics = sorted({t for r in results for t in r["by_topic"]})
    out += ["", "## Passed / run, per topic", ""]
    out += _table(("topic", *names),
                  [(t, *(_fraction(r["by_topic"].get(t, {})) for r in results)) for t in topics])
    out += ["", "## Declared policies", ""]
    out += _table(("policy", *names),
                  [(p, *(r["backend"]["policy"].get(p, "-") for r in results)) for p in POLICIES])
    dtypes = sorted({d for r in results for d in r["worst_error_over_tolerance"]})
    out += ["", "## Worst error / tolerance", ""]
    out += _table(("dtype", *names),
                  [(d, *(f"{r['worst_error_over_tolerance'].get(d, 0):.2f}" for r in results))
                   for d in dtypes])
    return "\n".join(out) + "\n"


def _fraction(counts: dict) -> str:
    run = sum(v for k, v in counts.items() if k != "unsupported")
    ok = counts.get("pass", 0) + counts.get("xfail", 0)
    extra = f" ({counts['xfail']} xfail)" if counts.get("xfail") else ""
    return f"{ok}/{run}{extra}" if counts else "-"
