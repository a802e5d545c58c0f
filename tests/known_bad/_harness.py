"""Running the quick cases of the spec on a backend, programmatically, to find the first
case that catches a planted bug (no pytest run per bug: stops at the first failure).

    python tests/known_bad/_harness.py      # prints the table of docs/failures.md
"""

from __future__ import annotations

import re
from pathlib import Path

from attention_conformance.golden.store import GoldenStore
from attention_conformance.backend.resolve import load_backend
from attention_conformance.model.errors import Unsupported
from attention_conformance.backend.in_process import InProcess
from attention_conformance.checking.verdict import run_case
from attention_conformance.specs.loader import load_spec

from _needs import NEEDS

HERE = Path(__file__).resolve().parent


def bug_files() -> list[Path]:
    """Every known-bad adapter file (helpers start with an underscore)."""
    return sorted(HERE.glob("[!_]*.py"))


def load_bug(path: Path):
    """The backend of a known-bad adapter file, through the suite's own loader."""
    [cls] = re.findall(r"^class (\w+)\((?:Planted|TiledPlanted)\)", path.read_text(),
                       re.MULTILINE)
    return load_backend(f"{path}:{cls}")


def item_id(case, variant, dtype) -> str:
    label = f"{variant.label}-{dtype}" if variant.label else dtype
    return f"{case.topic}/{case.id}[{label}]"


def quick_items(spec, first=None):
    """(case, variant, dtype) of every quick case; those for which first(case) holds first."""
    cases = [c for c in spec.cases if c.profile == "quick"]
    if first is not None:
        cases.sort(key=lambda c: not first(c))
    return [(c, v, d) for c in cases for v in c.variants for d in c.dtypes]


def outcome(backend, case, variant, dtype, golden) -> str | None:
    """None if the case passes (or is unsupported), else the failure message."""
    try:
        run_case(InProcess(backend), case, variant, dtype, golden)
    except Unsupported:
        return None
    except AssertionError as exc:          # CheckFailure
        return str(exc)
    except Exception as exc:               # anything the backend raised fails the case too
        return f"the backend raised {type(exc).__name__}: {exc}"
    return None


def first_catch(backend, items, golden) -> tuple[str, str] | None:
    """(test id, failure message) of the first item that fails, or None."""
    for case, variant, dtype in items:
        message = outcome(backend, case, variant, dtype, golden)
        if message is not None:
            return item_id(case, variant, dtype), message
    return None


def catch(path: Path, spec, golden):
    """(test id, message) of the first quick case that catches the bug of `path`; None if
    none does; or, while the spec has no case of the kind the bug needs, that kind."""
    needs, reveals = NEEDS.get(path.stem, (None, None))
    if reveals and not any(reveals(c) for c in spec.cases if c.profile == "quick"):
        return needs
    return first_catch(load_bug(path), quick_items(spec, reveals), golden)


def _row(path, found) -> str:
    doc = (type(load_bug(path)).__doc__ or "").strip().splitlines()[0]
    if isinstance(found, str):
        return f"| `{path.stem}`: {doc} | waiting for: {found} | |"
    where, why = found or ("**not caught**", "")
    first_line = why.splitlines()[0] if why else ""
    first_line = (first_line[:110] + (" ..." if len(first_line) > 110 else "")).replace("|", "/")
    return f"| `{path.stem}`: {doc} | `{where}` | {first_line} |"


def table(spec=None) -> list[str]:
    """The Markdown table of docs/failures.md: bug -> first case that catches it."""
    spec = spec or load_spec()
    golden = GoldenStore()
    found = {path: catch(path, spec, golden) for path in bug_files()}
    caught = sum(isinstance(f, tuple) for f in found.values())
    rows = [f"The spec catches {caught} of {len(found)} planted bugs.", "",
            "| bug | first case that catches it | first line of its failure |", "|---|---|---|"]
    return rows + [_row(path, f) for path, f in found.items()]


if __name__ == "__main__":
    print("\n".join(table()))
