"""Planting one bug in the NumPy backend, for the known-bad adapters beside this file.

A known-bad adapter is a subclass of backends.numpy.NumpyBackend that plants one bug,
either by overriding a method or by naming buggy stand-ins for helpers of
backends/numpy.py in `helpers`: while each of its calls runs, those module-level
helpers are swapped for the stand-ins, so the bug reaches every op that uses the helper,
as a real bug would. The swap is undone after the call (one thread at a time).
"""

from __future__ import annotations

import contextlib
import re

from attention_conformance.backends import numpy as numpy_backend
from attention_conformance.backends.numpy import NumpyBackend
from attention_conformance.model.ops import OPS


class Planted(NumpyBackend):
    """The NumPy backend with one planted bug; its name is bad-<class name in kebab case>."""

    helpers: dict = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.name = "bad-" + re.sub(r"(?<!^)(?=[A-Z])", "-", cls.__name__).lower()
        unknown = [name for name in cls.helpers if not hasattr(numpy_backend, name)]
        if unknown:
            raise TypeError(f"{cls.__name__}: backends.numpy has no helper {unknown}")


@contextlib.contextmanager
def _swapped(helpers: dict):
    saved = {name: getattr(numpy_backend, name) for name in helpers}
    vars(numpy_backend).update(helpers)
    try:
        yield
    finally:
        vars(numpy_backend).update(saved)


def _with_helpers(op):
    def call(self, *args, **kwargs):
        with _swapped(self.helpers):
            return getattr(NumpyBackend, op)(self, *args, **kwargs)
    call.__name__ = op
    return call


for _op in OPS:
    setattr(Planted, _op, _with_helpers(_op))

#: the correct helpers, for stand-ins that wrap them
original = {name: getattr(numpy_backend, name) for name in
            ("_allowed", "_dtypes", "_expand_kv", "_mask", "_probs", "_score_kind", "_sdpa",
             "_softmax")}
