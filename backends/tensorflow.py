"""TensorFlow 2 / Keras 3 backend (Keras on its TensorFlow backend).

The adapter is thin: NumPy in, the framework's own public op, NumPy out.  Each op's
path (also declared in ``TensorflowBackend.paths``):

- ``softmax``: native ``keras.ops.softmax``.
- ``scores``: composed from ``keras.ops`` (matmul, tanh); Keras has no public op
  that returns raw attention scores.
- ``attention_weights``: native ``keras.ops.dot_product_attention`` with
  ``V = identity(Lk)`` (so ``P·I = P``); composed ``keras.ops.softmax`` pipeline when
  ``softcap`` is given.
- ``sdpa``: native ``keras.ops.dot_product_attention`` (its own grouped-query
  support; ``is_causal`` for top-left causal); bottom-right causal (Lq != Lk) and
  ``window`` become an explicit boolean mask; ``softcap`` (supported by Keras only on
  JAX/TPU) and multi-query (one kv head, which the TF backend's einsum rejects) are
  handled by composing / broadcasting.
- ``self_attention``: composed projections (``keras.ops.matmul``), then the native
  ``sdpa`` path.
- ``multi_head_attention``: native ``keras.layers.MultiHeadAttention`` (or
  ``keras.layers.GroupQueryAttention`` when ``num_kv_heads < num_heads``); composed
  projections + native ``keras.ops.dot_product_attention`` where the layers cannot
  express the case (per-head mask, grouped-query with ``Dhv != Dh`` or ``Eo != Eq``).
- ``sdpa_vjp``: ``tf.GradientTape`` over the native ``sdpa`` path (over the composed
  sink path with a ``sink``: d_sink).
- ``sdpa_lse``: composed, ``tf.matmul`` / ``tf.exp`` / ``tf.reduce_sum`` of the score
  pipeline (Keras has no op returning the lse).
- ``sink`` (attention_weights, sdpa, sdpa_lse, sdpa_vjp): composed, the sink as one more
  score column of value 0; Keras' attention op has no sink.

Every configuration (op, static parameters, shapes, dtypes) runs eagerly until it
has spent about as long as one trace costs (~0.15 s); from then on it runs a
``tf.function`` cached for that configuration.  Tracing is thus only paid for by
configurations that repeat, and never costs more than about twice the best choice.
"""

from __future__ import annotations

import functools
import math
import os
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from . import _tensorflow_cores as cores
from . import rules

if keras.backend.backend() != "tensorflow":
    raise ImportError(
        "backends.tensorflow needs Keras on its TensorFlow backend, but "
        f"keras.backend.backend() is {keras.backend.backend()!r}; "
        "set KERAS_BACKEND=tensorflow before Keras is imported"
    )

_DTYPES = ("float64", "float32", "float16", "bfloat16")
_TRACE_BUDGET_S = 0.15  # eager seconds one configuration spends before it is traced
_MAX_CACHED = 512


# ---------------------------------------------------------------- array handling


def _dtype_name(*arrays) -> str:
    name = np.asarray(arrays[0]).dtype.name
    if name not in _DTYPES:
        raise NotImplementedError(f"tensorflow backend: dtype {name} is not supported")
    return name


def _tensor(x, dtype=None):
    """NumPy -> tf tensor (None stays None); bfloat16 arrays convert directly."""
    if x is None:
        return None
    return tf.convert_to_tensor(np.asarray(x), dtype=dtype)


def _numpy(t, dtype: str) -> np.ndarray:
    """tf tensor -> a fresh NumPy array of the requested dtype."""
    out = np.array(t.numpy(), copy=True)
    if out.dtype.name != dtype:
        raise AssertionError(f"tensorflow backend produced {out.dtype}, expected {dtype}")
    return out


def _bool(mask):
    return None if mask is None else np.asarray(mask, dtype=bool)


def _sig(*arrays):
    """Shapes and dtypes of the arguments: part of every cache key."""
    return tuple(None if a is None else (tuple(np.shape(a)), np.asarray(a).dtype.name)
                 for a in arrays)


class _Runner:
    """Run a computation eagerly, or through a tf.function once its key has spent
    about one trace's worth of eager time (a ski-rental rule)."""

    def __init__(self):
        self._spent: dict = {}
        self._functions: dict = {}

    def __call__(self, key, fn, *args):
        compiled = self._functions.get(key)
        if compiled is not None:
            return compiled(*args)
        start = time.perf_counter()
        out = fn(*args)
        spent = self._spent.get(key, 0.0) + time.perf_counter() - start
        if spent < _TRACE_BUDGET_S:
            if len(self._spent) >= 64 * _MAX_CACHED:
                self._spent.clear()
            self._spent[key] = spent
        else:
            self._spent.pop(key, None)
            if len(self._functions) >= _MAX_CACHED:
                self._functions.clear()
            # a partial has no __code__, so TF counts retracing per function object
            # rather than per closure code (no spurious "retracing" warnings)
            self._functions[key] = tf.function(functools.partial(fn))
        return out


# ---------------------------------------------------------------- multi-head layers


def _split_heads(w, heads: int, what: str):
    cols = w.shape[1]
    if cols % heads:
        raise ValueError(f"{what} has {cols} columns, not a multiple of {heads} heads")
    return cols // heads


class TensorflowBackend:
    """The attention interface on TensorFlow 2 with Keras 3 (TensorFlow backend)."""

    name = "tensorflow"
    # checked bit for bit by the invariance cases (docs/interface.md, "Declared invariants")
    invariants = ("deterministic", "batch_invariant")
    dtypes = frozenset(_DTYPES)
    # docs/interface.md, "fp8 inputs and descale factors"
    dtype_notes = {"float8_e4m3fn": "no descales, and MatMul takes no float8",
                   "float8_e5m2": "no descales, and MatMul takes no float8"}
    policy = {
        # keras.ops.dot_product_attention writes -0.7*float32max (not -inf) into
        # masked logits, so a fully masked row softmaxes to 1/Lk: the mean of V.
        "fully_masked_rows": "uniform",
        # an all -inf bias row is -inf everywhere before the softmax: NaN.
        "neg_inf_bias_rows": "nan",
        # tf.where replaces a masked logit, NaN included, before the softmax.
        "masked_key_nan": "ignored",
        # P·V multiplies the masked value by weight 0, and 0·NaN is NaN.
        "masked_value_nan": "propagates",
        "accumulation": "input",
        # a padded query (past q_lengths) gets output, weight and dq rows of 0
        "padded_query_rows": "zeros",
        # every lse it returns or takes is a natural log
        "lse_base": "e",
    }
    paths = {
        "softmax": "native: keras.ops.softmax",
        "scores": "composed: keras.ops.matmul / tanh (no public raw-score op)",
        "attention_weights": "native: keras.ops.dot_product_attention with V = I(Lk); "
                             "composed keras.ops.softmax pipeline for softcap; composed "
                             "(tf ops) with a sink (one more score column of value 0: "
                             "keras.ops.dot_product_attention has no sink)",
        "sdpa": "native: keras.ops.dot_product_attention (explicit mask for "
                "bottom-right causal and window; composed for softcap, and "
                "with a sink: one more score column of value 0, the native op has none)",
        "self_attention": "composed: keras.ops.matmul projections + native "
                          "keras.ops.dot_product_attention",
        "multi_head_attention": "native: keras.layers.MultiHeadAttention / "
                                "GroupQueryAttention (composed projections + native "
                                "dot_product_attention for per-head masks and GQA "
                                "with Dhv != Dh or Eo != Eq)",
        "sdpa_vjp": "native: tf.GradientTape over keras.ops.dot_product_attention; "
                    "tf.GradientTape over the composed sink path with a sink (d_sink)",
        "sdpa_lse": "composed: tf.matmul / tf.exp / tf.reduce_sum of the score pipeline "
                    "(Keras has no op returning the lse)",
    }
    versions = {"tensorflow": tf.__version__, "keras": keras.__version__}

    def __init__(self):
        self._run = _Runner()
        self._layers: dict = {}
        self._layer_weights: dict = {}  # id(layer) -> kernels it holds

    # ------------------------------------------------------------ simple ops

    def softmax(self, x, axis=-1):
        dtype = _dtype_name(x)
        key = ("softmax", axis, _sig(x))
        out = self._run(key, lambda t: keras.ops.softmax(t, axis=axis), _tensor(x))
        return _numpy(out, dtype)

    def scores(self, q, k, *, kind, scale=None, w=None, u=None, v=None):
        dtype = _dtype_name(q, k)
        if kind not in ("dot", "scaled_dot", "bilinear", "additive"):
            raise ValueError(f"unknown score kind {kind!r}")
        if kind == "scaled_dot" and scale is None:
            scale = 1.0 / math.sqrt(q.shape[-1])
        key = ("scores", kind, scale, _sig(q, k, w, u, v))

        def fn(qt, kt, wt, ut, vt):
            if kind == "additive":
                kw = keras.ops.expand_dims(keras.ops.matmul(kt, wt), -3)  # (*,1,Lk,Da)
                qu = keras.ops.expand_dims(keras.ops.matmul(qt, ut), -2)  # (*,Lq,1,Da)
                return keras.ops.matmul(keras.ops.tanh(kw + qu), vt)
            if kind == "bilinear":
                qt = keras.ops.matmul(qt, wt)
            s = keras.ops.matmul(qt, keras.ops.swapaxes(kt, -1, -2))
            if kind == "scaled_dot":
                s = s * tf.constant(scale, dtype=s.dtype)
            return s

        out = self._run(key, fn, _tensor(q), _tensor(k), _tensor(w), _tensor(u), _tensor(v))
        return _numpy(out, dtype)

    # ------------------------------------------------------------ attention

    @rules.sized()
    @rules.lengths_as_mask
    def attention_weights(self, q, k, *, mask=None, bias=None, sink=None, causal=None, scale=None,
                          softcap=None, window=None):
        dtype = _dtype_name(q, k)
        lk = k.shape[-2]
        if sink is not None:
            return _numpy(self._composed(q, k, k, mask, bias, sink, causal, scale, softcap,
                                         window)[2], dtype)
        if softcap is None:  # P = softmax(...)·I, computed by the native op itself
            eye = np.broadcast_to(np.eye(lk, dtype=q.dtype), k.shape[:-1] + (lk,))
            return self.sdpa(q, k, eye, mask=mask, bias=bias, causal=causal,
                             scale=scale, window=window)
        plan, mask4, bias4, _ = cores.prepare(q, k, k, mask, bias, causal, window, softcap)
        key = ("weights", scale, softcap, plan.lead, _sig(q, k, mask4, bias4))

        def fn(qt, kt, mt, bt):
            qh = cores.to_bthd(qt, plan.full(plan.heads, plan.lq, plan.dk), plan.b)
            kh = cores.to_bthd(kt, plan.full(plan.kv_heads, plan.lk, plan.dk), plan.b)
            s = cores.scale_tensor(scale, plan.dk, qh.dtype)
            probs = cores.composed_probs(qh, kh, bt, mt, s, softcap)  # (B, N, T, S)
            return tf.reshape(probs, plan.lead + (plan.lq, plan.lk))

        out = self._run(key, fn, _tensor(q), _tensor(k), _tensor(mask4), _tensor(bias4))
        return _numpy(out, dtype)

    def _sdpa_call(self, q, k, v, mask, bias, causal, scale, softcap, window):
        """Key, function and tensor arguments of one sdpa computation."""
        plan, mask4, bias4, native_causal = cores.prepare(q, k, v, mask, bias, causal,
                                                          window, softcap)
        key = (scale, softcap, native_causal, plan.lead, _sig(q, k, v, mask4, bias4))

        def fn(qt, kt, vt, mt, bt):
            return cores.attend(qt, kt, vt, mt, bt, plan=plan, scale=scale,
                                native_causal=native_causal, softcap=softcap)

        return key, fn, [_tensor(a) for a in (q, k, v, mask4, bias4)]

    @rules.sized()
    @rules.lengths_as_mask
    def sdpa(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
             softcap=None, window=None):
        dtype = _dtype_name(q, k, v)
        if sink is not None:
            return _numpy(self._composed(q, k, v, mask, bias, sink, causal, scale, softcap,
                                         window)[0], dtype)
        key, fn, args = self._sdpa_call(q, k, v, mask, bias, causal, scale, softcap, window)
        return _numpy(self._run(("sdpa",) + key, fn, *args), dtype)

    @rules.sized()
    @rules.lengths_as_mask
    def sdpa_vjp(self, q, k, v, d_out, *, mask=None, bias=None, sink=None, causal=None, scale=None,
                 softcap=None, window=None):
        dtype = _dtype_name(q, k, v)
        if sink is not None:
            leaves = [_tensor(a) for a in (q, k, v, sink)]
            with tf.GradientTape() as tape:
                tape.watch(leaves)
                out = cores.composed_lse(*leaves[:3], mask=_bool(mask), bias=_tensor(bias),
                                         sink=leaves[3], causal=causal, scale=scale,
                                         softcap=softcap, window=window)[0]
            grads = tape.gradient(out, leaves, output_gradients=_tensor(d_out))
            return tuple(_numpy(tf.zeros_like(x) if g is None else g, dtype)
                         for x, g in zip(leaves, grads))
        key, fn, args = self._sdpa_call(q, k, v, mask, bias, causal, scale, softcap, window)

        def vjp(qt, kt, vt, mt, bt, gt):
            with tf.GradientTape() as tape:
                tape.watch([qt, kt, vt])
                out = fn(qt, kt, vt, mt, bt)
            grads = tape.gradient(out, [qt, kt, vt], output_gradients=gt)
            return [tf.zeros_like(x) if g is None else g
                    for x, g in zip((qt, kt, vt), grads)]

        grads = self._run(("vjp",) + key + _sig(d_out), vjp, *args, _tensor(d_out))
        return tuple(_numpy(g, dtype) for g in grads)

    @rules.sized()
    def sdpa_lse(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
                 softcap=None, window=None):
        dtype = _dtype_name(q, k, v)
        out, lse, _ = self._composed(q, k, v, mask, bias, sink, causal, scale, softcap, window)
        return _numpy(out, dtype), _numpy(lse, dtype).astype(rules.lse_dtype(dtype))

    @staticmethod
    def _composed(q, k, v, mask, bias, sink, causal, scale, softcap, window):
        """The composed (out, lse, P) of sdpa_lse and of sinks, eagerly."""
        return cores.composed_lse(_tensor(q), _tensor(k), _tensor(v), mask=_bool(mask),
                                  bias=_tensor(bias), sink=_tensor(sink), causal=causal,
                                  scale=scale, softcap=softcap, window=window)

    def self_attention(self, x, w_q, w_k, w_v, *, mask=None, causal=None):
        dtype = _dtype_name(x, w_q, w_k, w_v)
        lead = x.shape[:-2]
        lx, dk, dv = x.shape[-2], w_k.shape[1], w_v.shape[1]
        probe = (np.empty(lead + (lx, dk), np.bool_), np.empty(lead + (lx, dv), np.bool_))
        plan, mask4, _, native_causal = cores.prepare(probe[0], probe[0], probe[1], mask,
                                                      None, causal, None, None)
        key = ("self_attention", native_causal, plan.lead,
               _sig(x, w_q, w_k, w_v, mask4))

        def fn(xt, wq, wk, wv, mt):
            qt, kt, vt = (keras.ops.matmul(xt, w) for w in (wq, wk, wv))
            return cores.attend(qt, kt, vt, mt, None, plan=plan, scale=None,
                                native_causal=native_causal, softcap=None)

        out = self._run(key, fn, *(_tensor(a) for a in (x, w_q, w_k, w_v, mask4)))
        return _numpy(out, dtype)

    # ------------------------------------------------------------ multi-head

    def multi_head_attention(self, query, key, value, *, w_q, w_k, w_v, w_o, num_heads,
                             num_kv_heads=None, mask=None, causal=None):
        dtype = _dtype_name(query, key, value, w_q, w_k, w_v, w_o)
        h = int(num_heads)
        hkv = int(num_kv_heads or num_heads)
        if h % hkv:
            raise ValueError(f"num_heads {h} is not a multiple of num_kv_heads {hkv}")
        dh = _split_heads(w_q, h, "w_q")
        if _split_heads(w_k, hkv, "w_k") != dh:
            raise ValueError("w_q and w_k give different head sizes")
        dhv = _split_heads(w_v, hkv, "w_v")
        lq, lk = query.shape[-2], key.shape[-2]
        eq, eo = query.shape[-1], w_o.shape[1]

        mask_lead = np.shape(mask)[:-3] if mask is not None and np.ndim(mask) > 3 else ()
        batch = tuple(np.broadcast_shapes(query.shape[:-2], key.shape[:-2],
                                          value.shape[:-2], mask_lead))
        b = math.prod(batch)
        structural, native_causal = cores.structural_mask(lq, lk, causal, None)
        combined = rules.and_masks(_bool(mask), structural)
        per_head = combined is not None and np.ndim(combined) >= 3 \
            and np.shape(combined)[-3] != 1
        layer_ok = not per_head and (hkv == h or (dh == dhv and eo == eq))

        def flat(a):  # (*batch, L, E) -> (B, L, E)
            return np.broadcast_to(a, batch + a.shape[-2:]).reshape((b,) + a.shape[-2:])

        inputs = [flat(a) for a in (query, key, value)]
        if layer_ok:
            mask3 = None
            if combined is not None:
                m = cores.to_4d(combined, batch, 1, lq, lk)
                mask3 = np.broadcast_to(m[:, 0], (b, lq, lk))
            out = self._mha_layer(inputs, mask3, native_causal, w_q, w_k, w_v, w_o,
                                  h, hkv, dh, dhv, dtype)
        else:
            mask4 = cores.to_4d(combined, batch, h, lq, lk)
            out = self._mha_composed(inputs, mask4, native_causal, w_q, w_k, w_v, w_o,
                                     h, hkv, dh, dhv, dtype)
        return _numpy(tf.reshape(out, batch + (lq, eo)), dtype)

    def _layer(self, h, hkv, dh, dhv, shapes, eo, dtype):
        """A built Keras attention layer for this configuration, cached."""
        config = (h, hkv, dh, dhv, shapes, eo, dtype)
        layer = self._layers.get(config)
        if layer is None:
            (eq, ek, ev) = shapes
            if hkv == h:
                layer = keras.layers.MultiHeadAttention(
                    num_heads=h, key_dim=dh, value_dim=dhv, use_bias=False,
                    output_shape=eo, dtype=dtype)
            else:
                layer = keras.layers.GroupQueryAttention(
                    head_dim=dh, num_query_heads=h, num_key_value_heads=hkv,
                    use_bias=False, dtype=dtype)
            layer.build((None, None, eq), (None, None, ev), (None, None, ek))
            self._layers[config] = layer
        return layer

    def _mha_layer(self, inputs, mask3, native_causal, w_q, w_k, w_v, w_o,
                   h, hkv, dh, dhv, dtype):
        query, key, value = inputs
        shapes = (query.shape[-1], key.shape[-1], value.shape[-1])
        eo = w_o.shape[1]
        layer = self._layer(h, hkv, dh, dhv, shapes, eo, dtype)
        # kernels: (E, H, Dh) — head h takes columns [h*Dh, (h+1)*Dh); output (H, Dhv, Eo)
        kernels = {
            "query": np.reshape(w_q, (shapes[0], h, dh)),
            "key": np.reshape(w_k, (shapes[1], hkv, dh)),
            "value": np.reshape(w_v, (shapes[2], hkv, dhv)),
            "attention_output": np.reshape(w_o, (h, dhv, eo)),
        }
        # both layers name their projections query/key/value/attention_output
        weights = [kernels[w.path.split("/")[-2]] for w in layer.weights]
        last = self._layer_weights.get(id(layer))
        if last is None or not all(np.array_equal(a, b) for a, b in zip(last, weights)):
            layer.set_weights(weights)
            self._layer_weights[id(layer)] = [np.array(w, copy=True) for w in weights]
        run_key = ("mha-layer", id(layer), native_causal, _sig(query, key, value, mask3))

        def fn(qt, kt, vt, mt):
            return layer(qt, vt, key=kt, attention_mask=mt, use_causal_mask=native_causal)

        return self._run(run_key, fn, *(_tensor(a) for a in (query, key, value, mask3)))

    def _mha_composed(self, inputs, mask4, native_causal, w_q, w_k, w_v, w_o,
                      h, hkv, dh, dhv, dtype):
        query, key, value = inputs
        b, lq, lk = query.shape[0], query.shape[1], key.shape[1]
        run_key = ("mha-composed", h, hkv, native_causal,
                   _sig(query, key, value, w_q, w_k, w_v, w_o, mask4))

        def fn(qt, kt, vt, wq, wk, wv, wo, mt):
            qh = keras.ops.reshape(keras.ops.matmul(qt, wq), (b, lq, h, dh))
            kh = keras.ops.reshape(keras.ops.matmul(kt, wk), (b, lk, hkv, dh))
            vh = keras.ops.reshape(keras.ops.matmul(vt, wv), (b, lk, hkv, dhv))
            if hkv == 1 and h > 1:  # multi-query: the TF backend's einsum needs N heads
                kh = keras.ops.repeat(kh, h, axis=2)
                vh = keras.ops.repeat(vh, h, axis=2)
            out = keras.ops.dot_product_attention(
                qh, kh, vh, mask=mt, scale=cores.scale_tensor(None, dh, qh.dtype),
                is_causal=native_causal, flash_attention=None)
            return keras.ops.matmul(keras.ops.reshape(out, (b, lq, h * dhv)), wo)

        args = (query, key, value, w_q, w_k, w_v, w_o, mask4)
        return self._run(run_key, fn, *(_tensor(a) for a in args))
