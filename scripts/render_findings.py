"""The generated parts of docs/findings.md and the README's table of backends, from the
built-in backends' declared policies (declared_policies.py: read from the adapters'
source, no framework imported) and their expected failures
(backends/expected_failures/*.yaml: each entry's match, filters and reason).

    python scripts/render_findings.py            # rewrite the generated parts
    python scripts/render_findings.py --check    # exit 1 where a page differs

A generated part sits between `<!-- generated: NAME by scripts/render_findings.py -->`
and `<!-- end: NAME -->`; the text around it is written by hand.
tests/tooling/test_findings.py fails when a page and the files differ.
"""

from __future__ import annotations

import argparse
import configparser
import re
import sys
from pathlib import Path

from declared_policies import ROOT, builtin, declarations

from attention_conformance.model.policies import POLICIES
from attention_conformance.reports.markdown import when_text
from attention_conformance.specs.expected import load_expected

EXPECTED_DIR = ROOT / "backends" / "expected_failures"
FINDINGS = "docs/findings.md"
PART = re.compile(r"(<!-- generated: (\w+) by scripts/render_findings.py -->\n)(.*?)"
                  r"(<!-- end: \2 -->)", re.S)


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def tox_envs() -> dict[str, str]:
    """The backends tox certifies, each with how: `yes` for a plain `tox` (env_list),
    `tox -m long` for the environments of that label. Each environment certifies the
    backend of its name, and every backend its commands name (`--backend NAME`: one
    environment of one library may certify several, e.g. keras: keras-torch, ...)."""
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    labels = {}
    for line in tox["tox"].get("labels", "").strip().splitlines():
        label, listed = line.split("=", 1)
        labels[label.strip()] = listed
    found = {}
    for how, listed in {"yes": tox["tox"]["env_list"],
                        "`tox -m long`": labels.get("long", "")}.items():
        for env in filter(None, (e.strip() for e in listed.split(","))):
            section = tox[f"testenv:{env}"] if tox.has_section(f"testenv:{env}") else {}
            for name in [env, *re.findall(r"--backend ([\w.-]+)", section.get("commands", ""))]:
                found.setdefault(name, how)
    return found


def expected_files() -> dict[str, Path]:
    """Backend name -> its expected-failures file, built-in backends' order first."""
    files = {p.stem: p for p in sorted(EXPECTED_DIR.glob("*.yaml"))}
    order = [n for n in builtin() if n in files] + sorted(set(files) - set(builtin()))
    return {name: files[name] for name in order}


def _conditions(declared: dict, notes: bool) -> str:
    """A backend's policy_when rules in words (`when causal, not mask: masked_key_nan=
    per_row`), and with notes its dtype_notes (`float64 left out: why`)."""
    parts = [f"when {when_text(rule['when'])}: " + ", ".join(
        f"{k}={v}" for k, v in sorted(rule["policy"].items())) for rule in declared["policy_when"]]
    if notes:
        parts += [f"{d} left out: {why}" for d, why in sorted(declared["dtype_notes"].items())]
    return "".join(f" ({_cell(p)})" for p in parts)


def policies_table(link: str, notes: bool = False) -> str:
    """One row per built-in backend: in tox or not, its declared choices (a choice that a
    policy_when rule overrides under a condition, with the rule; with notes, each dtype
    left out and why), its findings (expected-failure entries that differ only in their
    match count once)."""
    envs, files = tox_envs(), expected_files()
    rows = ["| backend | in tox | " + " | ".join(f"`{p}`" for p in POLICIES) + " | findings |",
            "|---" * (len(POLICIES) + 3) + "|"]
    for name, declared in declarations().items():
        per_op = "; ".join(f"{op}: " + ", ".join(f"{k}={v}" for k, v in sorted(c.items()))
                           for op, c in sorted(declared["op_policy"].items()))
        count = len(_findings(load_expected(files[name]).entries)) if name in files else None
        findings = f"[{count}]({link}#{name})" if count else "none" if count == 0 else "no file"
        rows.append("| " + " | ".join(
            [name + (f" (per op: {per_op})" if per_op else "") + _conditions(declared, notes),
             envs.get(name, "no"),
             *(declared["policy"].get(p, "-") for p in POLICIES), findings]) + " |")
    return "\n".join(rows) + "\n"


def _judged(entry) -> str:
    when = f"after the run, by message `{_cell(entry.message)}`" if entry.message else "before"
    return when + ("" if entry.strict else "; not strict")


def _header(path: Path) -> str:
    """The file's leading comment: what it is about (versions, machine, what passes)."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(" ".join(lines).split())


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _findings(entries) -> list[tuple]:
    """Entries that differ only in their match, as one finding: (matches, first entry)."""
    groups = {}
    for e in entries:
        key = (e.reason, e.ops, e.dtypes, e.message, e.strict)
        groups.setdefault(key, ([], e))[0].append(e.match)
    return list(groups.values())


def expected_sections() -> str:
    """Each backend's expected failures, one row per finding: its matches, filters, when
    judged, and reason."""
    out = []
    for name, path in expected_files().items():
        entries = load_expected(path).entries
        findings = _findings(entries)
        count = _count(len(entries), "entry", "entries") + (
            f", {_count(len(findings), 'finding', 'findings')}" if findings else "")
        out += [f"### {name}", "", _header(path), "",
                f"`backends/expected_failures/{path.name}`: {count}.", ""]
        if findings:
            out += ["| match | only | judged | reason |", "|---|---|---|---|"]
        for matches, e in findings:
            only = "; ".join(f"{key} {', '.join(values)}" for key, values in
                             (("ops", e.ops), ("dtypes", e.dtypes)) if values) or "-"
            shown = ", ".join(f"`{_cell(m)}`" for m in matches)
            out.append(f"| {shown} | {only} | {_judged(e)} | {_cell(e.reason)} |")
        if findings:
            out.append("")
    return "\n".join(out)


#: page -> generated part -> its text
def parts() -> dict[str, dict[str, str]]:
    return {FINDINGS: {"policies": policies_table("", notes=True), "expected": expected_sections()},
            "README.md": {"policies": policies_table(FINDINGS)}}


def render(text: str, generated: dict[str, str]) -> str:
    """The page with each generated part replaced; a part the page lacks is an error."""
    missing = set(generated) - {m.group(2) for m in PART.finditer(text)}
    if missing:
        raise LookupError(f"no generated part {sorted(missing)} in the page")
    return PART.sub(lambda m: m.group(1) + generated[m.group(2)] + m.group(4), text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    stale = []
    for page, generated in parts().items():
        path = ROOT / page
        text = path.read_text(encoding="utf-8")
        new = render(text, generated)
        if new != text:
            stale.append(page)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    verb = "stale" if args.check else "rewritten"
    print(f"{verb}: {', '.join(stale)}" if stale else "up to date")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
