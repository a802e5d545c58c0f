"""The attention interface every backend implements (see DESIGN.md).

The interface is structural: a third-party adapter never has to import this module.
It only needs the attributes and methods of :class:`AttentionBackend`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

DTYPES = ("float64", "float32", "float16", "bfloat16")

#: Behaviours the specification leaves to the implementation: name -> allowed choices.
POLICIES: dict[str, tuple[str, ...]] = {
    # a query whose every key is disallowed by mask, causal or window
    "fully_masked_rows": ("zeros", "uniform", "nan"),
    # a query whose every key carries a -inf bias (no boolean mask involved)
    "neg_inf_bias_rows": ("zeros", "uniform", "nan"),
    # a NaN stored in a key at a position the mask disallows
    "masked_key_nan": ("ignored", "propagates"),
    # a NaN stored in a value at a position the mask disallows
    "masked_value_nan": ("ignored", "propagates"),
}

POLICY_MEANING: dict[str, str] = {
    "fully_masked_rows": "query whose every key is masked (boolean mask, causal or window)",
    "neg_inf_bias_rows": "query whose every key has a -inf additive bias",
    "masked_key_nan": "NaN stored in a masked-out key",
    "masked_value_nan": "NaN stored in a masked-out value",
}

#: Positional arguments of each operation, in order; everything else is a keyword.
OPERATIONS: dict[str, tuple[str, ...]] = {
    "softmax": ("x",),
    "scores": ("q", "k"),
    "attention_weights": ("q", "k"),
    "sdpa": ("q", "k", "v"),
    "self_attention": ("x", "w_q", "w_k", "w_v"),
    "multi_head_attention": ("query", "key", "value"),
    "sdpa_vjp": ("q", "k", "v", "d_out"),
}

#: Names of each operation's outputs (a tuple return is matched to these in order).
OUTPUTS: dict[str, tuple[str, ...]] = {op: ("out",) for op in OPERATIONS}
OUTPUTS["sdpa_vjp"] = ("dq", "dk", "dv")


class Unsupported(NotImplementedError):
    """Raised by a backend that lacks an op, a parameter or a dtype.

    Any ``NotImplementedError`` is treated the same way; this subclass only exists so
    that adapters importing the suite can say so explicitly.
    """


@runtime_checkable
class AttentionBackend(Protocol):
    """What the runner needs from a backend.

    Arrays cross the interface as NumPy arrays (bfloat16 as ``ml_dtypes.bfloat16``);
    an adapter returns arrays of the dtype it was given.
    """

    name: str
    dtypes: frozenset[str] | set[str] | tuple[str, ...]
    policy: dict[str, str]

    def softmax(self, x: np.ndarray, axis: int = -1) -> np.ndarray: ...

    def scores(self, q, k, *, kind: str, scale=None, w=None, u=None, v=None) -> np.ndarray: ...

    def attention_weights(self, q, k, *, mask=None, bias=None, causal=None, scale=None,
                          softcap=None, window=None) -> np.ndarray: ...

    def sdpa(self, q, k, v, *, mask=None, bias=None, causal=None, scale=None,
             softcap=None, window=None) -> np.ndarray: ...

    def self_attention(self, x, w_q, w_k, w_v, *, mask=None, causal=None) -> np.ndarray: ...

    def multi_head_attention(self, query, key, value, *, w_q, w_k, w_v, w_o, num_heads,
                             num_kv_heads=None, mask=None, causal=None) -> np.ndarray: ...

    def sdpa_vjp(self, q, k, v, d_out, *, mask=None, bias=None, causal=None, scale=None,
                 softcap=None, window=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


def describe(backend: Any) -> dict[str, Any]:
    """The declared facts of a backend, for reports."""
    return {
        "name": getattr(backend, "name", type(backend).__name__),
        "dtypes": sorted(getattr(backend, "dtypes", ())),
        "policy": dict(getattr(backend, "policy", {})),
        "versions": dict(getattr(backend, "versions", {})),
        "paths": dict(getattr(backend, "paths", {})),
    }
