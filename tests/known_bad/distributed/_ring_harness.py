"""The distributed known-bad adapters (tests/known_bad/distributed/): each plants one
realistic bug in the torch ring (backends/torch_ring.py). The sharded cases of the spec
(topic context_parallel) run on each in the suite's process, its ranks forked from it,
stopping at the first failure: that case catches the bug.

    python tests/known_bad/distributed/_ring_harness.py   # the table of docs/failures.md
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE.parent))

from attention_conformance.backend.resolve import load_backend  # noqa: E402
from attention_conformance.golden.store import GoldenStore  # noqa: E402
from attention_conformance.specs.loader import load_spec  # noqa: E402

from _harness import first_catch, quick_items  # noqa: E402

TOPIC = "context_parallel"


def bug_files() -> list[Path]:
    return sorted(HERE.glob("[!_]*.py"))


def load_bug(path: Path):
    [cls] = re.findall(r"^class (\w+)\(TorchRingBackend\)", path.read_text(), re.MULTILINE)
    return load_backend(f"{path}:{cls}")


def sharded_items(spec):
    return [(c, v, d) for c, v, d in quick_items(spec) if c.topic == TOPIC]


def catch(path: Path, spec, golden):
    """(test id, message) of the first sharded case that catches the bug; None if none."""
    return first_catch(load_bug(path), sharded_items(spec), golden)


def table(spec=None) -> list[str]:
    spec, golden = spec or load_spec(), GoldenStore()
    rows = ["| bug | first case that catches it | first line of its failure |", "|---|---|---|"]
    for path in bug_files():
        doc = (type(load_bug(path)).__doc__ or "").strip().splitlines()[0]
        where, why = catch(path, spec, golden) or ("**not caught**", "")
        line = why.splitlines()[0] if why else ""
        line = (line[:110] + (" ..." if len(line) > 110 else "")).replace("|", "/")
        rows.append(f"| `distributed/{path.stem}`: {doc} | `{where}` | {line} |")
    return rows


if __name__ == "__main__":
    print("\n".join(table()))
