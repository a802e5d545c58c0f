"""Input layouts: a case's `layout` hands the backend strided views in place of packed
arrays (transposed axes, a padded row stride, a step, an unaligned start), with the same
values, so the same golden judges them.

The arrays cross the process boundary packed (process/wire.py); the views are made on
the backend's side, in its process, just before the adapter is called
(backend/distributed.dispatch), from the layout the call carries under LAYOUT_KEY in
its params, which the adapter never receives. What no element of the view covers (the
padding, the skipped elements, the elements before the start) holds FILL, so an adapter
that reads memory the strides do not point at reads NaN (a boolean mask: True).

One input's form (docs/writing-cases.md, "Input layouts"), every key optional:

    order:  [axes]   the axes as they lie in memory, outermost first (the view is the
                     stored array transposed back: [0, 2, 1, 3] stores (B, H, L, D) as
                     (B, L, H, D), FlashAttention's layout)
    pad:    n        n more elements after each row of the innermost stored axis
    step:   s        every s-th element of that axis (its stride s elements)
    offset: n        the view starts n elements into its buffer (not 16-byte aligned)
"""

from __future__ import annotations

import numpy as np

#: the key of a call's params that carries the case's layout to the backend's side
LAYOUT_KEY = "@layout"
#: the keys of one input's form
FORMS = ("order", "pad", "step", "offset")
#: what the elements of a buffer outside the view hold
FILL = {"bool": True, "float": np.nan}


def call_params(case) -> dict:
    """The params of a test's first call: the case's, and its layout if it has one."""
    return {**case.params, LAYOUT_KEY: case.layout} if case.layout else case.params


def split(params: dict) -> tuple[dict, dict]:
    """(the layout a call carries, the params without it)."""
    if LAYOUT_KEY not in params:
        return {}, params
    rest = dict(params)
    return rest.pop(LAYOUT_KEY), rest


def problems(layout: dict, shapes: dict, params: dict) -> list[str]:
    """What is wrong with a case's layout for inputs of these shapes (name -> shape)."""
    found = []
    if layout and "sharding" in params:
        found.append("layout: a sharded case gives no layout (each rank's inputs are cut "
                     "from the packed arrays)")
    for name, form in layout.items():
        if name not in shapes:
            found.append(f"layout {name!r}: the case has no input {name!r}")
            continue
        order = form.get("order")
        rank = len(shapes[name])
        if order is not None and sorted(order) != list(range(rank)):
            found.append(f"layout {name!r}: order {order} is not a permutation of the "
                         f"{rank} axes of the input")
        if rank == 0:
            found.append(f"layout {name!r}: the input has no axis to lay out")
    return found


def strided(array: np.ndarray, form: dict) -> np.ndarray:
    """A view with array's values laid out in memory as `form` says, in a buffer of its
    own (FILL wherever the view does not reach)."""
    order = list(form.get("order") or range(array.ndim))
    pad, step, offset = form.get("pad", 0), form.get("step", 1), form.get("offset", 0)
    stored = [array.shape[axis] for axis in order]
    row = stored[-1] * step + pad
    outer = int(np.prod(stored[:-1], dtype=np.int64))
    buffer = np.empty(offset + outer * row, dtype=array.dtype)
    buffer[...] = FILL["bool" if array.dtype == bool else "float"]
    view = buffer[offset:].reshape(*stored[:-1], row)[..., :stored[-1] * step:step]
    view = view.transpose(np.argsort(order))
    view[...] = array
    return view


def views(arrays: dict, layout: dict) -> dict:
    """The call's arrays, those the layout names made strided views."""
    if not layout:
        return arrays
    return {name: strided(a, layout[name]) if name in layout else a
            for name, a in arrays.items()}
