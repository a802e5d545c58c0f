"""Known bug: the additive score applies W to the queries and U to the keys."""

from _plant import Planted, original


def _score_kind(q, k, kind, scale, w, u, v):
    if kind == "additive":
        w, u = u, w
    return original["_score_kind"](q, k, kind, scale, w, u, v)


class AdditiveWUSwapped(Planted):
    """Additive score with W and U swapped: v^T tanh(k U + q W) instead of v^T tanh(k W + q U)."""

    helpers = {"_score_kind": _score_kind}
