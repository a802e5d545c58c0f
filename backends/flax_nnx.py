"""Flax NNX backend: certifies ``flax.nnx.dot_product_attention`` against the specification.

The adapter is thin: NumPy in, Flax's own functional op, NumPy out, jitted as an NNX user
runs it (``nnx.jit``/``jax.jit``: one program per shape and dtype). The op has two paths,
and each op here takes one:

- ``sdpa``: the default path. Without dropout and without ``module``,
  ``nnx.dot_product_attention`` calls ``jax.nn.dot_product_attention(q, k, v, bias, mask,
  is_causal=...)`` (XLA on the CPU). Layout: the interface's ``(*batch, heads, L, D)`` is
  folded into its ``(B, T, N, H)`` (``_jax_cores._native_layout``); grouped-query heads go
  as they are. Top-left causal (and bottom-right where Lq == Lk) is its ``is_causal``;
  bottom-right causal otherwise, windows and per-batch lengths are a boolean ``mask``
  (``rules``); a bias is its ``bias``. It has no ``scale``: q is pre-scaled by
  ``scale * sqrt(D)`` (computed in float32 or wider, rounded once to q's dtype;
  docs/adding-a-backend.md). The default path refuses Dv != Dk (Flax's own path takes it):
  the narrower of q/k and v is zero-padded to one width (exact; the pre-scale then uses
  the padded D). No softcap, sink or lse: unsupported.
- ``sdpa_vjp``: ``jax.vjp`` of exactly that call (broadcast batch dims and grouped heads
  summed by JAX's own transpose of ``broadcast_to`` and of the head grouping).
- ``multi_head_attention``: ``nnx.MultiHeadAttention`` (``use_bias=False``,
  ``num_kv_heads``), built in the jitted program with the case's projections as its
  kernels; it calls the default path. It takes one input width for key and value
  (``in_kv_features``) and one head width for q, k and v: other cases are unsupported.
- ``attention_weights``: Flax's own path, the one ``nnx.dot_product_attention`` takes
  when given a ``module``: it sows the weights (``dot_product_attention_weights``: logits
  in the input dtype, masked with ``finfo(dtype).min``, ``jax.nn.softmax``) as an
  ``nnx.Intermediate``, read back with ``nnx.capture``: they are what is returned.

float64: JAX without ``jax_enable_x64`` (Flax does not set it) converts float64 inputs to
float32, and with it the default path still computes its softmax in float32, so float64 is
left out (``dtype_notes``). float16: jitted, the default path cannot be lowered on the CPU
(``F16_F16_F32``, as for the jax backend): an expected failure of sdpa, sdpa_vjp and
multi_head_attention, while the own path (attention_weights) runs. Findings are reproduced directly against float64
NumPy in tests/backends/test_flax_findings.py.
"""

from __future__ import annotations

import math
from functools import partial

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from . import _jax_cores as cores
from . import rules

_STATIC = ("is_causal", "prescale", "width")


def _prescaled(q, prescale):
    """q times prescale, computed in float32 (or wider) and rounded once to q's dtype; q
    itself when there is nothing to scale."""
    if prescale is None:
        return q
    ct = cores._compute_dtype(q.dtype)
    return (q.astype(ct) * jnp.asarray(prescale, ct)).astype(q.dtype)


def _default_path(q, k, v, mask, bias, *, is_causal, prescale, width):
    """nnx.dot_product_attention's default path on the interface's arrays: (*batch, N, Lq,
    Dv)."""
    lay, (q, k, v, mask, bias) = cores._native_layout(q, k, v, mask, bias)
    dv = v.shape[-1]
    q, k, v = (cores._pad_last(x, width) for x in (q, k, v))
    out = nnx.dot_product_attention(_prescaled(q, prescale), k, v, bias=bias, mask=mask,
                                    is_causal=is_causal)
    return lay.restore(out[..., :dv].transpose(0, 2, 1, 3))


_sdpa = jax.jit(_default_path, static_argnames=_STATIC)


@partial(jax.jit, static_argnames=_STATIC)
def _sdpa_vjp(q, k, v, d_out, mask, bias, *, is_causal, prescale, width):
    out, pullback = jax.vjp(lambda q, k, v: _default_path(
        q, k, v, mask, bias, is_causal=is_causal, prescale=prescale, width=width), q, k, v)
    return pullback(d_out.astype(out.dtype))


class _Sown(nnx.Module):
    """The module Flax's own path sows its attention weights into."""


@partial(jax.jit, static_argnames=("is_causal", "prescale"))
def _weights(q, k, mask, bias, *, is_causal, prescale):
    """The weights nnx.dot_product_attention(module=...) sows: (*batch, N, Lq, Lk)."""
    lay, (q, k, _, mask, bias) = cores._native_layout(q, k, k[..., :1], mask, bias)
    call = nnx.capture(lambda module, q, k: nnx.dot_product_attention(
        q, k, k[..., :1], bias=bias, mask=mask, is_causal=is_causal, module=module),
        nnx.Intermediate)
    _, sown = call(_Sown(), _prescaled(q, prescale), k)
    (weights,) = sown["attention_weights"].get_value()
    return lay.restore(weights)


@partial(jax.jit, static_argnames=("num_heads", "num_kv_heads", "is_causal"))
def _mha(query, key, value, w_q, w_k, w_v, w_o, mask, *, num_heads, num_kv_heads, is_causal):
    """nnx.MultiHeadAttention (no biases) with the given projections as its kernels, on
    (B, L, E) inputs and a (B, 1 or H, Lq, Lk) mask."""
    dtype, head = query.dtype, w_q.shape[1] // num_heads
    layer = nnx.MultiHeadAttention(
        num_heads, query.shape[-1], w_q.shape[1], w_o.shape[1], num_kv_heads=num_kv_heads,
        in_kv_features=key.shape[-1], use_bias=False, dtype=dtype, param_dtype=dtype,
        decode=False, deterministic=True, rngs=nnx.Rngs(0))
    layer.query.kernel[...] = w_q.reshape(w_q.shape[0], num_heads, head)
    layer.key.kernel[...] = w_k.reshape(w_k.shape[0], num_kv_heads, head)
    layer.value.kernel[...] = w_v.reshape(w_v.shape[0], num_kv_heads, head)
    layer.out.kernel[...] = w_o.reshape(num_heads, head, w_o.shape[1])
    return layer(query, key, value, mask=mask, is_causal=is_causal)


class FlaxNnxBackend:
    """The attention interface on Flax NNX (see the module docstring for each op's path)."""

    name = "flax-nnx"
    dtypes = frozenset({"float32", "float16", "bfloat16"})
    dtype_notes = {"float64": "JAX runs without 64-bit types unless jax_enable_x64 is set "
                              "(Flax does not set it); with it, the default path "
                              "(jax.nn.dot_product_attention) still computes its softmax "
                              "in float32"}
    # the default path is jax.nn.dot_product_attention(implementation=None: XLA on the
    # CPU), whose choices are the jax backend's: masked logits get a finite fill
    # (-0.7 * float32 max), so a row without keys is uniform and a NaN key it hides is
    # overwritten; an all -inf bias row is NaN; a masked NaN value meets a weight of 0
    policy = {
        "fully_masked_rows": "uniform",
        "neg_inf_bias_rows": "nan",
        "masked_key_nan": "ignored",
        "masked_value_nan": "propagates",
        "accumulation": "float32",
        "padded_query_rows": "zeros",
    }
    # XLA on the CPU: checked bit for bit by the invariance cases (docs/interface.md)
    invariants = ("deterministic",)
    paths = {
        "sdpa": "native: flax.nnx.dot_product_attention, its default path "
                "(jax.nn.dot_product_attention), jitted; is_causal for top-left causal, "
                "boolean masks for bottom-right causal, windows and lengths; q pre-scaled "
                "(no scale argument); Dv != Dk zero-padded to one width",
        "sdpa_vjp": "native: jax.vjp of the sdpa path, jitted",
        "attention_weights": "native: flax.nnx.dot_product_attention(module=...), Flax's "
                             "own path, its sown weights read with nnx.capture",
        "multi_head_attention": "native: flax.nnx.MultiHeadAttention (use_bias=False, "
                                "num_kv_heads), its kernels the given projections, jitted",
    }

    def __init__(self):
        import jaxlib

        self.versions = {"flax": flax.__version__, "jax": jax.__version__,
                         "jaxlib": jaxlib.__version__, "device": "cpu"}

    # ------------------------------------------------------------ the call

    def _check(self, q, softcap=None, sink=None):
        name = np.dtype(np.asarray(q).dtype).name
        if name not in self.dtypes:
            raise NotImplementedError(f"{self.name} does not support dtype {name}")
        if softcap is not None:
            raise NotImplementedError(f"{self.name}: nnx.dot_product_attention has no "
                                      "softcap")
        if sink is not None:
            raise NotImplementedError(f"{self.name}: nnx.dot_product_attention has no "
                                      "attention sink")

    @staticmethod
    def _masking(q, k, mask, causal, window):
        """(is_causal, mask): Flax's is_causal aligns top-left; any other causal or a
        window goes into the boolean mask."""
        rules.check_causal(causal)
        lq, lk = np.shape(q)[-2], np.shape(k)[-2]
        if window is None and causal is not None and rules.causal_offset(lq, lk, causal) == 0:
            return True, None if mask is None else np.asarray(mask, dtype=bool)
        mask = rules.and_masks(None if mask is None else np.asarray(mask, dtype=bool),
                               rules.allowed(lq, lk, causal, window))
        return False, mask

    @staticmethod
    def _static(q, v, scale, width=None):
        """The static arguments: the pre-scale that turns the native 1/sqrt(width) into
        `scale` (None where they agree), and the width q, k and v are padded to."""
        dk = np.shape(q)[-1]
        width = max(dk, np.shape(v)[-1]) if width is None else width
        scale = 1.0 / math.sqrt(dk) if scale is None else float(scale)
        prescale = scale * math.sqrt(width)
        return {"prescale": None if prescale == 1.0 else prescale, "width": width}

    # ------------------------------------------------------------ the interface

    @rules.sized()
    @rules.lengths_as_mask
    def sdpa(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
             softcap=None, window=None):
        self._check(q, softcap, sink)
        is_causal, mask = self._masking(q, k, mask, causal, window)
        out = _sdpa(q, k, v, mask, bias, is_causal=is_causal, **self._static(q, v, scale))
        return np.array(out, copy=True)

    @rules.sized()
    @rules.lengths_as_mask
    def sdpa_vjp(self, q, k, v, d_out, *, mask=None, bias=None, sink=None, causal=None,
                 scale=None, softcap=None, window=None):
        self._check(q, softcap, sink)
        is_causal, mask = self._masking(q, k, mask, causal, window)
        grads = _sdpa_vjp(q, k, v, d_out, mask, bias, is_causal=is_causal,
                          **self._static(q, v, scale))
        return tuple(np.array(g, copy=True) for g in grads)

    @rules.sized()
    @rules.lengths_as_mask
    def attention_weights(self, q, k, *, mask=None, bias=None, sink=None, causal=None,
                          scale=None, softcap=None, window=None):
        self._check(q, softcap, sink)
        is_causal, mask = self._masking(q, k, mask, causal, window)
        prescale = self._static(q, q, scale)["prescale"]
        return np.array(_weights(q, k, mask, bias, is_causal=is_causal, prescale=prescale),
                        copy=True)

    def multi_head_attention(self, query, key, value, *, w_q, w_k, w_v, w_o, num_heads,
                             num_kv_heads=None, mask=None, causal=None):
        self._check(query)
        num_heads = int(num_heads)
        num_kv_heads = num_heads if num_kv_heads is None else int(num_kv_heads)
        if w_q.shape[1] != num_heads * (w_k.shape[1] // num_kv_heads) or \
                w_v.shape[1] != w_k.shape[1] or w_o.shape[0] != w_q.shape[1]:
            raise NotImplementedError(f"{self.name}: nnx.MultiHeadAttention gives q, k and v "
                                      "one head width")
        if np.shape(key)[-1] != np.shape(value)[-1]:
            raise NotImplementedError(f"{self.name}: nnx.MultiHeadAttention takes one input "
                                      "width for key and value (in_kv_features)")
        batch = np.broadcast_shapes(*(np.shape(x)[:-2] for x in (query, key, value)),
                                    () if mask is None else np.shape(mask)[:-3])
        flat = [np.broadcast_to(x, batch + np.shape(x)[-2:]).reshape((-1,) + np.shape(x)[-2:])
                for x in (query, key, value)]
        is_causal, mask = self._masking(flat[0], flat[1], mask, causal, None)
        if mask is not None:
            mask = np.reshape(mask, (1,) * (len(batch) + 3 - np.ndim(mask)) + np.shape(mask))
            mask = np.broadcast_to(mask, batch + np.shape(mask)[-3:])
            mask = mask.reshape((-1,) + np.shape(mask)[-3:])
        out = _mha(*flat, w_q, w_k, w_v, w_o, mask, num_heads=num_heads,
                   num_kv_heads=num_kv_heads, is_causal=is_causal)
        return np.array(out, copy=True).reshape(batch + np.shape(out)[-2:])
