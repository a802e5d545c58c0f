"""Index expressions of the spec ("[0]", "[..., 1:3, -1]"), parsed without eval."""

from __future__ import annotations

import re

_OUTPUT_AND_INDEX = re.compile(r"^([a-z_][a-z0-9_]*)?(\[.*\])$")


def split_target(text: str, default_output: str = "out") -> tuple[str, tuple]:
    """'dv[0, :]' -> ('dv', (0, slice(None))); '[0]' -> (default_output, (0,))."""
    match = _OUTPUT_AND_INDEX.match(text.strip())
    if not match:
        raise ValueError(f"not an index expression: {text!r}")
    return match.group(1) or default_output, parse_index(match.group(2))


def parse_index(text: str) -> tuple:
    text = text.strip()
    if not (text.startswith("[") and text.endswith("]")):
        raise ValueError(f"an index is written in brackets, got {text!r}")
    body = text[1:-1].strip()
    if not body:
        return ()
    return tuple(_parse_item(item.strip(), text) for item in body.split(","))


def _parse_item(item: str, whole: str):
    if item == "...":
        return Ellipsis
    if ":" in item:
        parts = item.split(":")
        if len(parts) > 3:
            raise ValueError(f"bad slice {item!r} in {whole!r}")
        bounds = [_parse_int(p, whole) if p.strip() else None for p in parts]
        return slice(*bounds)
    return _parse_int(item, whole)


def _parse_int(text: str, whole: str) -> int:
    text = text.strip()
    if not re.fullmatch(r"-?\d+", text):
        raise ValueError(f"bad index {text!r} in {whole!r}")
    return int(text)
