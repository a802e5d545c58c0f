"""The plugin's tax on every other pytest run: an unrelated one-test project, run with
the attention_conformance plugin (which pytest loads by its entry point) and without it
(-p no:attention_conformance), the two in turn; the figure is the median difference.

    python benchmarks/plugin_tax.py --runs 9      # prints the figure against its target
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from measure import median, timed

TARGET_MS = 50.0
TEST = "def test_one():\n    assert 1 + 1 == 2\n"


def plugin_tax(runs: int = 9, python: str = sys.executable) -> dict:
    """Walls with and without the plugin, and the median of their pairwise differences."""
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "test_one.py").write_text(TEST)
        base = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        timed(base, cwd=folder)                              # warms the file cache
        pairs = [(timed(base, cwd=folder).wall,
                  timed(base + ["-p", "no:attention_conformance"], cwd=folder).wall)
                 for _ in range(runs)]
    tax_ms = 1000 * median(loaded - without for loaded, without in pairs)
    return {"runs": runs, "with_s": median(p[0] for p in pairs),
            "without_s": median(p[1] for p in pairs), "tax_ms": tax_ms,
            "target_ms": TARGET_MS, "meets": tax_ms <= TARGET_MS}


def line(r: dict) -> str:
    verdict = "meets" if r["meets"] else "misses"
    return (f"plugin tax: {r['tax_ms']:+.0f} ms (median of {r['runs']} pairs; with the plugin "
            f"{r['with_s']:.3f} s, without {r['without_s']:.3f} s); target <= "
            f"{r['target_ms']:.0f} ms: {verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    print(line(plugin_tax(parser.parse_args().runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
