"""What a backend declares: name, dtypes, policy (and optionally op_policy, versions, paths).

The interface is structural: an adapter never has to import the suite. The ops it
implements are those of ops.py; docs/interface.md is the contract in words. A
declaration that is not what the interface says is one clear error when the backend
is loaded.
"""

from __future__ import annotations

from typing import Any

from ..model.dtypes import DTYPES
from ..model.ops import OPS
from ..model.policies import POLICIES


def _really_has(backend: Any, name: str) -> bool:
    """The attribute is the instance's or a class's, not one a catch-all __getattr__ makes up."""
    if name in getattr(backend, "__dict__", {}):
        return True
    return any(name in vars(cls) for cls in type(backend).__mro__)


def op_policy(backend: Any) -> dict[str, dict[str, str]]:
    """op -> {policy: choice}: the optional per-op declarations that override `policy`
    for that op (docs/interface.md); {} when the backend declares none."""
    if not _really_has(backend, "op_policy"):
        return {}
    value = getattr(backend, "op_policy", None)
    return value if isinstance(value, dict) else {}


def policy_for(backend: Any, op: str) -> dict[str, str]:
    """The backend's choices for one op: `policy`, overridden by `op_policy[op]`."""
    merged = dict(getattr(backend, "policy", {}) or {})
    merged.update(op_policy(backend).get(op, {}))
    return merged


def _choice_problems(policy: dict, label: str) -> list[str]:
    problems = []
    for key, choice in policy.items():
        if key not in POLICIES:
            problems.append(f"{label} names unknown policy {key!r}; known: {', '.join(POLICIES)}")
        elif choice not in POLICIES[key]:
            problems.append(f"{label} {key}={choice!r} is not one of {', '.join(POLICIES[key])}")
    return problems


def declaration_problems(backend: Any) -> list[str]:
    """Every way the backend's name, dtypes and policy break the interface."""
    problems = []
    name = getattr(backend, "name", None)
    if not isinstance(name, str) or not name.strip():
        problems.append(f"name must be a non-empty str, not {name!r}")
    dtypes = getattr(backend, "dtypes", None)
    if isinstance(dtypes, (str, bytes)) or not isinstance(dtypes, (set, frozenset, tuple, list)):
        problems.append(f"dtypes must be a set (or tuple) of dtype names, not {dtypes!r}")
    else:
        unknown = [d for d in dtypes if d not in DTYPES]
        if unknown:
            problems.append(f"dtypes names unknown dtype(s) {unknown}; known: {', '.join(DTYPES)}")
    policy = getattr(backend, "policy", None)
    if not isinstance(policy, dict):
        problems.append(f"policy must be a dict of policy name -> choice, not {policy!r}")
    else:
        problems += _choice_problems(policy, "policy")
    if _really_has(backend, "op_policy"):
        per_op = getattr(backend, "op_policy", None)
        if not isinstance(per_op, dict):
            problems.append(f"op_policy must be a dict of op name -> {{policy: choice}}, "
                            f"not {per_op!r}")
        else:
            for op, chosen in per_op.items():
                if op not in OPS:
                    problems.append(f"op_policy names unknown op {op!r}; known: {', '.join(OPS)}")
                elif not isinstance(chosen, dict):
                    problems.append(f"op_policy[{op!r}] must be a dict of policy name -> "
                                    f"choice, not {chosen!r}")
                else:
                    problems += _choice_problems(chosen, f"op_policy[{op!r}]")
    return problems


def describe(backend: Any) -> dict[str, Any]:
    """The declared facts of a backend, for reports."""
    return {
        "name": getattr(backend, "name", type(backend).__name__),
        "dtypes": sorted(getattr(backend, "dtypes", ())),
        "policy": dict(getattr(backend, "policy", {})),
        "versions": dict(getattr(backend, "versions", {})),
        "paths": dict(getattr(backend, "paths", {})),
        **({"op_policy": {op: dict(c) for op, c in op_policy(backend).items()}}
           if op_policy(backend) else {}),
    }
