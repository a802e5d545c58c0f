"""The matrix of backends as one static HTML page: inline CSS and a little inline script,
no external resource, every text from the reports escaped.

Cells are coloured by the rule of report.py (``tone``): grey where nothing ran, red for
failures and unexpected passes, amber where the only non-passes are expected failures,
green where everything that ran passed. The tests that do not pass are one row per
backend x case x status (report.failure_groups); the script filters those rows by
backend, topic and status, and keeps the filter in the URL hash
(``matrix.html#backend=torch&status=fail``) so that a filtered view can be linked.
"""

from __future__ import annotations

import html

from pathlib import Path

from ..model.files import make_folder, write_file
from .markdown import GROUP_HEADER, SEVERITY, _group_row, _matrix_tables, failure_groups, matrix_markdown
from .results import STATUS_LABELS

TONES = {
    "ok": ("#d8f0d8", "everything that ran passed"),
    "warn": ("#fbeec8", "expected failures only (documented findings), nothing else failed"),
    "bad": ("#f6d0d0", "a failure or an unexpected pass"),
    "none": ("#e4e4e4", "nothing ran (no test, or every test unsupported)"),
}

_CSS = """
body { font: 15px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 76em; color: #222;
       padding: 0 1em; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #bbb; padding: 0.25em 0.7em; text-align: left; vertical-align: top; }
thead th { background: #f2f2f2; }
td.ok { background: #d8f0d8; }
td.warn { background: #fbeec8; }
td.bad { background: #f6d0d0; }
td.none { background: #e4e4e4; color: #555; font-style: italic; }
td.num { text-align: right; }
p.warning { background: #f6d0d0; padding: 0.5em; }
span.swatch { display: inline-block; width: 1em; height: 1em; border: 1px solid #999;
              vertical-align: -0.15em; margin: 0 0.3em 0 1em; }
#failures tbody th { min-width: 12em; max-width: 22em; }
#failures td.reason { overflow-wrap: anywhere; }
#failures span.first { display: block; font-weight: normal; font-size: 80%; color: #555;
                       overflow-wrap: anywhere; }
td.nowrap { white-space: nowrap; }
form.filters { margin: 0.5em 0; }
form.filters label { margin-right: 1.2em; }
code { font-size: 90%; }
"""

#: filters the rows of #failures by their data-* attributes; the filter lives in the hash
_SCRIPT = """
(function () {
  var table = document.getElementById("failures");
  var selects = Array.prototype.slice.call(document.querySelectorAll("select[data-filter]"));
  var shown = document.getElementById("shown");
  function wanted() {
    var want = {};
    selects.forEach(function (s) { if (s.value) { want[s.dataset.filter] = s.value; } });
    return want;
  }
  function apply() {
    var want = wanted(), rows = table.tBodies[0].rows, visible = 0;
    for (var i = 0; i < rows.length; i++) {
      var row = rows[i], keep = true;
      for (var key in want) { if (row.dataset[key] !== want[key]) { keep = false; } }
      row.hidden = !keep;
      if (keep) { visible++; }
    }
    shown.textContent = visible + " of " + rows.length + " rows shown";
    var hash = new URLSearchParams(want).toString();
    if (location.hash.slice(1) !== hash) {
      try { history.replaceState(null, "", "#" + hash); } catch (e) { /* file: URL */ }
    }
  }
  function fromHash() {
    var params = new URLSearchParams(location.hash.slice(1));
    selects.forEach(function (s) {
      var value = params.get(s.dataset.filter) || "";
      var known = Array.prototype.some.call(s.options, function (o) { return o.value === value; });
      s.value = known ? value : "";
    });
    apply();
  }
  selects.forEach(function (s) { s.addEventListener("change", apply); });
  window.addEventListener("hashchange", fromHash);
  fromHash();
})();
"""


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _class(value, column: int, extra: str = "") -> str:
    classes = " ".join(c for c in (getattr(value, "tone", "") if column else "", extra) if c)
    return f' class="{classes}"' if classes else ""


def _table(table_id: str, header, rows) -> list[str]:
    parts = [f'<table id="{_e(table_id)}">',
             "<thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr></thead>",
             "<tbody>"]
    for row in rows:
        cells = []
        for column, value in enumerate(row):
            tag = "th" if column == 0 else "td"
            cells.append(f"<{tag}{_class(value, column)}>{_e(value)}</{tag}>")
        parts.append("<tr>" + "".join(cells) + "</tr>")
    parts.append("</tbody></table>")
    return parts


def _legend() -> str:
    items = "".join(f'<span class="swatch" style="background: {colour}"></span>{_e(meaning)}'
                    for colour, meaning in TONES.values())
    return f'<p class="legend">Colours:{items}.</p>'


def _select(name: str, label: str, options) -> str:
    choices = "".join(f'<option value="{_e(value)}">{_e(text)}</option>'
                      for value, text in options)
    return (f'<label>{_e(label)} <select data-filter="{_e(name)}" id="filter-{_e(name)}">'
            f'<option value="">all</option>{choices}</select></label>')


def _filters(groups: list[dict]) -> str:
    backends = sorted({g["backend"] for g in groups})
    topics = sorted({g["topic"] for g in groups})
    statuses = [s for s in SEVERITY if any(g["status"] == s for g in groups)]
    return ('<form class="filters" onsubmit="return false">'
            + _select("backend", "backend", [(b, b) for b in backends])
            + _select("topic", "topic", [(t, t) for t in topics])
            + _select("status", "status", [(s, STATUS_LABELS.get(s, s)) for s in statuses])
            + f'<span id="shown">{len(groups)} of {len(groups)} rows shown</span></form>')


def _failure_rows(groups: list[dict]) -> list[str]:
    """The rows of #failures: the case (and its first test below it), then the status,
    backend, topic, count and reason; data-* attributes for the filter."""
    header = GROUP_HEADER[:-1]
    parts = ['<table id="failures">',
             "<thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in header)
             + "</tr></thead>", "<tbody>"]
    extra = {2: "nowrap", 3: "nowrap", 4: "num nowrap", 5: "reason"}
    for g in groups:
        row = _group_row(g)
        attrs = "".join(f' data-{key}="{_e(g[key])}"' for key in ("backend", "topic", "status"))
        cells = [f'<th>{_e(row[0])}<span class="first">{_e(row[-1])}</span></th>'] + [
            f"<td{_class(value, column, extra.get(column, ''))}>{_e(value)}</td>"
            for column, value in enumerate(row[:-1]) if column]
        parts.append(f"<tr{attrs}>" + "".join(cells) + "</tr>")
    parts.append("</tbody></table>")
    return parts


def _failures_section(results: list[dict]) -> list[str]:
    groups = failure_groups(results)
    parts = ['<h2 id="h-failures">Tests that do not pass, by case</h2>',
             f"<p>One row per backend, case and status: how many of the case's tests have "
             f"that status, and the first line of the reason of the first of them (named "
             f"under the case). "
             f"{len(groups)} rows, worst first; filter them (the filter is kept in the "
             "address, to link to it; without JavaScript every row shows).</p>"]
    if not groups:
        return parts + ["<p>Every test passed on every backend.</p>"]
    return parts + [_filters(groups)] + _failure_rows(groups)


def _head() -> list[str]:
    return ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            "<title>Attention conformance matrix</title>", f"<style>{_CSS}</style>",
            "</head>", "<body>", "<h1>Attention conformance matrix</h1>"]


def _intro(results: list[dict]) -> list[str]:
    names = ", ".join(_e(r["backend"]["name"]) for r in results)
    parts = [f"<p>{len(results)} backends: {names}. A cell reads <em>passed/run</em> "
             "(expected failures count as passed and are said in brackets; unsupported "
             "tests are not run, and a cell where none ran reads <em>nothing ran</em>).</p>",
             _legend()]
    hashes = sorted({r["spec_hash"] for r in results})
    if len(hashes) > 1:
        parts.append(f'<p class="warning">These reports were made against {len(hashes)} '
                     f"different specs ({_e(', '.join(hashes))}).</p>")
    return parts


def matrix_html(results: list[dict]) -> str:
    """The matrix as one static HTML page (inline CSS and script, nothing external)."""
    parts = _head() + _intro(results)
    for table_id, title, header, rows in _matrix_tables(results):
        if table_id == "failures":
            parts += _failures_section(results)
            continue
        parts.append(f'<h2 id="h-{_e(table_id)}">{_e(title)}</h2>')
        parts += _table(table_id, header, rows)
    parts += [f"<script>{_SCRIPT}</script>", "</body>", "</html>"]
    return "\n".join(parts) + "\n"


def write_matrix(results: list[dict], directory: Path) -> list[Path]:
    """matrix.md and matrix.html into directory (a link at either name is replaced,
    never written through)."""
    directory = make_folder(directory)
    return [write_file(directory / "matrix.md", matrix_markdown(results)),
            write_file(directory / "matrix.html", matrix_html(results))]
