"""PaddlePaddle backend: a thin adapter from the attention interface to Paddle's own ops.

NumPy arrays are copied into Paddle tensors (CPU), the framework's public op is called,
and the result is copied back into a fresh NumPy array of the input dtype.

Path of each op (also in ``PaddleBackend.paths``):

- ``sdpa``: native ``paddle.nn.functional.scaled_dot_product_attention`` (layout
  ``(batch, seq, heads, dim)``; ``training=False``; grouped-query natively, with
  ``enable_gqa``). Top-left causal alone goes through ``is_causal=True``; the op ignores
  ``attn_mask`` when ``is_causal`` is set, so any other combination of mask, causal,
  window and bias is folded into one ``attn_mask`` (bool without a bias, else a float
  bias with ``-inf`` at disallowed positions). ``softcap``, which needs the raw scores,
  is composed from paddle ops.
- ``attention_weights``: native SDPA with ``V = identity(Lk)`` (its output is P, with
  SDPA's own masking); composed (as for ``sdpa``) with ``softcap``.
- ``sdpa_vjp``: ``paddle.grad`` through exactly the ``sdpa`` path.
- ``sdpa_lse``: composed, ``paddle.matmul`` / ``exp`` / ``sum`` / ``log`` of the score
  pipeline (paddle has no public op returning the lse).
- ``sink`` (attention_weights, sdpa, sdpa_lse, sdpa_vjp): composed, the sink as one more
  score column of value 0 (the native op has none); d_sink by ``paddle.grad``.
- ``softmax``: native ``paddle.nn.functional.softmax``.
- ``scores``: composed from ``paddle.matmul`` / ``paddle.tanh`` (no score-function API).
- ``self_attention``: projections with ``paddle.matmul``, then the ``sdpa`` path.
- ``multi_head_attention``: native ``paddle.nn.MultiHeadAttention`` (``bias_attr=False``,
  its four projection weights set to ours) when the layer can express the case
  (``num_kv_heads`` None or equal, ``H*Dh == H*Dhv == Eq == Eo``); otherwise
  projections, head split and ``w_o`` with ``paddle.matmul`` around the ``sdpa`` path.

Layout: the interface is ``(*batch, heads, L, D)``; leading dims are broadcast and
flattened into the op's batch (with paddle ops, so that gradients sum back), dim -3 is
the op's heads.

Dtypes: whatever the installed build computes on the CPU (a 1x1 float16 / bfloat16
matmul is tried when the backend is made: the CPU wheel has no half-precision matmul
or softmax kernel, so only float64 and float32 are declared there).

Declared policies: those of the functional op, ``scaled_dot_product_attention``
(checked by the policy cases). ``nn.MultiHeadAttention`` turns a boolean mask into a
``(mask - 1) * 1e9`` bias, so a fully masked row attends over all keys as if unmasked
(the max-subtraction cancels the -1e9), not NaN as the functional op gives: the policy
cases list that as a finding on that op.

Known differences (paddle 3.3.1, CPU; backends/expected_failures/paddle.yaml): the CPU
softmax clips shifted logits at -64, so a disallowed key keeps a weight of
exp(-64) = 1.6e-28 (a masked value of 1e30 leaks into the output); ``scale=0.0`` is
silently replaced by the default (``scale or head_dim**-0.5``); ``is_causal`` adds
-1e4 to hidden scores, not -inf.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from . import rules

with warnings.catch_warnings():  # "No ccache found", raised by paddle's C++ extension tools
    warnings.simplefilter("ignore")
    import paddle
    import paddle.nn.functional as F

_OPS = ("softmax", "scores", "attention_weights", "sdpa", "sdpa_lse", "self_attention",
        "multi_head_attention", "sdpa_vjp")


def _cpu_dtypes() -> frozenset:
    """The dtypes this build multiplies and softmaxes on the CPU."""
    ok = {"float64", "float32"}
    for name in ("float16", "bfloat16"):
        try:
            one = paddle.ones([1, 1], dtype=name)
            F.softmax(paddle.matmul(one, one))
        except RuntimeError:  # "kernel ... not found" on the CPU build
            continue
        ok.add(name)
    return frozenset(ok)


# ---------------------------------------------------------------- conversion


def _to_paddle(a, dtype: str | None = None) -> paddle.Tensor:
    a = np.array(a, order="C", copy=True)
    return paddle.to_tensor(a if dtype is None else a.astype(dtype))


def _to_numpy(t: paddle.Tensor) -> np.ndarray:
    return np.array(t.detach().numpy(), copy=True)


# ---------------------------------------------------------------- masks


def _allowed(mask, lq: int, lk: int, causal, window) -> np.ndarray | None:
    """The boolean mask and-ed with the keys causal and window allow (rules.allowed), or
    None when there is neither."""
    mask = None if mask is None else np.asarray(mask, dtype=bool)
    return rules.and_masks(mask, rules.allowed(lq, lk, causal, window))


def _attn_mask(ok, bias):
    """The op's attn_mask: the boolean ok, or the bias with -inf where ok is False."""
    if ok is None or bias is None:
        return bias if ok is None else ok
    return paddle.where(ok, bias, paddle.full([], -math.inf, dtype=bias.dtype))


# ---------------------------------------------------------------- attention core


def _composed_lse(q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
                  softcap=None, window=None):
    """(softmax(s) v, lse(s), P) of the score pipeline s with paddle ops, in the interface
    layout; paddle has no op returning the lse, and none with a sink, which is one more
    score column (a key of value 0). Disallowed keys are added as -inf, as the native op
    adds its boolean mask, so the declared policies hold (a row without keys is NaN, a
    NaN at a masked key propagates)."""
    lq, lk = q.shape[-2], k.shape[-2]
    if q.ndim >= 3 and k.ndim >= 3 and v.ndim >= 3:
        hq, hk = q.shape[-3], k.shape[-3]
        if hk > 1 and hq != hk and hq % hk == 0:  # grouped-query: kv head h // group
            k, v = (paddle.repeat_interleave(x, hq // hk, axis=x.ndim - 3) for x in (k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    s = paddle.matmul(q, k, transpose_y=True) * scale
    if softcap is not None:
        if softcap <= 0:
            raise ValueError(f"softcap must be positive, got {softcap}")
        s = softcap * paddle.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    ok = _allowed(mask, lq, lk, causal, window)
    if ok is not None:
        s = s + paddle.to_tensor(np.where(ok, 0.0, -math.inf).astype(str(s.dtype)
                                                                     .replace("paddle.", "")))
    if sink is not None:
        col = sink.reshape(list(sink.shape) + [1, 1])
        shape = list(np.broadcast_shapes(tuple(s.shape[:-1]), tuple(col.shape[:-1])))
        s = paddle.concat([paddle.broadcast_to(s, shape + [lk]),
                           paddle.broadcast_to(col, shape + [1])], axis=-1)
    m = paddle.max(s, axis=-1, keepdim=True).detach()
    e = paddle.exp(s - m)
    total = paddle.sum(e, axis=-1, keepdim=True)
    p = (e / total)[..., :lk]
    lse = (paddle.log(total) + m).squeeze(-1)
    return paddle.matmul(p, v), lse, p


def _attend(q, k, v, *, mask=None, bias=None, causal=None, scale=None, softcap=None,
            window=None):
    """The sdpa path on interface-layout tensors (mask: bool ndarray or None)."""
    tm = None if mask is None else paddle.to_tensor(np.asarray(mask, dtype=bool))
    lay = rules.Layout(q, k, v, tm, bias)
    q, k, v = lay.fold(q, k, v, paddle.broadcast_to)                    # (B, H, L, D)
    tm, tb = (lay.scores(x, paddle.broadcast_to) for x in (tm, bias))
    allowed = rules.allowed(lay.lq, lay.lk, causal, window)
    ok = rules.and_masks(tm, None if allowed is None else paddle.to_tensor(allowed))
    scale = None if scale is None else float(scale)
    if softcap is not None:
        return lay.restore(_composed(q, k, v, ok, tb, scale, float(softcap)))
    q, k, v = (x.transpose([0, 2, 1, 3]) for x in (q, k, v))            # the op's (B, L, H, D)
    if causal == "top_left" and mask is None and bias is None and window is None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, training=False,
                                             scale=scale)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=_attn_mask(ok, tb),
                                             training=False, scale=scale)
    return lay.restore(out.transpose([0, 2, 1, 3]))


def _composed(q, k, v, ok, bias, scale, softcap):
    """softmax(softcap(q kᵀ·scale) + bias, disallowed = -inf) v with paddle ops, on
    (B, H, L, D) tensors."""
    if softcap <= 0:
        raise ValueError(f"softcap must be positive, got {softcap}")
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = (paddle.repeat_interleave(x, group, axis=1) for x in (k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = paddle.matmul(q, k, transpose_y=True) * scale
    s = softcap * paddle.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    if ok is not None:
        # added as -inf, as the native op adds its converted boolean mask
        s = s + paddle.where(ok, paddle.zeros([], dtype=s.dtype),
                             paddle.full([], -math.inf, dtype=s.dtype))
    p = F.softmax(s, axis=-1)
    return paddle.matmul(p, v)


def _split_heads(x, heads):
    """(..., L, heads*D) -> (..., heads, L, D); head h takes columns [h*D, (h+1)*D)."""
    shape = list(x.shape)
    x = x.reshape(shape[:-1] + [heads, shape[-1] // heads])
    perm = list(range(x.ndim))
    perm[-3], perm[-2] = perm[-2], perm[-3]
    return x.transpose(perm)


def _merge_heads(x):
    """(..., heads, L, D) -> (..., L, heads*D)."""
    perm = list(range(x.ndim))
    perm[-3], perm[-2] = perm[-2], perm[-3]
    x = x.transpose(perm)
    shape = list(x.shape)
    return x.reshape(shape[:-2] + [shape[-2] * shape[-1]])


# ---------------------------------------------------------------- the backend


class PaddleBackend:
    """The attention interface on PaddlePaddle (CPU)."""

    name = "paddle"
    # checked bit for bit by the invariance cases (docs/interface.md, "Declared invariants")
    invariants = ("deterministic", "batch_invariant")
    policy = {
        "fully_masked_rows": "nan",
        "neg_inf_bias_rows": "nan",
        "masked_key_nan": "propagates",
        "masked_value_nan": "propagates",
        # float32 and float64 only on the CPU wheel, where the two tiers coincide
        "accumulation": "float32",
        # a padded query (past q_lengths) gets output, weight and dq rows of 0
        "padded_query_rows": "zeros",
        # every lse it returns or takes is a natural log
        "lse_base": "e",
    }
    paths = {
        "softmax": "native: paddle.nn.functional.softmax",
        "scores": "composed: paddle.matmul / paddle.tanh (paddle has no score-function API)",
        "attention_weights": "native: F.scaled_dot_product_attention with V = identity(Lk) "
                             "(keeps its masking); composed with softcap, and with a sink (one "
                             "more score column of value 0: the native op has no sink)",
        "sdpa": "native: F.scaled_dot_product_attention (is_causal for top-left alone, "
                "enable_gqa; mask/causal/window/bias folded into attn_mask); composed "
                "(paddle ops) only with softcap, and with a sink (the native op has "
                "none)",
        "self_attention": "composed projections (paddle.matmul), then native SDPA",
        "multi_head_attention": "native: paddle.nn.MultiHeadAttention (bias_attr=False); "
                                "composed (paddle.matmul + SDPA) for grouped-query or head "
                                "sizes the layer cannot express",
        "sdpa_vjp": "native: paddle.grad through the sdpa path (through the composed "
                    "sink path with a sink: d_sink)",
        "sdpa_lse": "composed: paddle.matmul / exp / sum / log of the score pipeline "
                    "(paddle has no public op returning the lse)",
    }

    def __init__(self):
        self.versions = {"paddlepaddle": paddle.__version__, "numpy": np.__version__}
        self.policy = dict(self.policy)
        self.paths = dict(self.paths)
        self.dtypes = _cpu_dtypes()

    # ------------------------------------------------------------ helpers

    def _dtype(self, a) -> str:
        name = np.dtype(np.asarray(a).dtype).name
        if name not in self.dtypes:
            raise NotImplementedError(f"paddle backend does not support dtype {name}")
        return name

    # ------------------------------------------------------------ operations

    def softmax(self, x, axis=-1):
        return _to_numpy(F.softmax(_to_paddle(x, self._dtype(x)), axis=axis))

    def scores(self, q, k, *, kind, scale=None, w=None, u=None, v=None):
        dt = self._dtype(q)
        tq, tk = _to_paddle(q, dt), _to_paddle(k, dt)
        if kind == "dot":
            s = paddle.matmul(tq, tk, transpose_y=True)
        elif kind == "scaled_dot":
            scale = 1.0 / math.sqrt(tk.shape[-1]) if scale is None else float(scale)
            s = paddle.matmul(tq, tk, transpose_y=True) * scale
        elif kind == "bilinear":
            s = paddle.matmul(paddle.matmul(tq, _to_paddle(w, dt)), tk, transpose_y=True)
        elif kind == "additive":
            kw = paddle.matmul(tk, _to_paddle(w, dt))                 # (*, Lk, Da)
            qu = paddle.matmul(tq, _to_paddle(u, dt))                 # (*, Lq, Da)
            hidden = paddle.tanh(kw.unsqueeze(-3) + qu.unsqueeze(-2))  # (*, Lq, Lk, Da)
            s = paddle.matmul(hidden, _to_paddle(v, dt))
        else:
            raise ValueError(f"unknown score kind {kind!r}")
        return _to_numpy(s)

    @rules.sized()
    @rules.lengths_as_mask
    def attention_weights(self, q, k, *, mask=None, bias=None, sink=None, causal=None, scale=None,
                          softcap=None, window=None):
        dt = self._dtype(q)
        tq, tk = _to_paddle(q, dt), _to_paddle(k, dt)
        tb = None if bias is None else _to_paddle(bias, dt)
        if sink is not None:
            return _to_numpy(_composed_lse(tq, tk, tk, mask=mask, bias=tb,
                                           sink=_to_paddle(sink, dt), causal=causal,
                                           scale=scale, softcap=softcap, window=window)[2])
        lk = tk.shape[-2]
        eye = paddle.broadcast_to(paddle.eye(lk, dtype=dt), list(tk.shape[:-2]) + [lk, lk])
        p = _attend(tq, tk, eye, mask=mask, bias=tb, causal=causal, scale=scale,
                    softcap=softcap, window=window)
        return _to_numpy(p)

    @rules.sized()
    @rules.lengths_as_mask
    def sdpa(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
             softcap=None, window=None):
        if sink is not None:
            return self.sdpa_lse(q, k, v, mask=mask, bias=bias, sink=sink, causal=causal,
                                 scale=scale, softcap=softcap, window=window)[0]
        dt = self._dtype(q)
        tq, tk, tv = (_to_paddle(a, dt) for a in (q, k, v))
        tb = None if bias is None else _to_paddle(bias, dt)
        out = _attend(tq, tk, tv, mask=mask, bias=tb, causal=causal, scale=scale,
                      softcap=softcap, window=window)
        return _to_numpy(out)

    @rules.sized()
    @rules.lengths_as_mask
    def sdpa_vjp(self, q, k, v, d_out, *, mask=None, bias=None, sink=None, causal=None, scale=None,
                 softcap=None, window=None):
        dt = self._dtype(q)
        leaves = [_to_paddle(a, dt) for a in (q, k, v) + (() if sink is None else (sink,))]
        for t in leaves:
            t.stop_gradient = False
        tb = None if bias is None else _to_paddle(bias, dt)
        if sink is None:
            out = _attend(*leaves, mask=mask, bias=tb, causal=causal, scale=scale,
                          softcap=softcap, window=window)
        else:  # composed: the native op has no sink; d_sink by paddle.grad
            out = _composed_lse(*leaves[:3], mask=mask, bias=tb, sink=leaves[3],
                                causal=causal, scale=scale, softcap=softcap,
                                window=window)[0]
        grads = paddle.grad([out], leaves, grad_outputs=[_to_paddle(d_out, dt)])
        return tuple(_to_numpy(g) for g in grads)

    @rules.sized()
    def sdpa_lse(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
                 softcap=None, window=None):
        dt = self._dtype(q)
        tq, tk, tv = (_to_paddle(a, dt) for a in (q, k, v))
        tb = None if bias is None else _to_paddle(bias, dt)
        ts = None if sink is None else _to_paddle(sink, dt)
        out, lse, _ = _composed_lse(tq, tk, tv, mask=mask, bias=tb, sink=ts, causal=causal,
                                    scale=scale, softcap=softcap, window=window)
        return _to_numpy(out), _to_numpy(lse.astype(rules.lse_dtype(dt).name))

    def self_attention(self, x, w_q, w_k, w_v, *, mask=None, causal=None):
        dt = self._dtype(x)
        tx = _to_paddle(x, dt)
        tq, tk, tv = (paddle.matmul(tx, _to_paddle(w, dt)) for w in (w_q, w_k, w_v))
        return _to_numpy(_attend(tq, tk, tv, mask=mask, causal=causal))

    def multi_head_attention(self, query, key, value, *, w_q, w_k, w_v, w_o, num_heads,
                             num_kv_heads=None, mask=None, causal=None):
        dt = self._dtype(query)
        tq, tk, tv = (_to_paddle(a, dt) for a in (query, key, value))
        ws = [_to_paddle(w, dt) for w in (w_q, w_k, w_v, w_o)]
        allowed = _allowed(mask, tq.shape[-2], tk.shape[-2], causal, None)
        kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        with paddle.no_grad():
            if kv_heads == num_heads and _layer_fits(tq.shape[-1], num_heads, *ws):
                out = _mha_layer(tq, tk, tv, ws, num_heads, allowed)
            else:
                out = _mha_composed(tq, tk, tv, ws, num_heads, kv_heads, allowed)
        return _to_numpy(out)


# ---------------------------------------------------------------- multi-head attention


def _layer_fits(e_q, heads, w_q, w_k, w_v, w_o) -> bool:
    """nn.MultiHeadAttention needs H*Dh == H*Dhv == Eq == Eo (its embed_dim)."""
    return (e_q % heads == 0 and w_q.shape[1] == e_q and w_k.shape[1] == e_q
            and w_v.shape[1] == e_q and list(w_o.shape) == [e_q, e_q])


def _mha_layer(q, k, v, ws, heads, allowed):
    """paddle.nn.MultiHeadAttention with our weights, on (B, L, E) inputs."""
    w_q, w_k, w_v, w_o = ws
    e_q, e_k, e_v = q.shape[-1], k.shape[-1], v.shape[-1]
    default = paddle.get_default_dtype()
    paddle.set_default_dtype(str(q.dtype).replace("paddle.", ""))  # the layer's weights
    try:
        mha = paddle.nn.MultiHeadAttention(e_q, heads, kdim=e_k, vdim=e_v, bias_attr=False)
    finally:
        paddle.set_default_dtype(default)
    mha.eval()
    for layer, w in ((mha.q_proj, w_q), (mha.k_proj, w_k), (mha.v_proj, w_v),
                     (mha.out_proj, w_o)):
        layer.weight.set_value(w)  # paddle's Linear weight is (in, out), as ours
    extra = [] if allowed is None else [allowed.shape[:-3]]
    lead = tuple(np.broadcast_shapes(tuple(q.shape[:-2]), tuple(k.shape[:-2]),
                                     tuple(v.shape[:-2]), *extra))
    lq, lk = q.shape[-2], k.shape[-2]
    q3, k3, v3 = (paddle.broadcast_to(t, list(lead) + list(t.shape[-2:]))
                  .reshape([-1] + list(t.shape[-2:])) for t in (q, k, v))
    attn_mask = None
    if allowed is not None:
        a = allowed.reshape((1,) * max(0, 3 + len(lead) - allowed.ndim) + allowed.shape)
        h = 1 if a.shape[-3] == 1 else heads
        a = np.broadcast_to(a, lead + (h, a.shape[-2], lk)).reshape(-1, h, a.shape[-2], lk)
        attn_mask = paddle.to_tensor(np.ascontiguousarray(a))
    out = mha(q3, k3, v3, attn_mask=attn_mask)
    return out.reshape(list(lead) + [lq, out.shape[-1]])


def _mha_composed(q, k, v, ws, heads, kv_heads, allowed):
    """Projections, head split, the sdpa path (grouped-query natively), W_o."""
    w_q, w_k, w_v, w_o = ws
    hq = _split_heads(paddle.matmul(q, w_q), heads)
    hk = _split_heads(paddle.matmul(k, w_k), kv_heads)
    hv = _split_heads(paddle.matmul(v, w_v), kv_heads)
    out = _attend(hq, hk, hv, mask=allowed)
    return paddle.matmul(_merge_heads(out), w_o)
