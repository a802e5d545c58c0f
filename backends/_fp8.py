"""fp8 inputs for adapters whose framework has no fp8 attention (docs/interface.md, "fp8
inputs and descale factors"): q, k, v stored in an fp8 format become float32 times their
descale factors. Public through backends/rules.py (``rules.dequantize``,
``rules.descaled``); NumPy only, like it.
"""

from __future__ import annotations

import functools

import numpy as np

#: the spec's fp8 formats
FP8 = ("float8_e4m3fn", "float8_e5m2")


def dequantize(x, descale=None, to_float32=lambda x: np.asarray(x).astype(np.float32)):
    """fp8 q, k or v as float32 (``to_float32``: a framework's own cast) times its descale:
    ``(1,)`` for the tensor, ``(B, Hkv)`` per batch element and kv head of ``(B, H, L, D)``
    (query head h of a group of G = Hq / Hkv reads column h // G, as FA3's q_descale)."""
    x, d = to_float32(x), np.asarray(1.0 if descale is None else descale, np.float32)
    if d.size == 1:
        return x * d.reshape(())
    return x * np.repeat(d, x.shape[-3] // d.shape[-1], axis=-1)[..., None, None]


@functools.lru_cache(maxsize=64)
def _is_fp8(dtype) -> bool:
    """Is this dtype one of FP8 (dtype.name is slow, and every sdpa call asks)."""
    return dtype.name in FP8


def descaled(*convert):
    """Decorator of sdpa: with an fp8 q, k, v or a descale, the three become float32 times
    their descales (dequantize, to_float32 ``convert``) first; other calls pass through."""
    def wrap(method):
        @functools.wraps(method)
        def wrapper(self, q, k, v, *arrays, q_descale=None, k_descale=None, v_descale=None,
                    **params):
            scales = (q_descale, k_descale, v_descale)
            if any(_is_fp8(np.asarray(x).dtype) for x in (q, k, v)) or any(
                    d is not None for d in scales):
                q, k, v = (dequantize(x, d, *convert) for x, d in zip((q, k, v), scales))
            return method(self, q, k, v, *arrays, **params)
        return wrapper
    return wrap
