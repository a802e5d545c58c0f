"""Keras 3's attention layers for the keras backends' ``multi_head_attention`` and
``self_attention``: ``keras.layers.MultiHeadAttention`` and
``keras.layers.GroupQueryAttention`` built with the case's weights as their kernels.

Not a backend itself; imported by backends/keras.py, which calls these with itself (its
Keras, and its conversion of arrays to tensors and back).

- ``multi_head_attention``: ``MultiHeadAttention(num_heads=H, key_dim=Dh,
  value_dim=Dhv, output_shape=Eo, use_bias=False, dropout=0)`` when ``Hkv = H``;
  ``GroupQueryAttention(head_dim=Dh, num_query_heads=H, num_key_value_heads=Hkv,
  use_bias=False, dropout=0)`` when ``Hkv < H`` (one head_dim for queries, keys and
  values, and an output as wide as the query: Dhv != Dh or Eo != Eq has no form). The
  interface's ``w_q: (Eq, H·Dh)`` is the layer's query kernel ``(Eq, H, Dh)`` (head h
  takes columns ``[h·Dh, (h+1)·Dh)`` in both), ``w_o: (H·Dhv, Eo)`` its output kernel
  ``(H, Dhv, Eo)``. The layer scales by ``1/sqrt(Dh)``, the spec's scale.
- ``self_attention``: the same layer with one head, ``w_q``, ``w_k``, ``w_v`` as its
  kernels and the identity as its output kernel (exact: each output is one product by 1
  plus products by 0).

The layers call ``keras.ops.dot_product_attention`` (dropout 0, attention scores not
asked for): with ``use_causal_mask`` alone as its ``is_causal``, otherwise with the
boolean ``attention_mask`` broadcast over the heads, so the backend's policies (and its
``policy_when``) hold for them as for ``sdpa``. ``use_causal_mask`` is top-left causal
(``row >= column``): bottom-right causal where it differs (Lq != Lk) is a boolean
``attention_mask``. ``attention_mask`` is ``(B, T, S)``, one for every head: a mask
that differs between heads is unsupported. Batch dims are broadcast and flattened into
the layers' B (they take ``(B, T, E)``).
"""

from __future__ import annotations

import numpy as np

from . import rules

#: the keras backends' paths of these ops
PATHS = {
    "multi_head_attention": "native: keras.layers.MultiHeadAttention (GroupQueryAttention "
                            "when num_kv_heads < num_heads) with the case's weights as its "
                            "kernels, use_bias=False, dropout 0, called eagerly",
    "self_attention": "native: keras.layers.MultiHeadAttention with one head, the case's "
                      "w_q, w_k, w_v and the identity as its output kernel",
}


def multi_head_attention(backend, query, key, value, *, w_q, w_k, w_v, w_o, num_heads,
                         num_kv_heads=None, mask=None, causal=None):
    """The interface's multi_head_attention through one of Keras's layers."""
    heads, kv_heads = num_heads, num_kv_heads or num_heads
    w_q, w_k, w_v, w_o = (np.asarray(w) for w in (w_q, w_k, w_v, w_o))
    dh, dhv = w_q.shape[1] // heads, w_v.shape[1] // kv_heads
    if kv_heads == heads:
        layer = backend.keras.layers.MultiHeadAttention(
            num_heads=heads, key_dim=dh, value_dim=dhv, output_shape=w_o.shape[1],
            use_bias=False, dropout=0.0, dtype=_dtype(query))
    elif dhv != dh or w_o.shape[1] != np.shape(query)[-1]:
        raise NotImplementedError(
            f"{backend.name}: keras.layers.GroupQueryAttention has one head_dim for "
            "queries, keys and values and projects back to the query's width (Dhv != Dh "
            "or Eo != Eq has no form)")
    else:
        layer = backend.keras.layers.GroupQueryAttention(
            head_dim=dh, num_query_heads=heads, num_key_value_heads=kv_heads,
            use_bias=False, dropout=0.0, dtype=_dtype(query))
    kernels = [w_q.reshape(w_q.shape[0], heads, dh), w_k.reshape(w_k.shape[0], kv_heads, dh),
               w_v.reshape(w_v.shape[0], kv_heads, dhv), w_o.reshape(heads, dhv, -1)]
    return _call(backend, layer, kernels, query, key, value, mask, causal, heads)


def self_attention(backend, x, w_q, w_k, w_v, *, mask=None, causal=None):
    """The interface's self_attention: one head of MultiHeadAttention, identity w_o."""
    w_q, w_k, w_v = (np.asarray(w) for w in (w_q, w_k, w_v))
    dk, dv = w_q.shape[1], w_v.shape[1]
    layer = backend.keras.layers.MultiHeadAttention(
        num_heads=1, key_dim=dk, value_dim=dv, output_shape=dv, use_bias=False,
        dropout=0.0, dtype=_dtype(x))
    kernels = [w[:, None, :] for w in (w_q, w_k, w_v)]
    kernels.append(np.eye(dv, dtype=w_v.dtype)[None])
    # the mask broadcasts to the scores (*batch, L, L): the one head's axis put in
    mask = None if mask is None else np.expand_dims(mask, -3)
    return _call(backend, layer, kernels, x, x, x, mask, causal, 1)


def _dtype(x) -> str:
    """The layer's dtype policy: the case's dtype (variables and computation)."""
    return np.dtype(np.asarray(x).dtype).name


def _call(backend, layer, kernels, query, key, value, mask, causal, heads):
    """The layer built for (B, T, E) inputs, its kernels set, called on the batch dims
    flattened into B; the output with the batch dims back."""
    query, key, value = (np.asarray(x) for x in (query, key, value))
    lq, lk = query.shape[-2], key.shape[-2]
    mask = None if mask is None else np.asarray(mask)
    extra = [] if mask is None or mask.ndim < 3 else [mask.shape[:-3]]
    lead = np.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2], *extra)
    flat = [np.broadcast_to(x, lead + x.shape[-2:]).reshape((-1,) + x.shape[-2:])
            for x in (query, key, value)]
    use_causal = causal is not None and (causal == "top_left" or lq == lk)
    allowed = rules.and_masks(_one_mask_per_call(backend, mask, lead, heads, lq, lk),
                              None if use_causal else rules.allowed(lq, lk, causal))
    if allowed is not None:
        allowed = np.broadcast_to(allowed, lead + (lq, lk)).reshape(-1, lq, lk)
    layer.build(flat[0].shape, flat[2].shape, flat[1].shape)
    layer.set_weights([k.astype(query.dtype) for k in kernels])
    out = layer(*(backend._tensor(x) for x in (flat[0], flat[2])), key=backend._tensor(flat[1]),
                attention_mask=backend._tensor(allowed), use_causal_mask=use_causal)
    out = backend._numpy(out)
    return out.reshape(lead + out.shape[-2:])


def _one_mask_per_call(backend, mask, lead, heads, lq, lk):
    """The boolean mask as (*lead, Lq, Lk), one for every head (the layers'
    attention_mask has no head dim): NotImplementedError where heads differ."""
    if mask is None:
        return None
    full = np.broadcast_to(mask, lead + (heads, lq, lk))
    if not (full == full[..., :1, :, :]).all():
        raise NotImplementedError(
            f"{backend.name}: the attention_mask of keras.layers.MultiHeadAttention and "
            "GroupQueryAttention is (B, T, S), one for every head: a mask that differs "
            "between heads has no form")
    return full[..., 0, :, :]
