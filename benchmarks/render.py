#!/usr/bin/env python3
"""Results files as Markdown: each benchmarks/results/KIND.json rendered to KIND.md, and
the table of current figures in docs/benchmarks.md, rewritten from all of them.

    python benchmarks/render.py        # after editing this module: every page again
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from measure import ROOT, median

RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs" / "benchmarks.md"
TABLE_START = "<!-- figures: written by python benchmarks/render.py from benchmarks/results -->"
TABLE_END = "<!-- /figures -->"
QUESTIONS = {
    "overhead": "How much does the suite add to pytest's own cost?",
    "floors": "How long does certifying a backend take, and how much of it is the "
              "framework's own work?",
    "suite": "How long do the suite's own tests take?",
    "matrix-cold": "How long does the whole tox matrix take cold?",
    "matrix-fresh": "How long does the whole tox matrix take on a fresh clone "
                    "(JAX's compilation cache kept)?",
    "matrix-warm": "How long does the whole tox matrix take warm?",
    "paired": "Did a change make the quick run slower?",
    "scale": "How long does the scale profile take, in how much memory, and what does its "
             "golden cost?",
}


def seconds(values) -> str:
    return f"{median(values):.2f}"


def spread(values) -> str:
    return f"{min(values):.2f}–{max(values):.2f}"


def headline(record: dict) -> str:
    """The figure in one line."""
    return HEADLINES[record["kind"].split("-")[0]](record["figures"])


def overhead_line(f: dict) -> str:
    iso, bare = median(f["isolated"]), median(f["bare"])
    return (f"NumPy quick run ({f['items']} items) {iso:.2f} s, pytest alone on as many "
            f"no-op items {bare:.2f} s: x{iso / bare:.2f}")


def floors_line(f: dict) -> str:
    return "; ".join(f"{name} {seconds(b['runs'])} s (framework's floor {median(b['floors']):.2f} s)"
                     for name, b in f["backends"].items())


def suite_line(f: dict) -> str:
    counts = ", ".join(f"{n} {word}" for word, n in f["counts"].items())
    return (f"`pytest tests -n auto`: {seconds(r['wall'] for r in f['runs'])} s wall, "
            f"{seconds(r['cpu'] for r in f['runs'])} CPU s ({counts})")


def matrix_line(f: dict) -> str:
    """What CI prints after the matrix."""
    envs = f["envs"]
    failed = [name for name, e in envs.items() if e["status"] != "OK"]
    status = f"failed: {', '.join(failed)}" if failed else f"all {len(envs)} environments OK"
    total = "no total in the log" if f["wall"] is None else f"{f['wall']:.0f} s"
    cpu = (f"; {f['cpu_seconds']:.0f} CPU s, so on {f['cores']} cores no schedule ends "
           f"before {f['cpu_seconds'] / f['cores']:.0f} s" if f.get("cpu_seconds") else "")
    longest = sorted(envs.items(), key=lambda item: -item[1]["seconds"])[:2]
    slowest = ", ".join(f"{name} {e['seconds']:.0f} s" for name, e in longest)
    return f"tox -p ({f['tox_kind']}): {total}, {status}{cpu}; longest: {slowest}"


def paired_line(f: dict) -> str:
    return "; ".join(f"{name} x{median(b['head']) / median(b['base']):.3f} "
                     f"({seconds(b['base'])} → {seconds(b['head'])} s{_cpu_ratio(b)})"
                     for name, b in f["backends"].items()) + " (head / base)"


def _cpu_ratio(b: dict) -> str:
    """`, CPU x1.002` where the runs' CPU seconds were kept (results before them: '')."""
    cpu = b.get("cpu")
    return f", CPU x{median(cpu['head']) / median(cpu['base']):.3f}" if cpu else ""


def scale_line(f: dict) -> str:
    run, ref = f["backends"][f["reference_backend"]], f["reference"]
    counts = {}
    for test in run["tests"].values():
        counts[test["status"]] = counts.get(test["status"], 0) + 1
    matmul = max(ref["matmul_gflops"])
    return (f"{f['reference_backend']} --profile scale: {run['wall']:.0f} s wall, "
            f"{run['cpu']:.0f} CPU s, peak {run['peak_memory_gb']:.1f} GB "
            f"({', '.join(f'{n} {s}' for s, n in counts.items())}); golden "
            f"{ref['cpu_share']:.0%} of its CPU seconds; float64 reference "
            f"{ref['long_profile_gflops']} GFLOP per CPU second on the long cases, float64 "
            f"matmul {matmul} (x{matmul / ref['long_profile_gflops']:.1f})")


HEADLINES = {"overhead": overhead_line, "floors": floors_line, "suite": suite_line,
             "matrix": matrix_line, "paired": paired_line, "scale": scale_line}


def overhead_body(f: dict) -> list[str]:
    bare = median(f["bare"])
    rows = [("isolated (the default)", f["isolated"]), ("in-process (`--in-process`)",
            f["in_process"]), (f"pytest alone, {f['items']} no-op items", f["bare"])]
    return ["| run | median s | min–max s | / pytest alone |", "|---|---:|---:|---:|",
            *(f"| {label} | {seconds(walls)} | {spread(walls)} | x{median(walls) / bare:.2f} |"
              for label, walls in rows)]


def floors_body(f: dict) -> list[str]:
    out = [f"Topics: {f['topics'] if isinstance(f['topics'], str) else ', '.join(f['topics'])}.",
           "", "| backend | items | run s | min–max s | floor s | of it: import s | calls "
           "| calls s | run − floor s | run / floor |", "|---|---:|---:|---:|---:|---:|---:"
           "|---:|---:|---:|"]
    for name, b in f["backends"].items():
        run, floor, replay = median(b["runs"]), median(b["floors"]), b["replay"]
        out.append(f"| {name} | {b['items']} | {run:.2f} | {spread(b['runs'])} | {floor:.2f} "
                   f"| {replay['load_seconds']:.2f} | {replay['calls']} | "
                   f"{replay['calls_seconds']:.2f} | {run - floor:.2f} | x{run / floor:.2f} |")
    return out


def suite_body(f: dict) -> list[str]:
    return ["| run | wall s | CPU s |", "|---:|---:|---:|",
            *(f"| {i} | {r['wall']:.1f} | {r['cpu']:.1f} |" for i, r in enumerate(f["runs"], 1))]


def matrix_body(f: dict) -> list[str]:
    rows = sorted(f["envs"].items(), key=lambda item: -item[1]["seconds"])
    stolen = f.get("stolen_seconds")
    return [*([f"CPU seconds the hypervisor took from this machine meanwhile: {stolen:.0f}.", ""]
              if stolen is not None else []),
            "| environment | status | seconds | of it: setup s |", "|---|---|---:|---:|",
            *(f"| {name} | {e['status']} | {e['seconds']:.1f} | "
              f"{'–' if e['setup'] is None else format(e['setup'], '.1f')} |" for name, e in rows)]


def paired_body(f: dict) -> list[str]:
    trees = f"base {f['base']['label']} ({f['base']['commit']}), head {f['head']['label']} " \
            f"({f['head']['commit']})"
    spec = f", both on the spec of {f['spec']}" if f.get("spec") else ""
    return [f"Trees: {trees}{spec}; {f['repeat']} runs of each, alternating.", "",
            "| backend | items (base, head) | base s | head s | head / base | base min–max s "
            "| head min–max s |", "|---|---|---:|---:|---:|---:|---:|",
            *(f"| {name} | {b['items'][0]}, {b['items'][1]} | {seconds(b['base'])} | "
              f"{seconds(b['head'])} | x{median(b['head']) / median(b['base']):.3f} | "
              f"{spread(b['base'])} | {spread(b['head'])} |" for name, b in f["backends"].items())]


def scale_body(f: dict) -> list[str]:
    ref = f["reference"]
    out = [f"Golden data ({f['reference_backend']}'s passing tests, computed again after the "
           f"run): {ref['cpu_seconds']:.1f} CPU s, {ref['cpu_share']:.1%} of the run's CPU "
           f"seconds ({ref['seconds']:.1f} s, {ref['share']:.1%} of its wall); the float64 "
           f"reference {ref['exact_gflops']} GFLOP per CPU second, the plain same-dtype pass "
           f"{ref['plain_gflops']}, on {ref['threads']} threads. The long profile's sdpa "
           f"cases (every row): the float64 reference {ref['long_profile_gflops']} GFLOP per "
           f"CPU second ({ref['long_profile_gflops_wall']} per wall second). float64 matmul "
           f"on as many threads, before and after: {ref['matmul_gflops'][0]} and "
           f"{ref['matmul_gflops'][1]} GFLOP per CPU second ({ref['matmul_gflops_wall'][0]} "
           f"and {ref['matmul_gflops_wall'][1]} per wall second).", ""]
    for name, run in f["backends"].items():
        out += [f"**{name}**: {run['wall']:.0f} s wall, {run['cpu']:.0f} CPU s of every "
                f"process of the run, peak {run['peak_memory_gb']:.2f} GB of them together, "
                f"load average at its end {', '.join(map(str, run['load_average']))}.", "",
                "| test | status | seconds | golden CPU s | why |", "|---|---|---:|---:|---|"]
        for test, t in run["tests"].items():
            golden = ref["tests"].get(test, {}).get("cpu_seconds") \
                if name == f["reference_backend"] else None
            out.append(f"| `{test}` | {t['status']} | {t['seconds']:.1f} | "
                       f"{'–' if golden is None else format(golden, '.1f')} | "
                       f"{t['why'].replace('|', '/')} |")
        out.append("")
    return out


BODIES = {"overhead": overhead_body, "floors": floors_body, "suite": suite_body,
          "matrix": matrix_body, "paired": paired_body, "scale": scale_body}


def page(record: dict) -> str:
    """A results file's Markdown: the question, where and how it was measured, the figures."""
    m = record["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    load = ", ".join(map(str, m["load_average"])) if m["load_average"] else "not recorded"
    return "\n".join([
        f"# {QUESTIONS[record['kind']]}", "",
        f"**{headline(record)}**", "",
        f"Measured {record['date']} at commit {record['commit']} on {m['cores']} cores "
        f"({m['cpu']}), load average {load}; Python "
        f"{m['python']}, {versions}. Made by:", "", "```bash", record["command"], "```", "",
        *BODIES[record["kind"].split("-")[0]](record["figures"]),
        "", "Written by benchmarks/render.py from the JSON beside this file: do not edit.", ""])


def records() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))]


def figures_table(found: list[dict]) -> str:
    """The docs page's table of current figures, one row per results file."""
    rows = [f"| [{QUESTIONS[r['kind']]}](../benchmarks/results/{r['kind']}.md) | "
            f"{headline(r)} | {r['date'][:10]}, {r['commit']} |" for r in found]
    return "\n".join([TABLE_START, "| question | figure | measured |", "|---|---|---|",
                      *rows, TABLE_END])


def with_table(docs: str, table: str) -> str:
    before, rest = docs.split(TABLE_START)
    return before + table + rest.split(TABLE_END, 1)[1]


def write(record: dict) -> None:
    """A results file and its page, and the docs page's table from all of them."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{record['kind']}.json").write_text(json.dumps(record, indent=1) + "\n")
    main()


def main() -> int:
    found = records()
    for record in found:
        (RESULTS / f"{record['kind']}.md").write_text(page(record), encoding="utf-8")
    DOCS.write_text(with_table(DOCS.read_text(encoding="utf-8"), figures_table(found)),
                    encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
