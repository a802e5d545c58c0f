"""fp8 inputs and outputs for adapters whose framework has no fp8 attention
(docs/interface.md, "fp8 inputs and descale factors", "The output scale"): q, k, v stored
in an fp8 format become float32 times their descale factors, and an output written with
an ``o_scale`` becomes out / o_scale in the inputs' fp8 format. Public through
backends/rules.py (``rules.dequantize``, ``rules.descaled``, ``rules.scaled_output``);
NumPy only, like it.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

from ._signature import signed

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


def scaled_output(out, o_scale, fmt: str):
    """The output written with an output scale: ``out / o_scale`` in fp8 format ``fmt``
    (an ml_dtypes name), saturated at its largest finite value (e4m3fn has no infinity: an
    unclamped cast writes NaN) and rounded once; its value times o_scale is the attention
    (FlashInfer's o_scale: real = quantized * o_scale)."""
    dtype = np.dtype(getattr(ml_dtypes, fmt))
    top = float(ml_dtypes.finfo(dtype).max)
    return np.clip(np.asarray(out, np.float64) / float(o_scale), -top, top).astype(dtype)


def _format(*arrays) -> str | None:
    """The fp8 format of the first of the arrays stored in one (k's, v's, then q's)."""
    for x in arrays:
        if _is_fp8(dtype := np.asarray(x).dtype):
            return dtype.name
    return None


def descaled(*convert, quantize=scaled_output):
    """Decorator of sdpa: with an fp8 q, k, v or a descale, the three become float32 times
    their descales (dequantize, to_float32 ``convert``) first; with an ``o_scale`` the
    output is written in their fp8 format (``quantize(out, o_scale, fmt)``: scaled_output,
    or a framework's own); other calls pass through."""
    def wrap(method):
        @functools.wraps(method)
        def wrapper(self, q, k, v, *arrays, q_descale=None, k_descale=None, v_descale=None,
                    o_scale=None, **params):
            scales, fmt = (q_descale, k_descale, v_descale), _format(k, v, q)
            if fmt or q_descale is not None or k_descale is not None or v_descale is not None:
                q, k, v = (dequantize(x, d, *convert) for x, d in zip((q, k, v), scales))
            out = method(self, q, k, v, *arrays, **params)
            if o_scale is None:
                return out
            if fmt is None:
                raise NotImplementedError("o_scale writes the output in the inputs' fp8 "
                                          "format, and no input is fp8")
            return quantize(out, o_scale, fmt)
        return signed(wrapper, method, "q_descale", "k_descale", "v_descale", "o_scale")
    return wrap
