"""Loading a spec folder: YAML case files, validated against the package's schema.json.

Every file is read with a safe loader (no YAML tag can construct a Python object) that
also finds duplicate mapping keys and remembers the line of every key (spec_yaml.py).
Every problem becomes a :class:`SpecError` naming file, line and case id; a bad case is
set aside, the others still load, and a bad file does not stop the files after it.
The tolerances (which dtypes exist) are the spec folder's own (spec_folder.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from . import cache as spec_cache
from ..model.case import Case, Variant
from ..model.folder import SpecFolder, default_folder
from .schema import schema_errors, schema_validator
from .yaml_reader import MAX_FILE_BYTES, SpecError, parse_yaml
from ..model.tolerances import TolerancesError, load_tolerances
from .validation import TOPIC_PATTERN, number_errors, planned_limit, static_errors


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


def _file_name(path: Path, relative_to: Path | None) -> str:
    try:
        return str(path.relative_to(relative_to)) if relative_to else str(path)
    except ValueError:
        return str(path)


def _case_of_line(raw_cases, line) -> int | None:
    """Index of the case whose text holds `line` (None: above the first case)."""
    index = None
    for i, raw in enumerate(raw_cases):
        if getattr(raw, "line", line + 1) <= line:
            index = i
    return index


def _duplicate_errors(duplicates, raw_cases, name) -> list[tuple[int | None, SpecError]]:
    found = []
    for key, line, first in duplicates:
        index = _case_of_line(raw_cases, line)
        case_id = raw_cases[index].get("id") if index is not None else None
        found.append((index, SpecError(name, line, case_id,
                                       f"duplicate key {key!r} (first at line {first})")))
    return found


def _number_errors(raw_cases, found, refused, name) -> list[tuple[int, SpecError]]:
    """The non-finite numbers of each case set aside by the schema (or a duplicate key),
    which validation would find only once those are fixed, on lines they do not name:
    one run shows a case's independent problems together. A case refused by a tag or a
    limit is not walked (its data may not be what it seems, or too large)."""
    lines: dict[int, set] = {}
    for index, error in found:
        if index is not None and index not in refused:
            lines.setdefault(index, set()).add(error.line)
    extra = []
    for index, named in sorted(lines.items()):
        raw = raw_cases[index] if index < len(raw_cases) else None
        if isinstance(raw, dict):
            extra += [(index, error) for error in number_errors(raw, name, raw.get("id"))
                      if error.line not in named]
    return extra


def _params(raw) -> dict:
    """A case's params, plain, a block table's `{range: [start, stop, step]}` items
    written out as the page ids of Python's range (a scale case's table of 16,384 pages
    is one line)."""
    params = _plain(raw.get("params", {}))
    if isinstance(params.get("block_table"), list):
        params["block_table"] = [
            [i for item in row for i in (range(*item["range"]) if _is_range(item)
                                          else (item,))] if isinstance(row, list) else row
            for row in params["block_table"]]
    return params


def _is_range(item) -> bool:
    """A block table item {range: [start, stop(, step)]} with a step other than 0 (the
    rest are left for the schema and shapes.py to refuse)."""
    bounds = item.get("range") if isinstance(item, dict) else None
    return isinstance(bounds, list) and 2 <= len(bounds) <= 3 and bounds[2:] != [0] \
        and all(isinstance(b, int) for b in bounds)


def _case(raw, topic, name, line=None) -> Case:
    return Case(
        id=raw["id"], topic=topic, description=raw["description"],
        source=raw["source"], op=raw["op"], inputs=_plain(raw["inputs"]),
        params=_params(raw), dtypes=tuple(raw["dtypes"]),
        expect=_plain(raw["expect"]), variants=_variants(raw),
        profile=raw.get("profile", "quick"), file=name,
        min_memory_gb=float(raw.get("min_memory_gb", 0)), layout=_plain(raw.get("layout", {})),
        line=raw.line if line is None else line, raw=raw)


def load_file(path: Path, relative_to: Path | None = None,
              schema: Path | None = None) -> tuple[list[Case], list[SpecError]]:
    """The valid cases of one file, and every problem found in it."""
    name = _file_name(path, relative_to)
    duplicates, refused = [], []
    try:
        if path.stat().st_size > MAX_FILE_BYTES:     # refused before it is read
            raise SpecError(name, 1, None, f"the file has {path.stat().st_size:,} bytes "
                                           f"(at most {MAX_FILE_BYTES:,}: split it)")
        document = parse_yaml(path.read_text(encoding="utf-8"), name, duplicates, refused)
    except SpecError as exc:
        return [], [exc]
    except (OSError, UnicodeDecodeError) as exc:
        return [], [SpecError(name, 0, None, f"cannot read: {exc}")]
    if not isinstance(document, dict):
        return [], [SpecError(name, 1, None, "a case file is a mapping with 'topic' and 'cases'")]
    raw_cases = document.get("cases") if isinstance(document.get("cases"), list) else []
    refused_indexes = {index for index, *_ in refused}
    found = [(index, error) for index, error in
             schema_errors(document, name, schema_validator(schema or default_folder().schema_file))
             if index not in refused_indexes or index is None]
    found += [(index, SpecError(name, line, case_id, message))
              for index, line, case_id, message in refused]
    topic = document.get("topic")
    # (a topic that is not lowercase-with-dashes to its end is the schema's error)
    if isinstance(topic, str) and re.fullmatch(TOPIC_PATTERN, topic) and topic != path.stem:
        found.append((None, SpecError(name, getattr(document, "key_lines", {}).get("topic", 1), None,
                                      f"topic {topic!r} is not the file's name {path.stem!r}")))
    found += _duplicate_errors(duplicates, raw_cases, name)
    found += _number_errors(raw_cases, found, refused_indexes, name)
    errors = [error for _, error in sorted(found, key=lambda pair: pair[1].line)]
    if any(index is None for index, _ in found):
        return [], errors          # a problem outside every case: no case of the file loads
    bad = {index for index, _ in found}
    cases = [_case(raw, document["topic"], name)
             for index, raw in enumerate(raw_cases) if index not in bad]
    return cases, errors


@dataclass
class Spec:
    cases: list[Case]
    errors: list[SpecError]

    def by_id(self) -> dict[str, Case]:
        return {c.id: c for c in self.cases}


def _tolerance_dtypes(path: Path, name: str) -> tuple[set | None, list[SpecError]]:
    """The dtypes that have a tolerance in `path` (None if the file is not the rule)."""
    try:
        return set(load_tolerances(path).unit_roundoff), []
    except TolerancesError as exc:
        return None, [SpecError(name, exc.line, None, exc.message)]
    except OSError as exc:
        return None, [SpecError(name, 0, None, f"cannot read tolerances: {exc}")]


def _admit(spec: Spec, case: Case, seen: dict, check_case) -> None:
    """Add a case to the spec, or its problems (what check_case finds); its id is noted
    in `seen` (id -> every case of that id) for _set_aside_duplicates."""
    seen.setdefault(case.id, []).append(case)
    problems = check_case(case)
    spec.errors += problems
    if not problems:
        spec.cases.append(case)


def _set_aside_duplicates(spec: Spec, seen: dict) -> None:
    """A case id used more than once: neither case wins (the loader cannot know which is
    the newcomer); each occurrence is a problem naming the others, and none runs."""
    repeated = {case_id: cases for case_id, cases in seen.items() if len(cases) > 1}
    if not repeated:
        return
    spec.cases = [case for case in spec.cases if case.id not in repeated]
    for case_id, cases in repeated.items():
        for case in cases:
            others = ", ".join(other.where() for other in cases if other is not case)
            spec.errors.append(SpecError(case.file, case.line, case_id,
                                         f"duplicate case id (also at {others}): neither "
                                         "case runs until one is renamed"))


def _from_cache(name: str, key: str) -> list[Case] | None:
    """The cases of a file's cache entry, or None (a miss: the file validates in full):
    no entry, one this code did not write (spec_cache), or one whose cases are not
    cases or pass a limit."""
    stored = spec_cache.read(key)
    if stored is None:
        return None
    try:
        cases = [_case(entry["data"], stored["topic"], name, entry["line"])
                 for entry in stored["cases"]]
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return None if any(planned_limit(case) for case in cases) else cases


def missing_cases_folder(cases_dir: Path) -> SpecError | None:
    """The problem of a folder of case files that is not there (certify asks it before
    pytest, which would say only that its --rootdir was not found)."""
    return None if cases_dir.is_dir() else SpecError(cases_dir, 0, None,
                                                    "no such folder of case files")


def load_spec(folder: SpecFolder | Path | str | None = None, *, check=True,
              cache=False) -> Spec:
    """Every case of a spec folder, with every problem found (nothing is raised).

    folder: a SpecFolder, or the path of a spec folder or of its cases folder
    (default: the default spec folder). cache: take files that validated cleanly
    before, unchanged, from spec_cache (the pytest plugin, `list`, `export` and the
    API do; `validate`, `golden` and the tests of loading do not).
    """
    if not isinstance(folder, SpecFolder):
        folder = default_folder() if folder is None else SpecFolder.at(folder)
    cases_dir = folder.cases_dir
    missing = missing_cases_folder(cases_dir)
    if missing:
        return Spec([], [missing])
    root = folder.root.parent
    schema, tolerances = folder.schema_file, folder.tolerances_file
    tolerance_name = _file_name(tolerances, root)
    known_dtypes, errors = _tolerance_dtypes(tolerances, tolerance_name)
    if known_dtypes is None:            # without the rule no case can be checked
        return Spec([], errors)
    misnamed = sorted(cases_dir.glob("*.yml"))
    errors += [SpecError(_file_name(p, root), 0, None, f"case files end in .yaml: this file "
                                                       f"is not loaded (rename it {p.stem}.yaml)")
               for p in misnamed]
    if not misnamed and not any(cases_dir.glob("*.yaml")):
        return Spec([], errors + [SpecError(cases_dir, 0, None,
                                            "no case files (*.yaml) in this folder")])
    spec, seen = Spec([], errors), {}
    for path in sorted(cases_dir.glob("*.yaml")):
        if path.is_symlink() or not path.is_file():
            spec.errors.append(SpecError(_file_name(path, root), 0, None, "a case file must be a"
                                         " regular file inside the folder (a link is refused)"))
            continue
        budget = [0, 0]           # elements of the file's valid cases (validation.py)
        check_case = (lambda case, budget=budget:
                      static_errors(case, known_dtypes, tolerance_name, budget)) \
            if check else (lambda case: [])
        key = _cache_key(path, schema, known_dtypes) if cache and check else None
        cached = key and _from_cache(_file_name(path, root), key)
        if cached:
            for case in cached:
                _admit(spec, case, seen, lambda case: [])
            continue
        try:
            cases, file_errors = load_file(path, root, schema)
        except (OSError, ValueError) as exc:       # the schema itself is unreadable
            return Spec([], errors + [SpecError(schema, 0, None, f"cannot read schema: {exc}")])
        spec.errors += file_errors
        before = len(spec.errors)
        for case in cases:
            _admit(spec, case, seen, check_case)
        if key and cases and not file_errors and len(spec.errors) == before:
            spec_cache.write(key, cases[0].topic, [(c.line, _plain(c.raw)) for c in cases])
    _set_aside_duplicates(spec, seen)
    return spec


def _cache_key(path: Path, schema: Path, known_dtypes) -> str | None:
    try:
        return spec_cache.file_key(path.read_bytes(), schema, known_dtypes)
    except OSError:
        return None
