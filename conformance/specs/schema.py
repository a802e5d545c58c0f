"""Validating a parsed case file against the package's schema.json, with readable messages.

Each schema error becomes (case index or None, SpecError) with the line of the key at
fault, the case id, and a message in the spec's own words ("unknown op 'sdpaa'",
"unknown key 'colour'", "an input needs exactly one generator").
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from ..model.policies import POLICIES
from .yaml_reader import SpecError

_SINGULAR = {"dtypes": "dtype", "properties": "property", "cases": "case"}


def _is_integer(checker, instance) -> bool:
    """An integer is an int: JSON Schema's own "integer" also takes 2.0."""
    return isinstance(instance, int) and not isinstance(instance, bool)


def _pattern(validator, pattern, instance, schema):
    """An anchored pattern ("^...$") matches the whole string: with re.search, "$" also
    matches before a final newline, so "an-id\n" would pass."""
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "string"):
        return
    anchored = pattern.startswith("^") and pattern.endswith("$")
    if not (re.fullmatch if anchored else re.search)(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


@functools.cache
def schema_validator(path: Path):
    """A Draft 2020-12 validator (jsonschema is imported only when a file is validated),
    where an integer is an int (not 2.0) and an anchored pattern matches to the string's
    end (not before a final newline).

    Its registry is empty: a $ref outside the schema itself is never fetched, from the
    network or from a file."""
    from jsonschema import Draft202012Validator, validators
    from referencing import Registry

    strict = validators.extend(
        Draft202012Validator, validators={"pattern": _pattern},
        type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer))
    return strict(json.loads(Path(path).read_text(encoding="utf-8")), registry=Registry())


def schema_errors(document, file, validator) -> list[tuple[int | None, SpecError]]:
    """Every schema problem of a document: (index of its case or None, SpecError)."""
    raw = list(validator.iter_errors(document))
    found = []
    for error in raw:
        path = list(error.absolute_path)
        if error.validator == "oneOf" and _explained_elsewhere(error, path, raw):
            continue
        index = path[1] if len(path) >= 2 and path[0] == "cases" else None
        where = "/".join(str(p) for p in path) or "(top)"
        spec_error = SpecError(file, _line(document, path, error), _case_id(document, index),
                               f"schema: at {where}: {_message(error, path)}")
        found.append((index if isinstance(index, int) else None, spec_error))
    return sorted(found, key=lambda pair: (pair[1].line, pair[1].message))


def _explained_elsewhere(error, path, errors) -> bool:
    """A oneOf failure is noise when another error at or below its path says more."""
    return any(other is not error and list(other.absolute_path)[:len(path)] == path
               for other in errors)


def _case_id(document, index):
    try:
        case = document["cases"][index]
    except (KeyError, IndexError, TypeError):
        return None
    return case.get("id") if isinstance(case, dict) else None


def _line(document, path, error) -> int:
    """Line of the key at fault: the innermost key on the path, or the offending key."""
    line, node = getattr(document, "line", 0), document
    for key in path:
        try:
            child = node[key]
        except (KeyError, IndexError, TypeError):
            break
        line = getattr(node, "key_lines", {}).get(key) or getattr(child, "line", line)
        node = child
    offending = _unknown_keys(error) or ([error.instance] if _is_name_error(error) else [])
    key_lines = getattr(node, "key_lines", {})
    return key_lines.get(offending[0], line) if offending else line


def _unknown_keys(error) -> list:
    if error.validator != "additionalProperties" or not isinstance(error.instance, dict):
        return []
    known = error.schema.get("properties", {})
    return [key for key in error.instance if key not in known]


def _is_name_error(error) -> bool:
    return "propertyNames" in error.relative_schema_path


def _noun(path, error) -> str:
    keys = [p for p in path if isinstance(p, str)]
    last = keys[-1] if keys else "value"
    if _is_name_error(error):
        return "policy" if last == "policy" else f"choice of {last}"
    return _SINGULAR.get(last, last)


def _known_values(path, error):
    """The enum's values; a policy's own choices rather than every policy's."""
    keys = [p for p in path if isinstance(p, str)]
    if _is_name_error(error) and keys and keys[-1] in POLICIES:
        return POLICIES[keys[-1]]
    return error.validator_value


def _message(error, path) -> str:
    if error.validator == "additionalProperties" and _unknown_keys(error):
        known = ", ".join(error.schema.get("properties", {}))
        return f"unknown key {_unknown_keys(error)[0]!r} (known: {known})"
    if error.validator == "enum":
        known = ", ".join(str(v) for v in _known_values(path, error))
        return f"unknown {_noun(path, error)} {error.instance!r} (known: {known})"
    if error.validator == "required" and "'seed'" in error.message:
        return f"{error.message}: every random input needs its own seed"
    if error.validator == "oneOf":
        return _one_of_message(error)
    if (error.validator == "type" and "integer" in _as_list(error.validator_value)
            and isinstance(error.instance, float)):
        hint = f" (write {int(error.instance)})" if error.instance.is_integer() else ""
        return f"{error.instance!r} is not an integer{hint}"
    return error.message[:200]


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _one_of_message(error) -> str:
    options = [s["required"][0] for s in error.validator_value
               if list(s) == ["required"] and len(s["required"]) == 1]
    if options and isinstance(error.instance, dict):
        given = [key for key in options if key in error.instance]
        what = f"it has {', '.join(given)}" if given else "it has none"
        return f"an input needs exactly one generator of {', '.join(options)}; {what}"
    reasons = sorted({c.message for c in error.context or ()})[:3]
    return f"{error.instance!r} matches none of the allowed forms ({'; '.join(reasons)})"[:240]
