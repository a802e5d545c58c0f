"""Known bug: the scaled_dot score function forgets its scale (plain q k^T)."""

from _plant import Planted, original


def _score_kind(q, k, kind, scale, w, u, v):
    kind = "dot" if kind == "scaled_dot" else kind
    return original["_score_kind"](q, k, kind, scale, w, u, v)


class ScaledDotUnscaled(Planted):
    """scaled_dot unscaled: returns q k^T without the 1/sqrt(D)."""

    helpers = {"_score_kind": _score_kind}
