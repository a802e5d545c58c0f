"""Reports: the end-of-run summary, a backend's Markdown report, the matrix of backends
(Markdown here; the static HTML page, and writing both, is report_html.py).

The colour rule of the matrix (docs/cli.md), one tone per cell of counts (``tone``):
grey ``none`` where nothing ran (no test, or only unsupported ones), red ``bad`` where
a test failed or passed unexpectedly (both fail a run), amber ``warn`` where the only
non-passes are expected failures (documented findings), green ``ok`` where everything
that ran passed. Unsupported tests never colour a cell; the text says how many."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..model.files import folder_problem, make_folder, write_file
from ..model.policies import POLICIES, POLICY_MEANING
from .results import FAILING, FORMAT, STATUS_LABELS, STATUSES, safe_name

_COLUMNS = STATUSES
_HEADINGS = tuple(STATUS_LABELS[c] for c in _COLUMNS)


def _row(cells) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def _table(header, rows) -> list[str]:
    return [_row(header), _row(["---"] * len(header))] + [_row(r) for r in rows]


def summary_lines(log) -> list[str]:
    data = log.as_dict()
    totals = data["totals"]
    lines = ["", f"attention-conformance: backend {data['backend']['name']!r}, "
             f"{data.get('profile_cases', data['cases'])} cases of the "
             f"{data.get('selection', {}).get('profile') or 'quick'} profile "
             f"(of {data['cases']}) in spec {data['spec_hash']}"]
    shown = [c for c in _COLUMNS if c not in ("timeout", "crash", "error") or totals.get(c)]
    lines.append("  " + ", ".join(f"{totals.get(c, 0)} {c}" for c in shown))
    lines += _spec_problem_lines(data.get("spec_problems", []))
    worst = data["worst_error_over_tolerance"]
    if worst:
        lines.append("  worst error / tolerance: " +
                     ", ".join(f"{d} {r:.2f}" for d, r in sorted(worst.items())))
    lines.append("  policies: " + ", ".join(f"{k}={v}" for k, v in
                                            sorted(data["backend"]["policy"].items())))
    for op, chosen in sorted(data["backend"].get("op_policy", {}).items()):
        lines.append(f"  policies of {op}: " + ", ".join(f"{k}={v}" for k, v in
                                                      sorted(chosen.items())))
    for rule in data["backend"].get("policy_when", ()):
        lines.append("  policies when " + when_text(rule["when"]) + ": " +
                     ", ".join(f"{k}={v}" for k, v in sorted(rule["policy"].items())))
    for dtype, why in sorted(data["backend"].get("dtype_notes", {}).items()):
        lines.append(f"  {dtype} left out: {why}")
    return lines


#: spec problems printed at the end of a run (the report lists every one)
SHOWN_PROBLEMS = 5


def _spec_problem_lines(problems: list[str]) -> list[str]:
    """The spec's own problems, not the backend's: no case of theirs ran."""
    lines = [f"  spec problem (no test of it ran): {p}" for p in problems[:SHOWN_PROBLEMS]]
    if len(problems) > SHOWN_PROBLEMS:
        lines.append(f"  and {len(problems) - SHOWN_PROBLEMS} more spec problems (the report, "
                     "or attention-conformance validate, lists them)")
    return lines


def when_text(when: dict) -> str:
    """A policy_when rule's conditions in words: `bias, causal=bottom_right, not mask`."""
    def one(name, value):
        if value is True:
            return name
        if value is False:
            return f"not {name}"
        return f"{name} in {', '.join(value)}" if isinstance(value, list) else f"{name}={value}"
    return ", ".join(one(k, v) for k, v in when.items())


class Cell(str):
    """A table cell: its text, and its tone for the HTML page (ok, warn, bad, none, '')."""

    tone: str

    def __new__(cls, text, tone: str = ""):
        cell = super().__new__(cls, text)
        cell.tone = tone
        return cell


def _run(counts: dict) -> int:
    return sum(v for k, v in counts.items() if k != "unsupported")


def tone(counts: dict) -> str:
    """The colour rule: none, bad, warn or ok (see the module docstring)."""
    if not _run(counts):
        return "none"
    if any(counts.get(s) for s in FAILING):
        return "bad"
    return "warn" if counts.get("xfail") else "ok"


def _cell(counts: dict) -> Cell:
    """'passed/run' for a table cell; run excludes unsupported, which is said apart;
    'nothing ran' where every test was unsupported."""
    if not counts:
        return Cell("-", "none")
    if not _run(counts):
        return Cell(f"nothing ran ({counts.get('unsupported', 0)} unsupported)", "none")
    text = _fraction(counts)
    if counts.get("unsupported"):
        text += f", {counts['unsupported']} unsupported"
    return Cell(text, tone(counts))


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
           f"Declared dtypes: {', '.join(b.get('dtypes', [])) or 'none'}.", ""]
    out += _incomplete(data)
    out += _spec_problems(data)
    out += ["## Totals", ""]
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
    out += _replaced(data["results"])
    out += _failures(data["results"])
    return "\n".join(out) + "\n"


def _replaced(results: list[dict]) -> list[str]:
    """Each test before which a fresh backend process was started, and why."""
    replaced = [r for r in results if r.get("replaced")]
    if not replaced:
        return []
    return ["", "## Backend processes replaced", "",
            "A fresh process of the backend was started before these tests:", ""] + \
        [f"- `{r['id']}`: {r['replaced']}" for r in replaced]


def _incomplete(data: dict) -> list[str]:
    """What an incomplete run says first: why, and every test that never ran."""
    if data.get("complete", True):
        return []
    never = data.get("not_run_tests", [])
    out = ["**This run is incomplete**: " + ("it was interrupted; " if data.get("interrupted")
                                              else "") + f"{len(never)} selected tests never ran"
           + (":" if never else "."), ""]
    return out + [f"- `{test_id}`" for test_id in never] + ([""] if never else [])


def _spec_problems(data: dict) -> list[str]:
    """Problems of the spec itself, each with its file and line: the cases they concern
    did not run, on this backend or any other."""
    problems = data.get("spec_problems", [])
    if not problems:
        return []
    return ["## Spec problems", "", "Problems of the spec, not of the backend: no test of "
            "these did run.", "", *(f"- {_escaped(p)}" for p in problems), ""]


def _escaped(text: str) -> str:
    return "".join("\\" + c if c in "\\`*_[]<>|#" else c for c in text)


def _failures(results: list[dict]) -> list[str]:
    """Each failing test with every line of its message and its traceback (what -q
    leaves out of the terminal), then each expected failure with its reason."""
    out = []
    failing = [r for r in results if r["status"] in FAILING]
    if failing:
        out += ["", "## Failures"]
        for r in failing:
            text = "\n".join(part.rstrip() for part in (r["message"], r.get("traceback", ""))
                             if part and part.strip())
            fence = "`" * max(3, 1 + max(map(len, re.findall("`+", text)), default=0))
            out += ["", f"### `{r['id']}` ({STATUS_LABELS[r['status']]})", "",
                    f"{fence}text", text or "(no message)", fence]
    expected = [r for r in results if r["status"] == "xfail"]
    if expected:
        out += ["", "## Expected failures", ""]
        out += [f"- `{r['id']}` (expected failure): {_first_line(r['message'])}"
                for r in expected]
    return out


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


#: order of the statuses in the list of tests that do not pass, worst first
SEVERITY = ("crash", "timeout", "error", "fail", "xpass", "xfail", "unsupported")


def _first_line(message) -> str:
    return message.strip().splitlines()[0] if message and message.strip() else ""


def failure_groups(results: list[dict]) -> list[dict]:
    """One row per backend x case x status that is not a pass: how many of the case's
    tests have that status, of how many, the first line of the first one's reason and
    that test's id; worst status first, then topic, case and backend."""
    groups = {}
    for report in results:
        name = report["backend"]["name"]
        total = {}
        for r in report["results"]:
            total[r["case"]] = total.get(r["case"], 0) + 1
        for r in report["results"]:
            if r["status"] == "pass":
                continue
            key = (SEVERITY.index(r["status"]) if r["status"] in SEVERITY else len(SEVERITY),
                   r["topic"], r["case"], name, r["status"])
            group = groups.setdefault(key, {
                "backend": name, "topic": r["topic"], "case": r["case"], "status": r["status"],
                "count": 0, "of": total[r["case"]], "reason": _first_line(r["message"]),
                "first": r["id"]})
            group["count"] += 1
    return [groups[k] for k in sorted(groups)]


def _group_row(g: dict) -> tuple:
    label = STATUS_LABELS.get(g["status"], g["status"])
    tone_of = {**{s: "bad" for s in FAILING}, "xfail": "warn", "unsupported": "none"}
    return (g["case"], Cell(label, tone_of.get(g["status"], "")), g["backend"], g["topic"],
            f"{g['count']} of {g['of']}", g["reason"], g["first"])


GROUP_HEADER = ("case", "status", "backend", "topic", "tests", "first line of the reason",
                "first test")


def _totals_row(r: dict) -> tuple:
    counts = r["totals"]
    cells = [Cell(counts.get(c, 0), "bad" if c in FAILING and counts.get(c) else "")
             for c in _COLUMNS]
    problems = r.get("spec_errors", 0)
    spec = Cell(f"{r['spec_hash']}, {problems} spec problems", "bad") if problems \
        else r["spec_hash"]
    return (r["backend"]["name"], _cell(counts), *cells, spec)


def _matrix_tables(results: list[dict]) -> list[tuple[str, str, tuple, list]]:
    """(id, title, header, rows) of every table of the matrix, shared by Markdown and HTML
    (the HTML page shows the table "failures" in place of "tests")."""
    names = [r["backend"]["name"] for r in results]
    tables = [("totals", "Totals", ("backend", "overall", *_HEADINGS, "spec"),
               [_totals_row(r) for r in results])]
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
    tables.append(("failures", "Tests that do not pass, by case", GROUP_HEADER,
                   [_group_row(g) for g in failure_groups(results)]))
    keys = []
    for r in results:
        keys += [k for k in r["versions"] if k not in keys]
    tables.append(("versions", "Versions", ("", *names),
                   [(k, *(r["versions"].get(k, "-") for r in results)) for k in keys]
                   + [("selection", *(_selection_text(r.get("selection") or {}) or "quick profile"
                                      for r in results))]))
    return tables


def _ratio(value) -> Cell:
    if value is None:
        return Cell("-", "none")
    return Cell(f"{value:.2f}", "ok" if value <= 1 else "bad")


def matrix_markdown(results: list[dict], brief: bool = False) -> str:
    """All backends side by side: totals, per topic and dtype, worst errors, policies, the
    tests that do not pass (by case) and versions; ``brief`` counts those tests instead of
    listing them (what `report` prints)."""
    out = ["# Attention conformance matrix", ""]
    hashes = sorted({r["spec_hash"] for r in results})
    if len(hashes) > 1:
        out += [f"**Warning**: these reports were made against {len(hashes)} different specs "
                f"({', '.join(hashes)}); they do not compare case for case.", ""]
    for index, (table_id, title, header, rows) in enumerate(_matrix_tables(results)):
        if index:
            out += ["", f"## {title}", ""]
        if brief and table_id == "failures":
            tests = sum(int(row[4].split(" of ")[0]) for row in rows)
            out.append(f"{tests} tests in {len(rows)} groups of backend, case and status: "
                       "listed in matrix.md and matrix.html")
            continue
        out += _table(header, rows)
    return "\n".join(out) + "\n"


def _fraction(counts: dict) -> str:
    run = sum(v for k, v in counts.items() if k != "unsupported")
    ok = counts.get("pass", 0) + counts.get("xfail", 0)
    extra = f" ({counts['xfail']} xfail)" if counts.get("xfail") else ""
    return f"{ok}/{run}{extra}" if counts else "-"


def report_problem(directory) -> str | None:
    """Why --report DIR cannot be written (one line), or None: asked before a run, so
    that a run's report is never lost at its end."""
    problem = directory and folder_problem(directory, probe=True)
    return f"--report {directory}: {problem}" if problem else None


def write_backend_report(log, directory: Path) -> list[Path]:
    """A run's NAME.json and NAME.md in directory (model/files.py: a link planted at
    either name is replaced, never written through)."""
    directory = make_folder(directory)
    data = log.as_dict()
    name = safe_name(log.info["name"])
    return [write_file(directory / f"{name}.json", json.dumps(data, indent=1, default=str) + "\n"),
            write_file(directory / f"{name}.md", backend_markdown(data))]
