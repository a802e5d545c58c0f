"""Known bug: a float32 bias (a mask given as a bias) beside half-precision q, k, v read
as if its buffer held elements of q's dtype, as cuDNN's attention did in PyTorch
(pytorch PR 191612): the first half of its bytes taken as the whole bias."""

import numpy as np

from _plant import Planted
from attention_conformance.backends.numpy import NumpyBackend


def _reinterpreted(bias, dtype):
    """The bias's bytes read as `dtype` elements, as many as the bias has."""
    if bias is None or np.asarray(bias).dtype == dtype:
        return bias
    bias = np.ascontiguousarray(bias)
    return bias.reshape(-1).view(dtype)[:bias.size].reshape(bias.shape)


class Float32MaskReadAsBfloat16(Planted):
    """fp32 mask read as bf16: the float32 bias's buffer taken as q's dtype."""

    def sdpa(self, q, k, v, *, bias=None, **params):
        return NumpyBackend.sdpa(self, q, k, v, bias=_reinterpreted(bias, np.asarray(q).dtype),
                                 **params)
