"""Text from outside the suite (a spec file, an adapter's message or output) made safe
for a terminal: control characters shown as escapes, newlines and tabs kept."""

from __future__ import annotations


def printable(text) -> str:
    """str(text) with every control character (an ANSI escape, a carriage return, a bell)
    shown as its escape, so that nothing a backend or a spec says can drive a terminal."""
    text = str(text)
    if text.isprintable():          # most texts (every "" of a pass): nothing to escape
        return text
    return "".join(c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in text)
