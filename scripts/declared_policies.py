"""The declared `policy`, `op_policy`, `policy_when` and `dtype_notes` of each built-in
backend, read from the adapter modules' source with `ast`: no framework is imported (a
page about torch's policies must render where torch is not installed).

A declaration is a dict or list literal of the class (or a dict of `self.policy` in its
`__init__`), `dict(Base.policy, name=choice, ...)`, `Base.policy_when`, or the base
class's (in the same module, or imported from a sibling module: `from .torch import
TorchBackend`). Any other form is an
error naming the class, so that a new form is taught here rather than misread;
tests/tooling/test_findings.py holds what this reads equal to what the backends declare
where their frameworks are installed.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ROOT / "backends"
ATTRIBUTES = ("policy", "op_policy", "policy_when", "dtype_notes")
#: what an attribute is when neither the class nor a base declares it
EMPTY = {"policy_when": list}


def builtin() -> dict[str, tuple[str, str]]:
    """Built-in name -> (module file stem, class name), from backends/__init__.py's BUILTIN."""
    tree = ast.parse((BACKENDS / "__init__.py").read_text())
    table = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "BUILTIN" for t in node.targets))
    return {name: (ref.split(":")[0].rsplit(".", 1)[1], ref.split(":")[1])
            for name, ref in table.items()}


def _class(module: str, name: str) -> tuple[str, ast.ClassDef]:
    """(the module that defines it, its ClassDef), following `from .module import name`."""
    tree = ast.parse((BACKENDS / f"{module}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return module, node
        if isinstance(node, ast.ImportFrom) and node.level == 1 and \
                any(alias.name == name for alias in node.names):
            return _class(node.module, name)
    raise LookupError(f"backends/{module}.py: no class {name}")


def _assigned(cls: ast.ClassDef, attribute: str):
    """The value assigned to the attribute in the class body, or to self.ATTR in __init__."""
    for node in cls.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == attribute
                                                for t in node.targets):
            return node.value
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"),
                None)
    for node in ast.walk(init) if init else ():
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Attribute) and t.attr == attribute for t in node.targets) \
                and isinstance(node.value, ast.Dict):
            return node.value
    return None


def declared(module: str, name: str, attribute: str = "policy") -> dict:
    """The attribute's value as the class declares it ({} if neither it nor a base does)."""
    module, cls = _class(module, name)
    value = _assigned(cls, attribute)
    if value is None:
        bases = [b.id for b in cls.bases if isinstance(b, ast.Name)]
        return declared(module, bases[0], attribute) if bases else EMPTY.get(attribute, dict)()
    if isinstance(value, (ast.Dict, ast.List)):
        return ast.literal_eval(value)
    if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and \
            value.attr == attribute:                  # policy_when = Base.policy_when
        return declared(module, value.value.id, attribute)
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "dict" and \
            len(value.args) == 1 and isinstance(value.args[0], ast.Attribute):
        base = declared(module, value.args[0].value.id, attribute)
        return {**base, **{k.arg: ast.literal_eval(k.value) for k in value.keywords}}
    raise ValueError(f"backends/{module}.py: {name}.{attribute} is neither a literal, "
                     f"Base.{attribute} nor dict(Base.{attribute}, ...) (line {value.lineno})")


def declarations() -> dict[str, dict]:
    """Built-in name -> {"policy": {...}, "op_policy": {...}, "policy_when": [...],
    "dtype_notes": {...}}, in BUILTIN's order."""
    return {name: {a: declared(module, cls, a) for a in ATTRIBUTES}
            for name, (module, cls) in builtin().items()}
