"""What a backend declares: name, dtypes, policy (and optionally versions, paths).

The interface is structural: an adapter never has to import the suite. The ops it
implements are those of ops.py; docs/interface.md is the contract in words. A
declaration that is not what the interface says is one clear error when the backend
is loaded.
"""

from __future__ import annotations

from typing import Any

from .dtypes import DTYPES
from .policies import POLICIES


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
        for key, choice in policy.items():
            if key not in POLICIES:
                problems.append(f"policy names unknown policy {key!r}; known: {', '.join(POLICIES)}")
            elif choice not in POLICIES[key]:
                problems.append(f"policy {key}={choice!r} is not one of {', '.join(POLICIES[key])}")
    return problems


def describe(backend: Any) -> dict[str, Any]:
    """The declared facts of a backend, for reports."""
    return {
        "name": getattr(backend, "name", type(backend).__name__),
        "dtypes": sorted(getattr(backend, "dtypes", ())),
        "policy": dict(getattr(backend, "policy", {})),
        "versions": dict(getattr(backend, "versions", {})),
        "paths": dict(getattr(backend, "paths", {})),
    }
