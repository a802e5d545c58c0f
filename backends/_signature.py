"""The signature a wrapping decorator of backends/rules.py shows (lengths_as_mask,
structure_as_mask, sized, descaled): the wrapped method's own, plus the keywords the
wrapper takes itself. The suite reads it to tell which params a method takes
(conformance/backend/calling.py's ``unaccepted``: a case whose param it does not take is
unsupported, not called); a wrapper's bare ``**params`` would claim every one, and a
method without ``sink`` would be called with it and fail. NumPy-free, like rules."""

from __future__ import annotations

import inspect


def signed(wrapper, method, *taken: str):
    """wrapper, its ``__signature__`` set to method's (read as it is, not unwrapped: a
    wrapped method's own ``__signature__`` counts) with the keyword-only ``taken`` it
    lacks added before any ``**kwargs``; left as it is where method has none to read."""
    try:
        signature = inspect.signature(method, follow_wrapped=False)
    except (TypeError, ValueError):
        return wrapper
    parameters = list(signature.parameters.values())
    names = {p.name for p in parameters}
    rest = [p for p in parameters if p.kind is p.VAR_KEYWORD]
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None)
             for name in dict.fromkeys(taken) if name not in names]
    wrapper.__signature__ = signature.replace(
        parameters=[p for p in parameters if p.kind is not p.VAR_KEYWORD] + added + rest)
    return wrapper
