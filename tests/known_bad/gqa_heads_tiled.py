"""Known bug: grouped-query heads mapped wrongly, query head h reads kv head h % Hkv."""

import numpy as np

from _plant import Planted


def _expand_kv(x, q):
    if q.ndim < 3 or x.ndim < 3:
        return x
    hq, hkv = q.shape[-3], x.shape[-3]
    if hkv in (1, hq) or hq % hkv:
        return x
    reps = [1] * x.ndim
    reps[-3] = hq // hkv
    return np.tile(x, reps)     # should be np.repeat: head h reads kv head h // (hq // hkv)


class GqaHeadsTiled(Planted):
    """Grouped-query heads mapped wrongly: kv heads tiled instead of repeated."""

    helpers = {"_expand_kv": _expand_kv}
