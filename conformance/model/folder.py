"""Where a spec lives: one object that every step of a run is handed.

A spec folder holds ``cases/`` (the YAML case files), ``golden/`` (the frozen reference
outputs and their SHA256SUMS) and ``tolerances.yaml`` (the tolerance rule; a folder
without one uses the package's). The JSON Schema is always the package's own: a spec
folder is data, and nothing in it changes how it is validated.

The default folder is ``$ATTENTION_CONFORMANCE_SPEC`` if set, else the spec the
package carries: an installed wheel holds it as package data
(``attention_conformance/spec/``, found through importlib.resources); an editable
install of a checkout uses the checkout's ``spec/`` folder beside ``conformance/``.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .tolerances import Tolerances, load_tolerances

ENV_VAR = "ATTENTION_CONFORMANCE_SPEC"


def packaged_spec_dir() -> Path:
    """The spec folder shipped with the package, or the checkout's when editable."""
    shipped = Path(str(resources.files("attention_conformance"))) / "spec"
    if (shipped / "cases").is_dir():
        return shipped
    return Path(__file__).resolve().parents[2] / "spec"


@dataclass(frozen=True)
class SpecFolder:
    root: Path
    cases: Path | None = None       # the folder of case files, if not root/cases

    @classmethod
    def at(cls, path) -> "SpecFolder":
        """A spec folder from its root, or from a folder of case files (what --spec-dir
        takes): then its parent holds golden/ and tolerances.yaml."""
        path = Path(path).resolve()
        if (path / "cases").is_dir():
            return cls(path)
        return cls(path.parent, path)

    @classmethod
    def default(cls) -> "SpecFolder":
        override = os.environ.get(ENV_VAR)
        return cls(Path(override).resolve()) if override else cls(packaged_spec_dir())

    @classmethod
    def from_option(cls, path) -> "SpecFolder":
        """--spec-dir PATH if given, else the default folder."""
        return cls.at(path) if path else cls.default()

    @property
    def cases_dir(self) -> Path:
        return self.cases or self.root / "cases"

    @property
    def golden_dir(self) -> Path:
        return self.root / "golden"

    @property
    def tolerances_file(self) -> Path:
        own = self.root / "tolerances.yaml"
        return own if own.is_file() else packaged_spec_dir() / "tolerances.yaml"

    @property
    def schema_file(self) -> Path:
        return packaged_spec_dir() / "schema.json"

    @property
    def tolerances(self) -> Tolerances:
        return load_tolerances(self.tolerances_file)

    def relative(self, path: Path) -> str:
        """A file of this folder as reports name it: spec/cases/x.yaml, or the path."""
        path = Path(path)
        try:
            return str(Path(self.root.name) / path.resolve().relative_to(self.root))
        except ValueError:
            return str(path)


@functools.cache
def default_folder() -> SpecFolder:
    return SpecFolder.default()
