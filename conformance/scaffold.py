"""`attention-conformance new-backend NAME DIR`: the adapter package of
docs/adding-a-backend.md, written from the templates the package carries
(templates/*.tmpl), so that the guide needs no checkout. The repository's
examples/toy_backend is what `new-backend toy` writes (a test holds them equal).

A template's placeholders: {{name}} the backend's name (its entry point, its test ids'
`on backend ...`), {{package}} the import package, {{dist}} the distribution, {{class}}
the adapter's class.
"""

from __future__ import annotations

import re
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent / "templates"
#: file of the written package -> its template
LAYOUT = {"pyproject.toml": "pyproject.toml.tmpl",
          "src/{package}/__init__.py": "library.py.tmpl",
          "src/{package}/adapter.py": "adapter.py.tmpl"}
NAME = re.compile(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*")


class ScaffoldError(ValueError):
    """A name or folder new-backend refuses."""


def placeholders(name: str) -> dict[str, str]:
    """The names of a backend's package: toy -> toy_attention, toy-attention, ToyBackend."""
    if not NAME.fullmatch(name):
        raise ScaffoldError(f"backend name {name!r}: lower-case letters and digits, words "
                            "joined by - or _, starting with a letter (e.g. my-kernel)")
    words = re.split(r"[-_]", name)
    return {"name": name, "package": "_".join(words) + "_attention",
            "dist": "-".join(words) + "-attention",
            "class": "".join(w.capitalize() for w in words) + "Backend"}


def render(name: str) -> dict[str, str]:
    """Relative path -> text of every file of the package for this backend name."""
    values = placeholders(name)
    files = {}
    for path, template in LAYOUT.items():
        text = (TEMPLATES / template).read_text(encoding="utf-8")
        for key, value in values.items():
            text = text.replace("{{" + key + "}}", value)
        files[path.format(**values)] = text
    return files


def write(name: str, directory: Path) -> list[Path]:
    """Write the package into directory (new or empty); the paths written."""
    directory = Path(directory)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise ScaffoldError(f"{directory} exists and is not an empty folder")
    written = []
    for relative, text in render(name).items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
