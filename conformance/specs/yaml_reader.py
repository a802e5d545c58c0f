"""Reading spec YAML safely: plain data only, every line remembered, duplicates found.

The loader derives from PyYAML's (C)SafeLoader, so no YAML tag can construct a Python
object (``!!python/object/apply``, ``!!python/name`` ... are refused with a clear
error, and no code from a spec file ever runs). Every mapping remembers the line where
it starts and the line of each of its keys; a key given twice in one mapping is a
problem, where PyYAML would silently keep the last value.

Before anything is constructed, the composed node graph is checked against LIMITS:
the file's size, the number of nodes with every alias expanded (counted memoized, so
an alias bomb costs microseconds), the nesting depth, and the length of integers; and
every node's tag must be plain YAML (string, integer, float, boolean, null, list,
mapping: no !!binary, no dates, no !!set). A problem inside one case sets only that
case aside (see parse_yaml's `problems`); the other cases still load.

Every NaN of a file is one value, NAN, whatever its text (.nan, .NaN, .NAN).
"""

from __future__ import annotations

import re
import struct

import yaml
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from ..model.text import printable

_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGE_TAG = "tag:yaml.org,2002:merge"
_REFUSED_TAG = re.compile(r"could not determine a constructor for the tag '([^']*)'")
_TAG = "tag:yaml.org,2002:"
_PLAIN_TAGS = {_TAG + t for t in ("str", "int", "float", "bool", "null", "seq", "map", "merge")}

#: what a spec file may hold (docs/writing-cases.md, "Limits")
MAX_FILE_BYTES = 1 << 20            # 1 MiB
MAX_NODES = 200_000                 # YAML nodes of a file, every alias expanded
MAX_DEPTH = 32                      # nesting of lists and mappings, the file's top included
MAX_INT_CHARS = 20                  # characters of an integer scalar (2**63 has 19 digits)
MAX_INT = 2 ** 63 - 1               # and its magnitude
_ID_LINE = re.compile(r"""^\s*(?:-\s+)?id:\s*['"]?([A-Za-z0-9._-]+)""")


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

#: the NaN of every spec file: quiet, sign clear. PyYAML makes its NaN as -inf / inf, whose
#: sign is the CPU's (set on x86, clear on ARM), while JSON (the spec cache) reads NaN back
#: as this one: a case's inputs would differ, bit for bit, between a cold and a warm cache
NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_0000))[0]


def _construct_float(loader, node):
    value = loader.construct_yaml_float(node)
    return NAN if value != value else value


_Loader.add_constructor(_TAG + "float", _construct_float)


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


def _line(node) -> int:
    return node.start_mark.line + 1


def _tag_name(tag: str) -> str:
    return tag.replace(_TAG, "!!")


def _own_problem(loader, node, is_key) -> str | None:
    """What is wrong with one node by itself (its tag, an over-long integer), or None."""
    tag = node.tag
    if tag == _TAG + "timestamp":
        return (f"a date or timestamp ({node.value!r}) is refused: spec files hold plain "
                "data; quote it to make it a string")
    if tag not in _PLAIN_TAGS:
        return (f"YAML tag {_tag_name(tag)} is refused: spec files hold plain data "
                "(strings, numbers, booleans, null, lists, mappings), and no tag may "
                "construct a Python object")
    if is_key and not isinstance(node, ScalarNode):
        return "a mapping key must be a string, not a list or mapping"
    if tag == _TAG + "int":
        digits = node.value.lstrip("+-").replace("_", "")
        if len(digits) > MAX_INT_CHARS:
            return (f"an integer of {len(digits)} digits is too long (at most "
                    f"{MAX_INT_CHARS} digits, a 64-bit integer)")
        try:
            value = loader.construct_yaml_int(node)
        except (ValueError, yaml.YAMLError):
            return f"{node.value!r} is not a valid integer"
        if abs(value) > MAX_INT:
            return f"the integer {node.value} is out of range (at most 2**63 - 1 in magnitude)"
    if is_key and tag not in (_TAG + "str", _TAG + "merge"):
        return f"a mapping key must be a string, not {node.value!r} (quote it)"
    return None


def _children(node):
    """(child, is_key) of a node."""
    if isinstance(node, SequenceNode):
        return [(child, False) for child in node.value]
    if isinstance(node, MappingNode):
        return [pair for key, value in node.value for pair in ((key, True), (value, False))]
    return []


class _Measure:
    """Per node, memoized over the graph (an alias is the node it names): its size with
    every alias expanded, its height, and the first problem in it (line, message).
    Iterative, so neither a deep graph nor a cyclic alias can exhaust the stack."""

    def __init__(self, loader):
        self.loader, self.done = loader, {}

    def __call__(self, root, root_is_key=False):
        if id(root) in self.done:
            return self.done[id(root)]
        stack, active = [(root, root_is_key, False)], set()
        while stack:
            node, is_key, expanded = stack.pop()
            if not expanded:
                if id(node) in self.done or id(node) in active:
                    continue
                active.add(id(node))
                stack.append((node, is_key, True))
                for child, child_is_key in _children(node):
                    if id(child) in active:        # an alias of a node that holds it
                        self.done[id(node)] = (float("inf"), float("inf"), (
                            _line(child), "a recursive alias (a node that contains itself) "
                                          "is refused"))
                        break
                    stack.append((child, child_is_key, False))
                continue
            active.discard(id(node))
            if id(node) in self.done:
                continue
            own = _own_problem(self.loader, node, is_key)
            size, height, problem = 1, 1, (_line(node), own) if own else None
            for child, _ in _children(node):
                c_size, c_height, c_problem = self.done[id(child)]
                size, height = size + c_size, max(height, c_height + 1)
                problem = problem or c_problem
            self.done[id(node)] = (size, height, problem)
        return self.done[id(root)]


def _case_id_of(node) -> str | None:
    if isinstance(node, MappingNode):
        for key, value in node.value:
            if isinstance(key, ScalarNode) and key.value == "id" and isinstance(value, ScalarNode):
                return value.value
    return None


def _refuse_case(cases_node, index) -> None:
    """Put an empty mapping where a case was: nothing of it is constructed."""
    old = cases_node.value[index]
    cases_node.value[index] = MappingNode(_TAG + "map", [], old.start_mark, old.end_mark)


def _check_graph(loader, root, file, text) -> list[tuple[int, int, str | None, str]]:
    """Check the composed graph against the limits, before anything is constructed.

    Returns (case index, line, case id, message) for each case found bad, after putting
    an empty mapping in its place; a problem outside every case raises SpecError."""
    measure = _Measure(loader)
    cases_node = None
    if isinstance(root, MappingNode):
        for key, value in root.value:
            if isinstance(key, ScalarNode) and key.value == "cases" and isinstance(value, SequenceNode):
                cases_node = value
    refused = []
    if cases_node is not None:
        for index, node in enumerate(cases_node.value):
            size, height, problem = measure(node)
            if problem is None and height + 2 > MAX_DEPTH:
                problem = (_line(node), f"the case nests {height + 2} levels deep "
                                        f"(at most {MAX_DEPTH})")
            if problem:
                refused.append((index, problem[0], _case_id_of(node), problem[1]))
        for index, *_ in refused:
            _refuse_case(cases_node, index)
        measure = _Measure(loader)       # sizes again, without the refused cases
        size, _, _ = measure(root)
        by_size = sorted(range(len(cases_node.value)), key=lambda i: -measure(cases_node.value[i])[0])
        for index in by_size:
            if size <= MAX_NODES:
                break
            node = cases_node.value[index]
            node_size = measure(node)[0]
            refused.append((index, _line(node), _case_id_of(node),
                            f"the case expands to {node_size:,} YAML nodes with its aliases "
                            f"(a file may hold at most {MAX_NODES:,})"))
            _refuse_case(cases_node, index)
            size -= node_size - 1
    size, height, problem = _Measure(loader)(root)
    if problem is None and size > MAX_NODES:
        problem = (_line(root), f"the file expands to {size:,} YAML nodes with its aliases "
                                f"(at most {MAX_NODES:,})")
    if problem is None and height > MAX_DEPTH:
        problem = (_line(root), f"the file nests {height} levels deep (at most {MAX_DEPTH})")
    if problem:
        raise SpecError(file, problem[0], case_id_near(text, problem[0]), problem[1])
    return sorted(refused)


def parse_yaml(text: str, file, duplicates: list | None = None, problems: list | None = None):
    """Parse YAML text safely; malformed YAML, a refused tag or a limit passed raises
    SpecError.

    A key repeated in one mapping raises SpecError too, unless `duplicates` is a list:
    then each repetition is appended to it as (key, line, first line) and parsing goes on.
    Likewise a problem inside one case of a case file (a refused tag, a limit passed):
    with a list `problems`, (case index, line, case id, message) is appended to it, an
    empty mapping takes the case's place, and the other cases are constructed.
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_FILE_BYTES:
        raise SpecError(file, 1, None, f"the file has {size:,} bytes (at most "
                                       f"{MAX_FILE_BYTES:,}: split it)")
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        refused = _check_graph(loader, root, file, text) if root is not None else []
        if refused and problems is None:
            _, line, case_id, message = refused[0]
            raise SpecError(file, line, case_id, message)
        document = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, text, file) from None
    except RecursionError:
        raise SpecError(file, 0, None, f"the file nests too deep (at most {MAX_DEPTH} "
                                       "levels)") from None
    finally:
        loader.dispose()
    if problems is not None:
        problems += refused
    if duplicates is not None:
        duplicates += loader.duplicates
    elif loader.duplicates:
        key, line, first = loader.duplicates[0]
        raise SpecError(file, line, case_id_near(text, line),
                        f"duplicate key {key!r} (first at line {first})")
    return document
