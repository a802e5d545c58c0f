"""Loading the spec: YAML case files, validated against spec/schema.json.

Every file is read with a safe loader (no YAML tag can construct a Python object) that
also refuses duplicate mapping keys and remembers the line of every mapping. Every
problem becomes a :class:`SpecError` naming file, line and case id; a bad case is set
aside and the others still load.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator

from .paths import SPEC_DIR

_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SpecError(Exception):
    """A problem in a spec file, located by file, line and case id."""

    def __init__(self, file, line, case_id, message):
        self.file, self.line, self.case_id, self.message = str(file), line, case_id, message
        super().__init__(str(self))

    def __str__(self):
        where = f"{self.file}:{self.line}" if self.line else self.file
        case = f" case {self.case_id!r}:" if self.case_id else ""
        return f"{where}:{case} {self.message}"


class LineDict(dict):
    """A mapping that remembers the line (1-based) where it starts."""

    line = 0


class _Loader(_BaseLoader):
    pass


def _construct_mapping(loader, node):
    loader.flatten_mapping(node)
    result = LineDict()
    result.line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in result:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        result[key] = loader.construct_object(value_node, deep=True)
    return result


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


@dataclass(frozen=True)
class Variant:
    """One binding of a case's named dims; label '' when the case has none."""

    label: str
    dims: dict


@dataclass(frozen=True)
class Case:
    id: str
    topic: str
    description: str
    source: str
    op: str
    inputs: dict
    params: dict
    dtypes: tuple
    expect: dict
    variants: tuple
    profile: str
    file: str
    line: int
    raw: dict = field(repr=False, compare=False, default_factory=dict)

    def where(self) -> str:
        return f"{self.file}:{self.line}"


@functools.cache
def schema_validator() -> Draft202012Validator:
    schema = json.loads((SPEC_DIR / "schema.json").read_text())
    return Draft202012Validator(schema)


def parse_yaml(text: str, file) -> Any:
    """Parse YAML text safely; malformed YAML or a duplicate key raises SpecError."""
    try:
        return yaml.load(text, Loader=_Loader)  # _Loader derives from (C)SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 0
        return_msg = f"{exc.problem or exc}" + (f" ({exc.context})" if exc.context else "")
        raise SpecError(file, line, None, f"invalid YAML: {return_msg}") from None
    except yaml.YAMLError as exc:
        raise SpecError(file, 0, None, f"invalid YAML: {exc}") from None


def _line_of(document, path) -> int:
    """Line of the innermost mapping on a JSON path through the document."""
    line, node = getattr(document, "line", 0), document
    for key in path:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            break
        line = getattr(node, "line", line)
    return line


def _schema_errors(document, file) -> list[SpecError]:
    errors = []
    for error in sorted(schema_validator().iter_errors(document), key=lambda e: list(e.path)):
        path = list(error.absolute_path)
        case_id = None
        if len(path) >= 2 and path[0] == "cases" and isinstance(path[1], int):
            case = document["cases"][path[1]]
            case_id = case.get("id") if isinstance(case, dict) else None
        location = "/".join(str(p) for p in path) or "(top)"
        errors.append(SpecError(file, _line_of(document, path), case_id,
                                f"schema: at {location}: {_short(error)}"))
    return errors


def _short(error) -> str:
    if error.validator == "additionalProperties":
        return error.message.replace("Additional properties are not allowed", "unknown key")
    if error.validator == "oneOf" and error.context:
        best = min(error.context, key=lambda e: len(list(e.path)))
        return f"{error.message[:80]}... ({best.message[:120]})"
    return error.message[:200]


def _variants(raw) -> tuple[Variant, ...]:
    dims = raw.get("dims")
    if not dims:
        return (Variant("", {}),)
    return tuple(Variant("-".join(f"{k}{v}" for k, v in d.items()), dict(d)) for d in dims)


def _plain(value):
    """LineDicts back to plain dicts, recursively."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def load_file(path: Path, relative_to: Path | None = None) -> tuple[list[Case], list[SpecError]]:
    """The valid cases of one file, and every problem found in it."""
    name = str(path.relative_to(relative_to)) if relative_to else str(path)
    try:
        document = parse_yaml(path.read_text(encoding="utf-8"), name)
    except SpecError as exc:
        return [], [exc]
    except (OSError, UnicodeDecodeError) as exc:
        return [], [SpecError(name, 0, None, f"cannot read: {exc}")]
    if not isinstance(document, dict):
        return [], [SpecError(name, 1, None, "a case file is a mapping with 'topic' and 'cases'")]
    errors = _schema_errors(document, name)
    bad = {e.case_id for e in errors}
    if any(e.case_id is None for e in errors):
        return [], errors
    cases = []
    for raw in document["cases"]:
        if raw["id"] in bad:
            continue
        cases.append(Case(
            id=raw["id"], topic=document["topic"], description=raw["description"],
            source=raw["source"], op=raw["op"], inputs=_plain(raw["inputs"]),
            params=_plain(raw.get("params", {})), dtypes=tuple(raw["dtypes"]),
            expect=_plain(raw["expect"]), variants=_variants(raw),
            profile=raw.get("profile", "quick"), file=name, line=raw.line, raw=raw))
    return cases, errors


@dataclass
class Spec:
    cases: list[Case]
    errors: list[SpecError]

    def by_id(self) -> dict[str, Case]:
        return {c.id: c for c in self.cases}


def load_spec(cases_dir: Path | None = None, *, check=True) -> Spec:
    """Every case under spec/cases, with every problem found (nothing is raised)."""
    from .checks_static import static_errors

    cases_dir = Path(cases_dir or SPEC_DIR / "cases")
    root = cases_dir.parent.parent if cases_dir.parent.name == "spec" else cases_dir.parent
    all_cases, errors, seen = [], [], {}
    for path in sorted(cases_dir.glob("*.yaml")):
        cases, file_errors = load_file(path, root)
        errors += file_errors
        for case in cases:
            if case.id in seen:
                errors.append(SpecError(case.file, case.line, case.id,
                                        f"duplicate case id (first at {seen[case.id]})"))
                continue
            problems = static_errors(case) if check else []
            if problems:
                errors += problems
                continue
            seen[case.id] = case.where()
            all_cases.append(case)
    return Spec(all_cases, errors)
