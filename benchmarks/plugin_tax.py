"""The plugin's tax on every other pytest run: an unrelated one-test project, run with
the attention_conformance plugin (which pytest loads by its entry point) and without it
(-p no:attention_conformance), the two interleaved; the figure is the median difference.

    python benchmarks/plugin_tax.py --runs 9      # prints the figure against its target
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_MS = 50.0
TEST = "def test_one():\n    assert 1 + 1 == 2\n"


def _wall(argv, cwd) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def plugin_tax(runs: int = 9, python: str = sys.executable) -> dict:
    """Walls with and without the plugin, and the median of their pairwise differences."""
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "test_one.py").write_text(TEST)
        base = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        _wall(base, folder)                                  # warm the file cache
        loaded, without = [], []
        for _ in range(runs):
            loaded.append(_wall(base, folder))
            without.append(_wall(base + ["-p", "no:attention_conformance"], folder))
    tax = statistics.median(a - b for a, b in zip(loaded, without))
    return {"runs": runs, "with_s": statistics.median(loaded),
            "without_s": statistics.median(without), "tax_ms": 1000 * tax,
            "target_ms": TARGET_MS, "meets": 1000 * tax <= TARGET_MS}


def line(r: dict) -> str:
    verdict = "meets" if r["meets"] else "misses"
    return (f"plugin tax: {r['tax_ms']:+.0f} ms (median of {r['runs']} pairs; with the plugin "
            f"{r['with_s']:.3f} s, without {r['without_s']:.3f} s); target <= "
            f"{r['target_ms']:.0f} ms: {verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    print(line(plugin_tax(args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
