"""Known bug: the softmax does not subtract the row maximum, so large scores overflow."""

import numpy as np

from _plant import Planted


def _softmax(s, axis=-1):
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(s)
        return e / np.sum(e, axis=axis, keepdims=True)


class NoMaxSubtraction(Planted):
    """No max-subtraction: exp(s) overflows (inf/inf = NaN) once scores pass 88 in float32."""

    helpers = {"_softmax": _softmax}
