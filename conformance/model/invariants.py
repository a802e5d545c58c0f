"""Bitwise invariants a backend may declare (its `invariants` attribute), and which the
suite then checks exactly, bit for bit, on the cases that name them; a backend that does
not declare one is never failed for it (those tests are unsupported, with that reason).
docs/interface.md, "Declared invariants"."""

from __future__ import annotations

#: name -> what a backend that declares it guarantees
INVARIANTS = {
    "deterministic": "the same call twice gives the same bits, forward and backward",
    "batch_invariant": "a batch element's outputs do not change with the batch it runs in: "
                       "alone, or at another position of the batch, the same bits",
    "split_invariant": "a query row's outputs do not change with the other rows of the call: "
                       "the queries cut in two calls give the same bits as one call",
}


def invariants_problems(value) -> list[str]:
    """Every way `invariants` is not a list or set of the names of INVARIANTS."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, set, frozenset)):
        return [f"invariants must be a set of names ({', '.join(INVARIANTS)}), not {value!r}"]
    return [f"invariants names unknown invariant {name!r}; known: {', '.join(INVARIANTS)}"
            for name in value if name not in INVARIANTS]
