"""What a check sees of one run: the case, the inputs as given, the outputs, the golden
store and the tolerance rule of the spec folder, the backend's declaration, and a way to
call the backend again."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..backend.interface import policy_for
from ..golden.compute import longest_reduction
from ..model.dtypes import input_dtype, numpy_dtype
from ..model.tolerances import Tolerances


@dataclass
class Context:
    caller: object          # the backend for this test: .declaration, and .call(op, arrays, params)
    case: object
    variant: object
    dtype: str
    arrays: dict            # inputs as given to the backend (dtype-cast)
    exact_inputs: dict      # the same inputs in float64
    outputs: dict           # output name -> backend result as float64
    golden: object          # a GoldenStore
    tolerances: Tolerances
    _policy: dict | None = field(default=None, repr=False, compare=False)
    _reduction: int | None = field(default=None, repr=False, compare=False)

    @property
    def params(self):
        return self.case.params

    @property
    def declaration(self):
        return self.caller.declaration

    def declared_policy(self) -> dict[str, str]:
        """The backend's choices for this call: policy, op_policy, then policy_when's
        first matching rule per policy (its conditions read the call's inputs and params),
        worked out once per test: the checks ask ~3 times."""
        if self._policy is None:
            declaration = self.declaration
            shapes = {name: np.shape(array) for name, array in self.arrays.items()} \
                if declaration.policy_when else None        # no rule reads them
            self._policy = policy_for(declaration, self.case.op, shapes, self.params)
        return self._policy

    def longest_reduction(self) -> int:
        """golden/compute.py's longest_reduction of the inputs, worked out once per test:
        every property tolerance reads it."""
        if self._reduction is None:
            self._reduction = longest_reduction(self.exact_inputs)
        return self._reduction

    def call(self, arrays=None, op=None, **params):
        """Call the backend again (metamorphic properties), returning float64 outputs."""
        raw = self.caller.call(*self.request(arrays, op, params))
        return [np.array(r, dtype=np.float64, subok=False) for r in raw]

    def request(self, arrays, op, params) -> tuple:
        """(op, arrays, params) of a call(): the case's op, inputs and params by default
        (its params only for its own op)."""
        op = op or self.case.op
        return op, arrays or self.arrays, dict(self.case.params if op == self.case.op else {},
                                               **params)

    def cast(self, array, name=None):
        """A float64 array as the backend receives it (input `name`'s dtype: the case's
        own for it, else model/dtypes.py's input_dtype; without a name the case's; bool
        unchanged)."""
        array = np.asarray(array)
        dtype = self.case.input_dtypes(self.dtype).get(name) or (
            input_dtype(self.dtype, name) if name else self.dtype)
        return array if array.dtype == bool else array.astype(numpy_dtype(dtype))
