"""Where the spec lives: $ATTENTION_CONFORMANCE_SPEC, else the spec the package carries.

An installed wheel holds it as package data, ``attention_conformance/spec/`` (found
through importlib.resources); an editable install runs from a checkout, whose ``spec/``
folder sits beside ``conformance/``.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path


def packaged_spec_dir() -> Path:
    """The spec folder shipped with the package, or the checkout's when editable."""
    shipped = Path(str(resources.files("attention_conformance"))) / "spec"
    if (shipped / "cases").is_dir():
        return shipped
    return Path(__file__).resolve().parent.parent / "spec"


def _spec_dir() -> Path:
    override = os.environ.get("ATTENTION_CONFORMANCE_SPEC")
    if override:
        return Path(override).resolve()
    return packaged_spec_dir()


SPEC_DIR = _spec_dir()
CASES_DIR = SPEC_DIR / "cases"
GOLDEN_DIR = SPEC_DIR / "golden"
TOLERANCES_FILE = SPEC_DIR / "tolerances.yaml"
