"""Keras 3's attention as backends, one per Keras backend: keras-torch, keras-tensorflow
and keras-jax (jitted per shape, as Keras runs on JAX: see KerasJaxBackend).

Keras picks its backend from ``KERAS_BACKEND`` when it is first imported, once per
process: each of these backends sets it and imports Keras when it is built (the suite
builds a backend in a process of its own), and refuses to be built in a process whose
Keras already runs on another backend.

- ``sdpa``: ``keras.ops.dot_product_attention`` on the ``(B, T, N, H)`` layout it takes
  (4-D only: batch dims flattened into B, heads moved after the tokens, and back).
  Grouped-query heads go as they are (its K < N); top-left causal is its ``is_causal``
  (a mask may come with it), bottom-right causal (where it differs), windows and per-batch
  lengths are a boolean ``mask`` (``rules``); a bias is its ``bias``. It has no softcap
  (``attn_logits_soft_cap`` is for JAX on TPU alone) and no sink: unsupported.
- ``attention_weights``: the same call with ``V = identity(Lk)``.
- ``sdpa_vjp``: the Keras backend's own gradient of that call (``torch.autograd.grad``,
  ``tf.GradientTape``, ``jax.vjp``): Keras 3 has no backend-neutral gradient. The batch
  dims are folded on the NumPy side, so the gradients of broadcast inputs are summed back
  there.
- ``multi_head_attention`` and ``self_attention``: Keras's layers,
  ``keras.layers.MultiHeadAttention`` (``GroupQueryAttention`` for grouped-query heads),
  built with the case's weights as their kernels (``_keras_layers``), called eagerly.

Other ops are no attention function of Keras here: unsupported.

float64: Keras's ``result_type`` maps 64-bit floats to 32-bit on torch, so
``dot_product_attention`` computes float64 inputs in float32 there: keras-torch leaves
float64 out (``dtype_notes``), as keras-jax does (JAX without jax_enable_x64). On
TensorFlow float64 stays float64 (its default scale is computed in float32: an expected
failure).
"""

from __future__ import annotations

import importlib
import os
import sys

import numpy as np

from . import _keras_layers, rules

_NO_SOFTCAP = ("{name}: keras.ops.dot_product_attention has no softcap on the CPU "
               "(attn_logits_soft_cap is for JAX on TPU alone)")
_ALL_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})


def _import_keras(backend: str):
    """keras, imported with KERAS_BACKEND=backend; a process whose Keras already runs on
    another backend cannot switch it."""
    loaded = sys.modules.get("keras")
    if loaded is None:
        os.environ["KERAS_BACKEND"] = backend
    keras = importlib.import_module("keras")
    if keras.backend.backend() != backend:
        raise RuntimeError(f"keras-{backend}: Keras is already imported with the "
                           f"{keras.backend.backend()!r} backend in this process")
    return keras


class _KerasBackend:
    """keras.ops.dot_product_attention on one Keras backend (``keras_backend``)."""

    keras_backend: str
    name: str
    dtypes = _ALL_DTYPES
    paths = {
        "attention_weights": "native: keras.ops.dot_product_attention with V = identity(Lk)",
        "sdpa": "native: keras.ops.dot_product_attention (is_causal for top-left causal; "
                "boolean masks for bottom-right causal, windows and lengths)",
        "sdpa_vjp": "native: the Keras backend's own gradient of "
                    "keras.ops.dot_product_attention",
        **_keras_layers.PATHS,
    }

    def __init__(self):
        self.keras = _import_keras(self.keras_backend)
        self.ops = self.keras.ops
        self.framework = importlib.import_module(self.keras_backend)
        self.versions = {"keras": self.keras.__version__, "device": "cpu",
                         self.keras_backend: self.framework.__version__}
        self.policy = dict(self.policy)
        self.paths = dict(self.paths)

    # ------------------------------------------------------------ the call

    def _check(self, a, softcap, sink):
        name = np.dtype(np.asarray(a).dtype).name
        if name not in self.dtypes:
            raise NotImplementedError(f"{self.name} does not support dtype {name}")
        if softcap is not None:
            raise NotImplementedError(_NO_SOFTCAP.format(name=self.name))
        if sink is not None:
            raise NotImplementedError(f"{self.name}: keras.ops.dot_product_attention has "
                                      "no attention sink")

    def _tensor(self, a):
        return None if a is None else self.ops.convert_to_tensor(np.array(a, copy=True))

    def _inputs(self, q, k, v, mask, bias, causal, window, scale):
        """(layout, q, k, v as Keras's (B, T, N, H) tensors, the call's keywords): the
        folding is done on the NumPy arrays, so every Keras backend gets plain 4-D
        tensors."""
        layout = rules.Layout(q, k, v, mask, bias)
        q, k, v = (self._tensor(np.swapaxes(x, 1, 2))
                   for x in layout.fold(q, k, v, np.broadcast_to))
        mask = layout.scores(mask, np.broadcast_to)
        lq, lk = layout.lq, layout.lk
        is_causal = window is None and (causal == "top_left" or (causal is not None
                                                                 and lq == lk))
        if not is_causal:
            mask = rules.and_masks(mask, rules.allowed(lq, lk, causal, window))
        return layout, (q, k, v), {"mask": self._tensor(mask), "is_causal": is_causal,
                                   "bias": self._tensor(layout.scores(bias, np.broadcast_to)),
                                   "scale": None if scale is None else float(scale)}

    def _attend(self, q, k, v, **keywords):
        """keras.ops.dot_product_attention on (B, T, N, H) tensors."""
        try:
            return self._dot_product_attention(q, k, v, **keywords)
        except ValueError as e:
            if "Only one of `bias` and `mask`" in str(e):
                raise NotImplementedError(f"{self.name}: {e}") from None
            raise

    def _dot_product_attention(self, q, k, v, **keywords):
        return self.ops.dot_product_attention(q, k, v, **keywords)

    def _numpy(self, t):
        return np.array(self.ops.convert_to_numpy(t), copy=True)

    def _restore(self, layout, t, width):
        """A (B, T, N, H) result as the interface's (*batch, N, T, H), its first `width`
        columns (the rest are the zero padding of KerasJaxBackend)."""
        return layout.restore(np.swapaxes(self._numpy(t), 1, 2)[..., :width])

    # ------------------------------------------------------------ the interface

    @rules.lengths_as_mask
    def attention_weights(self, q, k, *, mask=None, bias=None, sink=None, causal=None,
                          scale=None, softcap=None, window=None):
        return self.sdpa(q, k, rules.identity_values(q, k), mask=mask, bias=bias, sink=sink, causal=causal,
                         scale=scale, softcap=softcap, window=window)

    @rules.lengths_as_mask
    def sdpa(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
             softcap=None, window=None):
        self._check(q, softcap, sink)
        layout, qkv, keywords = self._inputs(q, k, v, mask, bias, causal, window, scale)
        return self._restore(layout, self._attend(*qkv, **keywords), np.shape(v)[-1])

    @rules.lengths_as_mask
    def sdpa_vjp(self, q, k, v, d_out, *, mask=None, bias=None, sink=None, causal=None,
                 scale=None, softcap=None, window=None):
        self._check(q, softcap, sink)
        layout, qkv, keywords = self._inputs(q, k, v, mask, bias, causal, window, scale)
        d_out = np.asarray(d_out)
        d_out = d_out.reshape((1,) * (3 - d_out.ndim) + d_out.shape)   # (..., H, Lq, Dv)
        d_out = np.broadcast_to(d_out, layout.batch + d_out.shape[-3:])
        d_out = self._tensor(np.swapaxes(d_out.reshape((layout.b,) + d_out.shape[-3:]), 1, 2))
        grads = self._vjp(qkv, d_out, **keywords)
        return tuple(_unbroadcast(self._restore(layout, g, np.shape(x)[-1]), np.shape(x))
                     for g, x in zip(grads, (q, k, v)))

    def multi_head_attention(self, query, key, value, *, w_q, w_k, w_v, w_o, num_heads,
                             num_kv_heads=None, mask=None, causal=None):
        self._check(query, None, None)
        return _keras_layers.multi_head_attention(
            self, query, key, value, w_q=w_q, w_k=w_k, w_v=w_v, w_o=w_o,
            num_heads=num_heads, num_kv_heads=num_kv_heads, mask=mask, causal=causal)

    def self_attention(self, x, w_q, w_k, w_v, *, mask=None, causal=None):
        self._check(x, None, None)
        return _keras_layers.self_attention(self, x, w_q, w_k, w_v, mask=mask, causal=causal)


def _unbroadcast(g, shape):
    """A gradient of a broadcast input summed back to the input's shape (in float64,
    then rounded once to its dtype)."""
    wide = g.astype(np.float64)
    wide = wide.sum(axis=tuple(range(wide.ndim - len(shape))))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and wide.shape[i] != 1)
    return wide.sum(axis=axes, keepdims=True).astype(g.dtype)


class KerasTorchBackend(_KerasBackend):
    """Keras 3 on torch (KERAS_BACKEND=torch)."""

    name = "keras-torch"
    keras_backend = "torch"
    dtypes = frozenset({"float32", "float16", "bfloat16"})
    dtype_notes = {"float64": "Keras's result_type maps float64 to float32 on torch: "
                              "dot_product_attention computes float64 inputs in float32"}
    policy = {
        # a boolean mask becomes a float mask of -0.7 * finfo.max (float16: -0.7 * 65500)
        # given to torch's SDPA: a row without keys is uniform
        "fully_masked_rows": "uniform",
        "neg_inf_bias_rows": "zeros",          # a -inf bias goes to SDPA as it is
        "masked_key_nan": "propagates",
        "masked_value_nan": "propagates",
        "accumulation": "float32",
        "padded_query_rows": "zeros",
    }
    policy_when = [
        # is_causal without a mask reaches SDPA as its flag, which takes the CPU flash
        # kernel (Dk == Dv): it skips hidden key blocks, so a NaN there reaches some rows
        {"when": {"causal": True, "mask": False, "window": False, "lengths": False},
         "policy": {"masked_key_nan": "per_row"}},
    ]

    def _vjp(self, leaves, d_out, **call):
        torch = self.framework
        leaves = [t.detach().requires_grad_() for t in leaves]
        return torch.autograd.grad(self._attend(*leaves, **call), leaves, d_out)

    def _numpy(self, t):
        return super()._numpy(t.detach())


class KerasTensorflowBackend(_KerasBackend):
    """Keras 3 on TensorFlow (KERAS_BACKEND=tensorflow): Keras's own einsum and softmax."""

    name = "keras-tensorflow"
    keras_backend = "tensorflow"
    policy = {
        # masked logits get -0.7 * finfo.max, a finite fill
        "fully_masked_rows": "uniform",
        "neg_inf_bias_rows": "nan",
        "masked_key_nan": "ignored",
        "masked_value_nan": "propagates",
        # tf.einsum sums float16 products in float16 on this CPU (as the tensorflow backend)
        "accumulation": "input",
        "padded_query_rows": "zeros",
    }

    def _vjp(self, leaves, d_out, **call):
        tf = self.framework
        with tf.GradientTape() as tape:
            for t in leaves:
                tape.watch(t)
            out = self._attend(*leaves, **call)
        return tape.gradient(out, list(leaves), output_gradients=d_out)


class KerasJaxBackend(_KerasBackend):
    """Keras 3 on JAX (KERAS_BACKEND=jax), jitted as a Keras user on JAX runs it (Keras's
    own training and inference steps are jax.jit programs): one jax.jit of
    dot_product_attention, and one of its jax.vjp, compiled once per shape and dtype.

    Keras calls jax.nn.dot_product_attention, which takes Dv == Dk alone; for Dv != Dk
    Keras falls back to its own implementation, which reshapes the output to the query's
    shape and fails (a finding, reproduced in tests/backends/test_model_findings.py): the
    narrower of q, k and v is zero-padded to one width here (exact: 0 * 0 terms in q . k
    and zero columns of the output, dropped; with Dk widened the default scale
    1/sqrt(Dk) is given, the float jax.nn computes from Dk)."""

    name = "keras-jax"
    keras_backend = "jax"
    dtypes = frozenset({"float32", "bfloat16"})
    dtype_notes = {"float64": "JAX runs without 64-bit types unless jax_enable_x64 is set "
                              "(Keras does not set it): Keras converts float64 inputs to "
                              "float32; with it, jax.nn.dot_product_attention still computes "
                              "its softmax in float32",
                   "float16": "jitted, float16 cannot be lowered on the CPU: "
                              "jax.nn.dot_product_attention asks dot_general for precision "
                              "F16_F16_F32, which XLA's CPU backend refuses when the program "
                              "is lowered, past the fallbacks of jax and Keras (try/except "
                              "around the call, which catch it only eagerly)"}
    policy = {
        # Keras calls jax.nn.dot_product_attention(implementation="xla"): masked logits
        # get its finite fill (-0.7 * float32 max), as on the jax backend
        "fully_masked_rows": "uniform",
        "neg_inf_bias_rows": "nan",
        "masked_key_nan": "ignored",
        "masked_value_nan": "propagates",
        "accumulation": "float32",
        "padded_query_rows": "zeros",
    }
    paths = {
        "attention_weights": "native: jax.jit(keras.ops.dot_product_attention) with "
                             "V = identity(Lk)",
        "sdpa": "native: jax.jit(keras.ops.dot_product_attention) (is_causal for top-left "
                "causal; boolean masks for bottom-right causal, windows and lengths; Dv != "
                "Dk zero-padded to one width)",
        "sdpa_vjp": "native: jax.jit of jax.vjp of keras.ops.dot_product_attention",
        "multi_head_attention": "not run: Keras's layers eagerly on JAX (see _NO_LAYERS)",
        "self_attention": "not run: Keras's layers eagerly on JAX (see _NO_LAYERS)",
    }

    def __init__(self):
        super().__init__()
        jax, ops = self.framework, self.ops
        static = ("scale", "is_causal")

        def attend(q, k, v, mask, bias, *, scale, is_causal):
            return ops.dot_product_attention(q, k, v, mask=mask, bias=bias, scale=scale,
                                             is_causal=is_causal)

        def grads(q, k, v, mask, bias, d_out, *, scale, is_causal):
            out, pullback = jax.vjp(lambda *qkv: attend(*qkv, mask, bias, scale=scale,
                                                        is_causal=is_causal), q, k, v)
            wider = out.shape[-1] - d_out.shape[-1]          # v's zero padding
            return pullback(jax.numpy.pad(d_out, ((0, 0),) * 3 + ((0, wider),))
                            .astype(out.dtype))

        self._jitted = jax.jit(attend, static_argnames=static)
        self._jitted_grads = jax.jit(grads, static_argnames=static)

    def _inputs(self, q, k, v, mask, bias, causal, window, scale):
        dk, width = np.shape(q)[-1], max(np.shape(q)[-1], np.shape(v)[-1])
        if scale is None and dk < width:
            scale = 1.0 / np.sqrt(dk)
        q, k, v = (_widen(np.asarray(x), width) for x in (q, k, v))
        return super()._inputs(q, k, v, mask, bias, causal, window, scale)

    def _dot_product_attention(self, q, k, v, *, mask, bias, **static):
        return self._jitted(q, k, v, mask, bias, **static)

    _NO_LAYERS = ("keras-jax: Keras's attention layers are not certified on JAX: called "
                  "eagerly, JAX compiles each primitive of the layer for every new shape, "
                  "and this adapter jits dot_product_attention alone")

    def multi_head_attention(self, *args, **params):
        raise NotImplementedError(self._NO_LAYERS)

    def self_attention(self, *args, **params):
        raise NotImplementedError(self._NO_LAYERS)

    def _vjp(self, leaves, d_out, *, mask, bias, **static):
        return self._jitted_grads(*leaves, mask, bias, d_out, **static)


def _widen(x, width):
    """x zero-padded on its last dim to `width` columns."""
    pad = width - x.shape[-1]
    return x if pad == 0 else np.pad(x, ((0, 0),) * (x.ndim - 1) + ((0, pad),))
