"""What the two ONNX backends share: one-node ``Attention`` models and their inputs.

Not a backend itself. ``backends/onnxruntime.py`` and ``backends/onnx_reference.py``
differ only in what runs the model (an ``onnxruntime.InferenceSession`` or
``onnx.reference.ReferenceEvaluator``) and in the opset they ask for; this module turns
an interface call into a model plus its feeds, and the output back into a NumPy array.

The models (built with ``onnx.helper``, shapes and dtypes fixed, so a session is
cached by that signature):

- ``sdpa``: one ``Attention`` node on 4-D ``(B, H, L, D)`` inputs; K and V carry
  their own head count (grouped- and multi-query natively). Top-left causal is
  ``is_causal=1``; bottom-right is ``is_causal=1`` with ``nonpad_kv_seqlen = Lk`` for
  every batch row (the operator's offset ``nonpad_kv_seqlen - Lq``); a window is the
  node's ``left_window_size`` / ``right_window_size`` where the opset has them
  (opset 25), else folded into an explicit boolean ``attn_mask``. A boolean mask is
  a boolean ``attn_mask``, a bias a float one; both together become one float mask
  with ``-inf`` at the disallowed positions (the composition the operator defines).
- ``attention_weights``: the same node, its 4th output with
  ``qk_matmul_output_mode=3`` (the probabilities), with a zero V of width 1.
- ``scores``: the 4th output with mode 0 (``(Q·√scale)(K·√scale)ᵀ``): ``dot`` with
  ``scale=1``, ``scaled_dot`` with the scale (default: the node's own); ``bilinear``
  is a ``MatMul`` by W before the node; ``additive`` has no Attention form.
- ``self_attention``: three ``MatMul`` nodes, then the node on 3-D inputs with one
  head.
- ``multi_head_attention``: ``MatMul`` projections, the node on 3-D inputs with
  ``q_num_heads`` / ``kv_num_heads`` (the operator splits heads exactly as the
  interface does: head h takes columns [h·Dh, (h+1)·Dh)), then a ``MatMul`` by W_o.
- ``softmax``: one ``Softmax`` node.
- ``sdpa_vjp``: ONNX has no gradient a plain runtime executes: unsupported.

Leading dims are broadcast and flattened into the operator's batch; dim -3 holds the
heads (as in the interface), and the output is reshaped back.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper

from . import rules

ELEM = {
    "float64": TensorProto.DOUBLE,
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "bfloat16": TensorProto.BFLOAT16,
}
NP = {"float64": np.float64, "float32": np.float32, "float16": np.float16,
      "bfloat16": ml_dtypes.bfloat16}
OPS = ("softmax", "scores", "attention_weights", "sdpa", "self_attention",
       "multi_head_attention", "sdpa_vjp")


def attention_opset() -> int:
    """The newest opset that defines Attention in the installed onnx."""
    return onnx.defs.get_schema("Attention", onnx.defs.onnx_opset_version(), "").since_version


def dtype_name(a) -> str:
    return np.dtype(np.asarray(a).dtype).name


# --------------------------------------------------------------------------- models


def _no_sink(sink, name):
    """Attention sinks: the framework has no native form, and this adapter composes none."""
    if sink is not None:
        raise NotImplementedError(f"{name}: no attention sink (a per-head logit in the"
                                  " softmax denominator) in the framework's attention op")


class Model:
    """A graph being built: inputs with fixed shapes, nodes, outputs, feeds."""

    def __init__(self, dtype: str):
        self.dtype = dtype
        self.inputs, self.nodes, self.outputs, self.feeds = [], [], [], {}
        self.key = [dtype]

    def feed(self, name: str, array: np.ndarray) -> str:
        array = np.ascontiguousarray(array)
        elem = TensorProto.BOOL if array.dtype == np.bool_ else (
            TensorProto.INT64 if array.dtype == np.int64 else ELEM[dtype_name(array)])
        self.inputs.append(helper.make_tensor_value_info(name, elem, array.shape))
        self.feeds[name] = array
        self.key.append((name, elem, array.shape))
        return name

    def node(self, op: str, inputs, outputs, **attrs):
        self.nodes.append(helper.make_node(op, list(inputs), list(outputs), **attrs))
        self.key.append((op, tuple(inputs), tuple(outputs), tuple(sorted(attrs.items()))))

    def output(self, name: str):
        self.outputs.append(helper.make_tensor_value_info(name, ELEM[self.dtype], None))
        self.key.append(("out", name))

    def signature(self, opset: int) -> tuple:
        """What identifies the model: shapes, dtypes, nodes and attributes, opset."""
        return (opset, *self.key)

    def proto(self, opset: int) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "attention_conformance", self.inputs,
                                  self.outputs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                  producer_name="attention-conformance")
        model.ir_version = 10
        return model


def _lift(x, rank):
    return None if x is None else x.reshape((1,) * (rank - x.ndim) + x.shape)


def attn_mask(mask, bias, extra):
    """One attn_mask from a bool mask, a float bias and a structural bool (or None)."""
    if extra is not None:
        mask = extra if mask is None else (mask & extra)
    if bias is None:
        return mask
    if mask is None:
        return bias
    mask, bias = np.broadcast_arrays(mask, bias)
    return np.where(mask, bias, bias.dtype.type(-np.inf)).astype(bias.dtype)


def attention_node(m: Model, q: str, k: str, v: str, *, lq, lk, b, mask=None, bias=None,
                   causal=None, scale=None, softcap=None, window=None, mode=None,
                   native_window=False, heads=None, kv_lengths=None):
    """Add the Attention node (inputs already fed by name); returns its output names.

    ``heads`` = (q_num_heads, kv_num_heads) for 3-D inputs; ``kv_lengths`` (one per row of
    the operator's batch) becomes ``nonpad_kv_seqlen``.
    """
    attrs = {}
    if scale is not None:
        attrs["scale"] = float(scale)
    if softcap is not None:
        if not softcap > 0:
            raise ValueError(f"softcap must be positive, got {softcap}")
        attrs["softcap"] = float(softcap)
    if heads is not None:
        attrs["q_num_heads"], attrs["kv_num_heads"] = heads
    rules.check_causal(causal)
    extra, nonpad = None, False
    if window is not None and not native_window:
        extra = rules.allowed(lq, lk, causal, window)  # causal folded in as well
    else:
        if causal is not None:
            attrs["is_causal"] = 1
        if window is not None:
            attrs["left_window_size"], attrs["right_window_size"] = (
                -1 if side is None else side for side in rules.window_sides(window))
        # the operator aligns causal (and windows) at offset nonpad_kv_seqlen - Lq;
        # with nonpad_kv_seqlen = Lk it is the bottom-right alignment, masking nothing
        nonpad = causal == "bottom_right"
    if kv_lengths is not None:
        if window is not None or causal == "top_left":
            raise ValueError("nonpad_kv_seqlen aligns causal at kv_length - Lq")
        nonpad = np.asarray(kv_lengths, dtype=np.int64)
    names = [q, k, v]
    am = attn_mask(mask, bias, extra)
    names.append("" if am is None else m.feed("attn_mask", am))
    if nonpad is not False and nonpad is not None:
        lengths = np.full((b,), lk, dtype=np.int64) if nonpad is True else nonpad
        names += ["", "", m.feed("nonpad_kv_seqlen", lengths)]
    while names[-1] == "":
        names.pop()
    outs = ["y"]
    if mode is not None:
        attrs["qk_matmul_output_mode"] = mode
        outs = ["y", "", "", "qk"]
    m.node("Attention", names, outs, **attrs)
    return outs


# --------------------------------------------------------------------------- ops


class OnnxAttention:
    """The attention interface on ONNX models; subclasses say how a model is run.

    A subclass sets ``name``, ``opset``, ``native_window`` and implements
    ``_session(model)`` (returns an object with ``run(outputs, feeds)``) and, where its
    runtime raises its own "not implemented" error, translates it in ``_run``.
    """

    dtypes = frozenset(ELEM)
    opset = 24
    native_window = False
    cache_size = 512

    def __init__(self):
        self._sessions = {}

    # ------------------------------------------------------------ running a model

    def _session(self, model: onnx.ModelProto):
        raise NotImplementedError

    def _call(self, m: Model, output: str) -> np.ndarray:
        key = m.signature(self.opset)
        session = self._sessions.get(key)
        if session is None:
            session = self._session(m.proto(self.opset))
            if len(self._sessions) >= self.cache_size:
                self._sessions.pop(next(iter(self._sessions)))
            self._sessions[key] = session
        y = self._run(session, output, m.feeds)
        y = np.asarray(y)
        want = NP[m.dtype]
        if y.dtype != np.dtype(want):
            raise TypeError(f"{self.name}: the model returned {y.dtype}, not {m.dtype}")
        return np.array(y, copy=True)

    def _run(self, session, output, feeds):
        return session.run([output], feeds)[0]

    def _dtype(self, a) -> str:
        name = dtype_name(a)
        if name not in self.dtypes:
            raise NotImplementedError(f"{self.name} backend does not support dtype {name}")
        return name

    @staticmethod
    def _cast(x, dt):
        return None if x is None else np.asarray(x).astype(NP[dt])

    # ------------------------------------------------------------ the interface

    def softmax(self, x, axis=-1):
        dt = self._dtype(x)
        m = Model(dt)
        m.node("Softmax", [m.feed("x", self._cast(x, dt))], ["y"], axis=int(axis))
        m.output("y")
        return self._call(m, "y")

    def _attention(self, q, k, v, *, mask, bias, causal, scale, softcap, window, mode,
                   pre=None, kv_lengths=None):
        dt = self._dtype(q)
        q, k, v, bias = (self._cast(a, dt) for a in (q, k, v, bias))
        mask = None if mask is None else np.asarray(mask, dtype=bool)
        lay = rules.Layout(q, k, v, mask, bias)
        if kv_lengths is not None:     # dim 0 of the batch; the rest flattened after it
            kv_lengths = np.repeat(np.asarray(kv_lengths, dtype=np.int64), lay.b // q.shape[0])
        q, k, v = lay.fold(q, k, v, np.broadcast_to)
        m = Model(dt)
        qn = m.feed("q", q)
        if pre is not None:  # bilinear scores: MatMul(q, W) first
            m.node("MatMul", [qn, m.feed("w_bilinear", self._cast(pre, dt))], ["qw"])
            qn = "qw"
        outs = attention_node(m, qn, m.feed("k", k), m.feed("v", v), lq=lay.lq, lk=lay.lk,
                              b=lay.b, mask=lay.scores(mask, np.broadcast_to),
                              bias=lay.scores(bias, np.broadcast_to),
                              causal=causal, scale=scale, softcap=softcap, window=window,
                              mode=mode, native_window=self.native_window,
                              kv_lengths=kv_lengths)
        out = outs[-1]
        m.output(out)
        return lay.restore(self._call(m, out))

    def scores(self, q, k, *, kind, scale=None, w=None, u=None, v=None):
        dt = self._dtype(q)
        zero_v = np.zeros(k.shape[:-1] + (1,), dtype=NP[dt])
        if kind == "dot":
            return self._attention(q, k, zero_v, mask=None, bias=None, causal=None,
                                   scale=1.0, softcap=None, window=None, mode=0)
        if kind == "scaled_dot":
            return self._attention(q, k, zero_v, mask=None, bias=None, causal=None,
                                   scale=scale, softcap=None, window=None, mode=0)
        if kind == "bilinear":
            return self._attention(q, k, zero_v, mask=None, bias=None, causal=None,
                                   scale=1.0, softcap=None, window=None, mode=0, pre=w)
        if kind == "additive":
            raise NotImplementedError(f"{self.name}: additive scores have no ONNX "
                                      "Attention form")
        raise ValueError(f"unknown score kind {kind!r}")

    @staticmethod
    def _nonpad(q, q_lengths, kv_lengths, causal, window) -> bool:
        """Whether kv_lengths go in as nonpad_kv_seqlen: without q_lengths (the operator
        has none), windows or top-left causal (it aligns causal at kv_length - Lq), on
        inputs with heads (dim 0 the batch)."""
        return (kv_lengths is not None and q_lengths is None and window is None
                and causal in (None, "bottom_right") and np.ndim(q) >= 4)

    @rules.sized()
    @rules.structure_as_mask
    def attention_weights(self, q, k, *, mask=None, bias=None, sink=None, causal=None,
                          scale=None, softcap=None, window=None, q_lengths=None,
                          kv_lengths=None):
        _no_sink(sink, self.name)
        if not self._nonpad(q, q_lengths, kv_lengths, causal, window):
            return self._masked_weights(q, k, mask=mask, bias=bias, causal=causal,
                                        scale=scale, softcap=softcap, window=window,
                                        q_lengths=q_lengths, kv_lengths=kv_lengths)
        dt = self._dtype(q)
        zero_v = np.zeros(k.shape[:-1] + (1,), dtype=NP[dt])
        return self._attention(q, k, zero_v, mask=mask, bias=bias, causal=causal,
                               scale=scale, softcap=softcap, window=window, mode=3,
                               kv_lengths=kv_lengths)

    @rules.lengths_as_mask
    def _masked_weights(self, q, k, *, mask=None, bias=None, causal=None, scale=None,
                        softcap=None, window=None):
        dt = self._dtype(q)
        zero_v = np.zeros(k.shape[:-1] + (1,), dtype=NP[dt])
        return self._attention(q, k, zero_v, mask=mask, bias=bias, causal=causal,
                               scale=scale, softcap=softcap, window=window, mode=3)

    @rules.sized()
    @rules.structure_as_mask
    def sdpa(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
             softcap=None, window=None, q_lengths=None, kv_lengths=None):
        _no_sink(sink, self.name)
        if not self._nonpad(q, q_lengths, kv_lengths, causal, window):
            return self._masked_sdpa(q, k, v, mask=mask, bias=bias, causal=causal,
                                     scale=scale, softcap=softcap, window=window,
                                     q_lengths=q_lengths, kv_lengths=kv_lengths)
        return self._attention(q, k, v, mask=mask, bias=bias, causal=causal, scale=scale,
                               softcap=softcap, window=window, mode=None,
                               kv_lengths=kv_lengths)

    @rules.lengths_as_mask
    def _masked_sdpa(self, q, k, v, *, mask=None, bias=None, causal=None, scale=None,
                     softcap=None, window=None):
        return self._attention(q, k, v, mask=mask, bias=bias, causal=causal, scale=scale,
                               softcap=softcap, window=window, mode=None)

    @rules.sized()
    def sdpa_vjp(self, q, k, v, d_out, **params):
        raise NotImplementedError(f"{self.name}: ONNX has no gradient of Attention that "
                                  "this runtime executes")

    def _projected(self, query, key, value, ws, *, heads, mask, causal):
        """MatMul projections, one Attention node on 3-D inputs, MatMul by W_o."""
        dt = self._dtype(query)
        query, key, value = (self._cast(a, dt) for a in (query, key, value))
        ws = [None if w is None else self._cast(w, dt) for w in ws]
        mask = None if mask is None else np.asarray(mask, dtype=bool)
        hq, hkv = heads
        lq, lk = query.shape[-2], key.shape[-2]
        m_lead = () if mask is None else _lift(mask, max(mask.ndim, 3)).shape[:-3]
        batch = np.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2],
                                    m_lead)
        b = math.prod(batch)
        flat = [np.broadcast_to(x, batch + x.shape[-2:]).reshape((b,) + x.shape[-2:])
                for x in (query, key, value)]
        if mask is not None:
            mask = _lift(mask, len(batch) + 3)
            h = 1 if mask.shape[-3] == 1 else hq
            mask = np.broadcast_to(mask, batch + (h,) + mask.shape[-2:-1] + (lk,))
            mask = mask.reshape((b, h) + mask.shape[-2:])
        m = Model(dt)
        names = []
        for x, w, n in zip(flat, ws[:3], "qkv"):
            m.node("MatMul", [m.feed(f"x{n}", x), m.feed(f"w_{n}", w)], [n])
            names.append(n)
        outs = attention_node(m, *names, lq=lq, lk=lk, b=b, mask=mask, causal=causal,
                              heads=(hq, hkv), native_window=self.native_window)
        y = outs[0]
        if ws[3] is not None:
            m.node("MatMul", [y, m.feed("w_o", ws[3])], ["o"])
            y = "o"
        m.output(y)
        out = self._call(m, y)
        return out.reshape(batch + out.shape[-2:])

    def self_attention(self, x, w_q, w_k, w_v, *, mask=None, causal=None):
        if mask is not None:  # (*batch, L, L): one head
            mask = np.asarray(mask, dtype=bool)
            mask = mask.reshape(mask.shape[:-2] + (1,) + mask.shape[-2:])
        return self._projected(x, x, x, [w_q, w_k, w_v, None], heads=(1, 1), mask=mask,
                               causal=causal)

    def multi_head_attention(self, query, key, value, *, w_q, w_k, w_v, w_o, num_heads,
                             num_kv_heads=None, mask=None, causal=None):
        hkv = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads % hkv:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {hkv}")
        return self._projected(query, key, value, [w_q, w_k, w_v, w_o],
                               heads=(num_heads, hkv), mask=mask, causal=causal)
