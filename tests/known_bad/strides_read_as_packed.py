"""Known bug: an input's strides ignored, its memory read as if the array were packed
(C-contiguous from its first element), as a kernel that takes a data pointer and
assumes contiguous rows does when handed a transposed or padded view (FlashAttention 4's
and FlashInfer's tests pass such views for this reason)."""

import numpy as np

from _plant import Planted
from attention_conformance.model.ops import OPS


def read_as_packed(a):
    """What a kernel that assumes packed rows reads of `a`: its shape, from its first
    element on, with the strides of a C-contiguous array."""
    if not isinstance(a, np.ndarray) or a.flags.c_contiguous:
        return a
    strides = np.empty(a.shape, dtype=a.dtype).strides
    return np.lib.stride_tricks.as_strided(a, a.shape, strides, writeable=False)


class StridesReadAsPacked(Planted):
    """Strides read as packed: a transposed or padded view read as if C-contiguous."""


def _reading_as_packed(op):
    planted = getattr(Planted, op)

    def call(self, *args, **kwargs):
        return planted(self, *map(read_as_packed, args),
                       **{n: read_as_packed(a) for n, a in kwargs.items()})
    call.__name__ = op
    return call


for _op in OPS:
    setattr(StridesReadAsPacked, _op, _reading_as_packed(_op))
