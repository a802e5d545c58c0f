"""Reading spec YAML safely: plain data only, every line remembered, duplicates found.

The loader derives from PyYAML's (C)SafeLoader, so no YAML tag can construct a Python
object (``!!python/object/apply``, ``!!python/name`` ... are refused with a clear
error, and no code from a spec file ever runs). Every mapping remembers the line where
it starts and the line of each of its keys; a key given twice in one mapping is a
problem, where PyYAML would silently keep the last value.
"""

from __future__ import annotations

import re

import yaml

_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGE_TAG = "tag:yaml.org,2002:merge"
_REFUSED_TAG = re.compile(r"could not determine a constructor for the tag '([^']*)'")
_ID_LINE = re.compile(r"""^\s*(?:-\s+)?id:\s*['"]?([A-Za-z0-9._-]+)""")


def printable(text) -> str:
    """Spec text made safe for a terminal: control characters (an ANSI escape, a
    carriage return) shown as escapes, newlines and tabs kept."""
    return "".join(c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in str(text))


class SpecError(Exception):
    """A problem in a spec file, located by file, line and case id."""

    def __init__(self, file, line, case_id, message):
        self.file, self.line, self.case_id, self.message = str(file), line, case_id, message
        super().__init__(str(self))

    def __str__(self):
        where = f"{self.file}:{self.line}" if self.line else self.file
        case = f" case {self.case_id!r}:" if self.case_id else ""
        return printable(f"{where}:{case} {self.message}")


class LineDict(dict):
    """A mapping that remembers the line (1-based) where it starts and where each key is."""

    def __init__(self, line=0):
        super().__init__()
        self.line = line
        self.key_lines = {}


class _Loader(_BaseLoader):
    def __init__(self, stream):
        super().__init__(stream)
        self.duplicates = []        # (key, line, first line)


def _construct_mapping(loader, node):
    explicit = sum(1 for key, _ in node.value if key.tag != _MERGE_TAG)
    loader.flatten_mapping(node)
    merged = len(node.value) - explicit      # merged pairs come first; explicit keys override
    result, explicit_keys = LineDict(node.start_mark.line + 1), set()
    for position, (key_node, value_node) in enumerate(node.value):
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, f"found an unhashable key {key!r}", key_node.start_mark) from None
        if position >= merged and key in explicit_keys:
            loader.duplicates.append((key, line, result.key_lines[key]))
        if position >= merged:
            explicit_keys.add(key)
        result.key_lines[key] = line
        result[key] = loader.construct_object(value_node, deep=True)
    return result


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def case_id_near(text: str, line: int) -> str | None:
    """The id of the case written at or above `line` (for errors found before parsing)."""
    found = None
    for row in text.splitlines()[:line]:
        match = _ID_LINE.match(row)
        if match:
            found = match.group(1)
    return found


def _yaml_error(exc: yaml.YAMLError, text: str, file) -> SpecError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line = mark.line + 1 if mark else 0
    problem = getattr(exc, "problem", None) or str(exc)
    refused = _REFUSED_TAG.search(problem)
    if refused:
        tag = refused.group(1).replace("tag:yaml.org,2002:", "!!")
        message = (f"YAML tag {tag} is refused: spec files hold plain data, and no tag "
                   "may construct a Python object")
    else:
        context = getattr(exc, "context", None)
        message = f"invalid YAML: {problem}" + (f" ({context})" if context else "")
    return SpecError(file, line, case_id_near(text, line), message)


def parse_yaml(text: str, file, duplicates: list | None = None):
    """Parse YAML text safely; malformed YAML or a refused tag raises SpecError.

    A key repeated in one mapping raises SpecError too, unless `duplicates` is a list:
    then each repetition is appended to it as (key, line, first line) and parsing goes on.
    """
    loader = _Loader(text)
    try:
        document = loader.get_single_data()
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, text, file) from None
    finally:
        loader.dispose()
    if duplicates is not None:
        duplicates += loader.duplicates
    elif loader.duplicates:
        key, line, first = loader.duplicates[0]
        raise SpecError(file, line, case_id_near(text, line),
                        f"duplicate key {key!r} (first at line {first})")
    return document
