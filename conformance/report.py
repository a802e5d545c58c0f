"""Reports: the end-of-run summary, a backend's Markdown report, the matrix of backends
(Markdown, and a static HTML page with no script and no external resource)."""

from __future__ import annotations

import html
import json
from pathlib import Path

from .policies import POLICIES, POLICY_MEANING
from .results import FORMAT, STATUS_LABELS, safe_name

_COLUMNS = ("pass", "fail", "xfail", "xpass", "unsupported")
#: rows of the matrix's table of tests that do not pass everywhere
MAX_TEST_ROWS = 300
_HEADINGS = tuple(STATUS_LABELS[c] for c in _COLUMNS)


def _row(cells) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


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


def _cell(counts: dict) -> str:
    """'passed/run' for a table cell; run excludes unsupported, which is said apart."""
    if not counts:
        return "-"
    text = _fraction(counts)
    if counts.get("unsupported"):
        text += f", {counts['unsupported']} unsupported"
    return text


def _selection_text(selection: dict) -> str:
    parts = []
    if selection.get("profile") and selection["profile"] != "quick":
        parts.append(f"profile {selection['profile']}")
    if selection.get("dtypes"):
        parts.append("dtypes " + ", ".join(selection["dtypes"]))
    if selection.get("keyword"):
        parts.append(f"-k {selection['keyword']!r}")
    if selection.get("markexpr"):
        parts.append(f"-m {selection['markexpr']!r}")
    return "; ".join(parts)


def backend_markdown(data: dict) -> str:
    b = data["backend"]
    selection = _selection_text(data.get("selection") or {})
    out = [f"# Certification of backend `{b['name']}`", "",
           f"Spec `{data['spec_hash']}`, {data['cases']} cases"
           + (f" ({data['spec_errors']} spec problems)" if data.get("spec_errors") else "")
           + (f"; this run selected {selection}" if selection else "; the whole quick profile")
           + (f"; made {data['created']}" if data.get("created") else "") + ".", "",
           "Versions: " + ", ".join(f"{k} {v}" for k, v in data["versions"].items())
           + (f"; {data['platform']}" if data.get("platform") else "") + ".", "",
           f"Declared dtypes: {', '.join(b.get('dtypes', [])) or 'none'}.", "",
           "## Totals", ""]
    out += _table(("", *_HEADINGS), [("all", *(data["totals"].get(c, 0) for c in _COLUMNS))])
    for key, title in (("by_topic", "topic"), ("by_dtype", "dtype")):
        out += ["", f"## By {title}", ""]
        out += _table((title, *_HEADINGS),
                      [(k, *(v.get(c, 0) for c in _COLUMNS)) for k, v in data[key].items()])
    grid = data.get("by_topic_dtype") or {}
    if grid:
        dtypes = sorted({d for row in grid.values() for d in row})
        out += ["", "## Passed / run, per topic and dtype", ""]
        out += _table(("topic", *dtypes),
                      [(t, *(_cell(row.get(d, {})) for d in dtypes)) for t, row in grid.items()])
    out += ["", "## Worst error as a fraction of the tolerance", "",
            "Over the golden comparisons of the tests that passed; 1.0 is the tolerance.", ""]
    where = data.get("worst_test_by_dtype", {})
    out += _table(("dtype", "worst error / tolerance", "in test"),
                  [(d, f"{r:.3f}", f"`{where[d]}`" if d in where else "")
                   for d, r in sorted(data["worst_error_over_tolerance"].items())])
    out += ["", "## Declared policies", ""]
    out += _table(("policy", "choice", "question"),
                  [(name, choice, POLICY_MEANING.get(name, ""))
                   for name, choice in sorted(b["policy"].items())])
    if b.get("paths"):
        out += ["", "## Paths (native API or composed)", ""]
        out += _table(("op", "path"), sorted(b["paths"].items()))
    unsupported = {}
    for r in data["results"]:
        if r["status"] == "unsupported":
            reason = (r["message"] or "").splitlines()[0] if r["message"] else "unsupported"
            unsupported.setdefault(reason, []).append(r["id"])
    if unsupported:
        out += ["", "## Unsupported", ""]
        for reason, ids in sorted(unsupported.items(), key=lambda kv: -len(kv[1])):
            out.append(f"- {len(ids)} tests: {reason} (first: `{ids[0]}`)")
    failures = [r for r in data["results"] if r["status"] in ("fail", "xpass", "xfail")]
    if failures:
        out += ["", "## Failures and expected failures", ""]
        for r in failures:
            first = r["message"].splitlines()[0] if r["message"] else ""
            out.append(f"- `{r['id']}` ({STATUS_LABELS[r['status']]}): {first}")
    return "\n".join(out) + "\n"


def load_results(directory: Path) -> list[dict]:
    """Every backend report (BACKEND.json) in a folder; other JSON files are skipped."""
    results = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and (data.get("format") == FORMAT or
                                       {"backend", "totals", "results"} <= set(data)):
            results.append(data)
    return results


def _matrix_tables(results: list[dict]) -> list[tuple[str, str, tuple, list]]:
    """(id, title, header, rows) of every table of the matrix, shared by Markdown and HTML."""
    names = [r["backend"]["name"] for r in results]
    tables = [("totals", "Totals", ("backend", *_HEADINGS, "spec"),
               [(r["backend"]["name"], *(r["totals"].get(c, 0) for c in _COLUMNS),
                 r["spec_hash"]) for r in results])]
    topics = sorted({t for r in results for t in r["by_topic"]})
    tables.append(("topics", "Passed / run, per topic", ("topic", *names),
                   [(t, *(_cell(r["by_topic"].get(t, {})) for r in results)) for t in topics]))
    dtypes = sorted({d for r in results for d in r["by_dtype"]})
    tables.append(("dtypes", "Passed / run, per dtype", ("dtype", *names),
                   [(d, *(_cell(r["by_dtype"].get(d, {})) for r in results)) for d in dtypes]))
    worst = sorted({d for r in results for d in r["worst_error_over_tolerance"]})
    tables.append(("errors", "Worst error / tolerance (passing tests)", ("dtype", *names),
                   [(d, *(_ratio(r["worst_error_over_tolerance"].get(d)) for r in results))
                    for d in worst]))
    policies = list(POLICIES) + sorted({p for r in results for p in r["backend"]["policy"]}
                                       - set(POLICIES))
    tables.append(("policies", "Declared policies", ("policy", *names),
                   [(p, *(r["backend"]["policy"].get(p, "-") for r in results))
                    for p in policies]))
    status = [{t["id"]: t["status"] for t in r["results"]} for r in results]
    differ = sorted({i for s in status for i, v in s.items() if v != "pass"})
    tables.append(("tests", "Tests that do not pass everywhere", ("test", *names),
                   [(i, *(STATUS_LABELS.get(s.get(i), "-") for s in status))
                    for i in differ[:MAX_TEST_ROWS]]
                   + ([(f"... and {len(differ) - MAX_TEST_ROWS} more", *("" for _ in names))]
                      if len(differ) > MAX_TEST_ROWS else [])))
    keys = []
    for r in results:
        keys += [k for k in r["versions"] if k not in keys]
    tables.append(("versions", "Versions", ("", *names),
                   [(k, *(r["versions"].get(k, "-") for r in results)) for k in keys]
                   + [("selection", *(_selection_text(r.get("selection") or {}) or "quick profile"
                                      for r in results))]))
    return tables


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def matrix_markdown(results: list[dict]) -> str:
    """All backends side by side: totals, per topic and dtype, worst errors, policies."""
    out = ["# Attention conformance matrix", ""]
    hashes = sorted({r["spec_hash"] for r in results})
    if len(hashes) > 1:
        out += [f"**Warning**: these reports were made against {len(hashes)} different specs "
                f"({', '.join(hashes)}); they do not compare case for case.", ""]
    for index, (_, title, header, rows) in enumerate(_matrix_tables(results)):
        if index:
            out += ["", f"## {title}", ""]
        out += _table(header, rows)
    return "\n".join(out) + "\n"


def _fraction(counts: dict) -> str:
    run = sum(v for k, v in counts.items() if k != "unsupported")
    ok = counts.get("pass", 0) + counts.get("xfail", 0)
    extra = f" ({counts['xfail']} xfail)" if counts.get("xfail") else ""
    return f"{ok}/{run}{extra}" if counts else "-"


_CSS = """
body { font: 15px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #bbb; padding: 0.25em 0.7em; text-align: left; }
th { background: #eee; }
td.ok { background: #d8f0d8; }
td.bad { background: #f6d0d0; }
td.partial { background: #fbeec8; }
td.none { color: #888; }
p.warning { background: #f6d0d0; padding: 0.5em; }
code { font-size: 90%; }
"""


def _css_class(table_id: str, column: int, value) -> str:
    """ok / bad / partial / none for a status cell, '' for anything else."""
    text = str(value)
    if column == 0 or table_id in ("policies", "versions"):
        return ""
    if text in ("-", ""):
        return "none"
    if table_id == "tests":
        return {"pass": "ok", "fail": "bad", "unexpected pass": "bad",
                "expected failure": "partial"}.get(text, "")
    if table_id == "totals":
        if column in (2, 4) and text != "0":        # fail, unexpected pass
            return "bad"
        return ""
    if table_id == "errors":
        try:
            return "ok" if float(text) <= 1 else "bad"
        except ValueError:
            return ""
    if "/" in text:
        passed, run = text.split(",")[0].split(" ")[0].split("/")
        return "ok" if passed == run else ("bad" if passed == "0" else "partial")
    return ""


def matrix_html(results: list[dict]) -> str:
    """The matrix as one static HTML page (inline CSS, no script)."""
    e = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             "<title>Attention conformance matrix</title>", f"<style>{_CSS}</style>",
             "</head>", "<body>", "<h1>Attention conformance matrix</h1>"]
    names = ", ".join(e(r["backend"]["name"]) for r in results)
    parts.append(f"<p>{len(results)} backends: {names}. A cell reads "
                 "<em>passed/run</em> (expected failures count as passed, unsupported tests "
                 "are not run).</p>")
    hashes = sorted({r["spec_hash"] for r in results})
    if len(hashes) > 1:
        parts.append(f'<p class="warning">These reports were made against {len(hashes)} '
                     f"different specs ({e(', '.join(hashes))}).</p>")
    for table_id, title, header, rows in _matrix_tables(results):
        parts.append(f'<h2 id="h-{table_id}">{e(title)}</h2>')
        parts.append(f'<table id="{table_id}">')
        parts.append("<thead><tr>" + "".join(f"<th>{e(str(h))}</th>" for h in header)
                     + "</tr></thead>")
        parts.append("<tbody>")
        for row in rows:
            cells = []
            for column, value in enumerate(row):
                tag = "th" if column == 0 else "td"
                css = _css_class(table_id, column, value)
                attr = f' class="{css}"' if css and tag == "td" else ""
                cells.append(f"<{tag}{attr}>{e(str(value))}</{tag}>")
            parts.append("<tr>" + "".join(cells) + "</tr>")
        parts.append("</tbody></table>")
    parts += ["</body>", "</html>"]
    return "\n".join(parts) + "\n"


def write_matrix(results: list[dict], directory: Path) -> list[Path]:
    """matrix.md and matrix.html into directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    md, page = directory / "matrix.md", directory / "matrix.html"
    md.write_text(matrix_markdown(results))
    page.write_text(matrix_html(results))
    return [md, page]


def write_backend_report(log, directory: Path) -> list[Path]:
    """A run's NAME.json and NAME.md in directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    data = log.as_dict()
    name = safe_name(log.info["name"])
    json_path = directory / f"{name}.json"
    json_path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    md_path = directory / f"{name}.md"
    md_path.write_text(backend_markdown(data))
    return [json_path, md_path]
