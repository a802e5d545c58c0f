"""What a backend declares: name, dtypes, policy (and optionally op_policy, policy_when,
dtype_notes, invariants, versions, paths, expected_failures_file, distributed), and the
ops it implements.

The interface is structural: an adapter never has to import the suite. The ops it
implements are those of model/ops.py; docs/interface.md is the contract in words. A
declaration that is not what the interface says is one clear error when the backend is
loaded. The suite reads a backend's declaration once, as a `Declaration` (plain data:
it crosses from the backend's process), and never the adapter's attributes again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..model.dtypes import DTYPES
from ..model.invariants import invariants_problems
from ..model.ops import OPS
from ..model.policies import POLICIES, condition_holds, condition_problem
from ..model.sharding import FORMS


def really_has(adapter: Any, name: str) -> bool:
    """The attribute is the instance's or a class's, not one a catch-all __getattr__ makes up."""
    if name in getattr(adapter, "__dict__", {}):
        return True
    return any(name in vars(cls) for cls in type(adapter).__mro__)


@dataclass(frozen=True)
class Declaration:
    name: str
    dtypes: frozenset
    policy: dict
    op_policy: dict = field(default_factory=dict)       # op -> {policy: choice}
    versions: dict = field(default_factory=dict)
    paths: dict = field(default_factory=dict)
    module: str = ""                                    # the module of the adapter's class
    expected_failures_file: str = ""
    ops: tuple = ()                                     # the ops the adapter implements
    #: ({"when": {condition: value}, "policy": {policy: choice}}, ...): first match wins
    policy_when: tuple = ()
    dtype_notes: dict = field(default_factory=dict)     # dtype left out -> why
    invariants: tuple = ()                              # declared bitwise invariants
    distributed: str = ""                               # its distributed form, if any

    def as_dict(self) -> dict:
        return {**asdict(self), "dtypes": sorted(self.dtypes), "ops": list(self.ops),
                "invariants": list(self.invariants),
                "policy_when": [dict(rule) for rule in self.policy_when]}

    @classmethod
    def from_dict(cls, data) -> "Declaration":
        """A declaration as it crossed from the backend's process (ValueError if it is not
        one: that process runs the adapter's code, and may have been tampered with)."""
        if not isinstance(data, dict) or set(data) != set(cls.__dataclass_fields__):
            raise ValueError(f"not a declaration: {str(data)[:200]}")
        text = {k: data[k] for k in ("name", "module", "expected_failures_file", "distributed")}
        names = {"dtypes": data["dtypes"], "ops": data["ops"], "invariants": data["invariants"]}
        tables = {k: data[k] for k in ("policy", "versions", "paths", "dtype_notes")}
        if not all(isinstance(v, str) for v in text.values()) \
                or not all(isinstance(v, list) and all(isinstance(x, str) for x in v)
                           for v in names.values()) \
                or not all(_str_table(v) for v in tables.values()) \
                or not isinstance(data["op_policy"], dict) \
                or not all(isinstance(op, str) and _str_table(c) for op, c in data["op_policy"].items()) \
                or _policy_when_problems(data["policy_when"]) \
                or invariants_problems(data["invariants"]):
            raise ValueError(f"not a declaration: {str(data)[:200]}")
        return cls(**text, **tables, dtypes=frozenset(names["dtypes"]), ops=tuple(names["ops"]),
                   op_policy=data["op_policy"], policy_when=tuple(data["policy_when"]),
                   invariants=tuple(names["invariants"]))


def _str_table(value) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str)
                                           for k, v in value.items())


def declare(adapter: Any) -> Declaration:
    """The adapter's declaration as plain data (after declaration_problems found none)."""
    def plain(name, kind):
        try:
            return kind(getattr(adapter, name)) if really_has(adapter, name) else kind()
        except Exception:
            return kind()

    def table(value) -> dict:
        return {str(k): str(v) for k, v in value.items()}
    own_file = getattr(adapter, "expected_failures_file", None) \
        if really_has(adapter, "expected_failures_file") else None
    return Declaration(
        name=str(adapter.name), dtypes=frozenset(str(d) for d in adapter.dtypes),
        policy=table(adapter.policy),
        op_policy={str(op): table(chosen) for op, chosen in op_policy(adapter).items()},
        versions=table(plain("versions", dict)), paths=table(plain("paths", dict)),
        policy_when=tuple({"when": dict(rule["when"]), "policy": table(rule["policy"])}
                          for rule in plain("policy_when", list)),
        dtype_notes=table(plain("dtype_notes", dict)),
        invariants=tuple(sorted(str(name) for name in plain("invariants", tuple))),
        distributed=str(plain("distributed", str)),
        module=type(adapter).__module__,
        expected_failures_file=str(own_file) if isinstance(own_file, str) or
        hasattr(own_file, "__fspath__") else "",
        ops=tuple(op for op in OPS if callable(getattr(adapter, op, None))))


def op_policy(adapter: Any) -> dict[str, dict[str, str]]:
    """op -> {policy: choice}: the optional per-op declarations that override `policy`
    for that op (docs/interface.md); {} when the adapter declares none."""
    if not really_has(adapter, "op_policy"):
        return {}
    value = getattr(adapter, "op_policy", None)
    return value if isinstance(value, dict) else {}


def policy_for(declaration: Declaration, op: str, shapes: dict | None = None,
               params: dict | None = None) -> dict[str, str]:
    """The backend's choices for one call: `policy`, overridden by `op_policy[op]`, then,
    given the call's input shapes and params, by the first `policy_when` rule that names
    a policy and whose every condition holds."""
    chosen = {**declaration.policy, **declaration.op_policy.get(op, {})}
    if shapes is None:
        return chosen
    settled = set()
    for rule in declaration.policy_when:
        if all(condition_holds(name, wanted, op, shapes, params or {})
               for name, wanted in rule["when"].items()):
            chosen.update({k: v for k, v in rule["policy"].items() if k not in settled})
            settled.update(rule["policy"])
    return chosen


def _choice_problems(policy: dict, label: str) -> list[str]:
    problems = []
    for key, choice in policy.items():
        if key not in POLICIES:
            problems.append(f"{label} names unknown policy {key!r}; known: {', '.join(POLICIES)}")
        elif choice not in POLICIES[key]:
            problems.append(f"{label} {key}={choice!r} is not one of {', '.join(POLICIES[key])}")
    return problems


def declaration_problems(adapter: Any) -> list[str]:
    """Every way the adapter's name, dtypes and policy break the interface."""
    problems = []
    name = getattr(adapter, "name", None)
    if not isinstance(name, str) or not name.strip():
        problems.append(f"name must be a non-empty str, not {name!r}")
    dtypes = getattr(adapter, "dtypes", None)
    if isinstance(dtypes, (str, bytes)) or not isinstance(dtypes, (set, frozenset, tuple, list)):
        problems.append(f"dtypes must be a set (or tuple) of dtype names, not {dtypes!r}")
    else:
        unknown = [d for d in dtypes if d not in DTYPES]
        if unknown:
            problems.append(f"dtypes names unknown dtype(s) {unknown}; known: {', '.join(DTYPES)}")
    policy = getattr(adapter, "policy", None)
    if not isinstance(policy, dict):
        problems.append(f"policy must be a dict of policy name -> choice, not {policy!r}")
    else:
        problems += _choice_problems(policy, "policy")
    if really_has(adapter, "op_policy"):
        problems += _op_policy_problems(getattr(adapter, "op_policy", None))
    if really_has(adapter, "policy_when"):
        problems += _policy_when_problems(getattr(adapter, "policy_when", None))
    if really_has(adapter, "dtype_notes"):
        problems += _dtype_notes_problems(getattr(adapter, "dtype_notes", None), dtypes)
    if really_has(adapter, "invariants"):
        problems += invariants_problems(getattr(adapter, "invariants", None))
    if really_has(adapter, "distributed") and getattr(adapter, "distributed", None) not in FORMS:
        problems.append(f"distributed must be one of {', '.join(FORMS)}, not "
                        f"{getattr(adapter, 'distributed', None)!r}")
    return problems


def _policy_when_problems(rules) -> list[str]:
    if not isinstance(rules, (list, tuple)):
        return [f"policy_when must be a list of {{'when': ..., 'policy': ...}}, not {rules!r}"]
    problems = []
    for i, rule in enumerate(rules):
        label = f"policy_when[{i}]"
        if not isinstance(rule, dict) or set(rule) != {"when", "policy"} \
                or not isinstance(rule["when"], dict) or not rule["when"] \
                or not isinstance(rule["policy"], dict) or not rule["policy"]:
            problems.append(f"{label} must be {{'when': {{condition: value}}, "
                            f"'policy': {{policy: choice}}}}, both non-empty, not {rule!r}")
            continue
        problems += [f"{label}: {p}" for p in
                     (condition_problem(k, v) for k, v in rule["when"].items()) if p]
        problems += _choice_problems(rule["policy"], label)
    return problems


def _dtype_notes_problems(notes, dtypes) -> list[str]:
    if not isinstance(notes, dict) or not all(isinstance(k, str) and isinstance(v, str) and v
                                              for k, v in notes.items()):
        return [f"dtype_notes must be a dict of dtype name -> why it is left out, not {notes!r}"]
    problems = [f"dtype_notes names unknown dtype {d!r}" for d in notes if d not in DTYPES]
    declared = set(dtypes) if isinstance(dtypes, (set, frozenset, tuple, list)) else set()
    problems += [f"dtype_notes explains {d!r}, which dtypes declares" for d in notes
                 if d in declared]
    return problems


def _op_policy_problems(per_op) -> list[str]:
    if not isinstance(per_op, dict):
        return [f"op_policy must be a dict of op name -> {{policy: choice}}, not {per_op!r}"]
    problems = []
    for op, chosen in per_op.items():
        if op not in OPS:
            problems.append(f"op_policy names unknown op {op!r}; known: {', '.join(OPS)}")
        elif not isinstance(chosen, dict):
            problems.append(f"op_policy[{op!r}] must be a dict of policy name -> choice, "
                            f"not {chosen!r}")
        else:
            problems += _choice_problems(chosen, f"op_policy[{op!r}]")
    return problems


def describe(declaration: Declaration) -> dict[str, Any]:
    """The declared facts of a backend, for reports."""
    return {"name": declaration.name, "dtypes": sorted(declaration.dtypes),
            "policy": dict(declaration.policy), "versions": dict(declaration.versions),
            "paths": dict(declaration.paths),
            **({"op_policy": {op: dict(c) for op, c in declaration.op_policy.items()}}
               if declaration.op_policy else {}),
            **({"policy_when": [dict(rule) for rule in declaration.policy_when]}
               if declaration.policy_when else {}),
            **({"dtype_notes": dict(declaration.dtype_notes)} if declaration.dtype_notes else {}),
            **({"invariants": list(declaration.invariants)} if declaration.invariants else {}),
            **({"distributed": declaration.distributed} if declaration.distributed else {})}
