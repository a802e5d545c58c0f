"""Where the spec lives: $ATTENTION_CONFORMANCE_SPEC, else spec/ beside the packages."""

from __future__ import annotations

import os
from pathlib import Path


def _spec_dir() -> Path:
    override = os.environ.get("ATTENTION_CONFORMANCE_SPEC")
    if override:
        return Path(override).resolve()
    return Path(__file__).resolve().parent.parent / "spec"


SPEC_DIR = _spec_dir()
CASES_DIR = SPEC_DIR / "cases"
GOLDEN_DIR = SPEC_DIR / "golden"
TOLERANCES_FILE = SPEC_DIR / "tolerances.yaml"
