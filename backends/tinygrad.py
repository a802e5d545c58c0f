"""tinygrad backend: a thin adapter from the attention interface to tinygrad's own ops, on
its CPU device (kernels written as C and compiled by clang, once per shape and dtype).

NumPy arrays become tinygrad tensors, tinygrad's op is called, and the result comes back
as a fresh NumPy array of the input dtype.

Path of each op (also in ``TinygradBackend.paths``):

- ``sdpa``: native ``Tensor.scaled_dot_product_attention`` on ``(B, H, L, D)`` tensors
  (batch dims broadcast and flattened with tinygrad's ``expand`` and ``reshape``;
  grouped-query heads with its ``enable_gqa``). It has no ``scale`` argument and divides
  the logits by ``sqrt(Dk)``: a case's own scale is given by pre-scaling q, ``q *
  (scale * sqrt(Dk))`` rounded once to q's dtype (docs/adding-a-backend.md, "What an
  adapter may do"). Top-left causal alone is its ``is_causal``; any other mix of mask,
  causal, window and bias is its one ``attn_mask`` (``rules``): bool without a bias, else
  the bias with ``-inf`` where a key is disallowed. No softcap and no sink: unsupported.
- ``attention_weights``: the same call with ``V = identity(Lk)``.
- ``sdpa_vjp``: tinygrad's autograd (``Tensor.gradient``) through exactly the ``sdpa``
  path; the broadcast batch dims and the kv heads of a group are summed by it (``expand``
  and ``repeat_interleave`` are in the graph), and dq is times the pre-scaling factor
  (the chain rule of the one product made outside tinygrad), rounded once.
- ``softmax``: native ``Tensor.softmax``.

Per-batch lengths, packed documents and block masks go through ``rules.lengths_as_mask``.

What tinygrad computes: ``q @ kᵀ`` accumulates in float32 for float16 (float64 for
float64), the logits are divided by ``sqrt(Dk)`` and the mask added there, then they
are cast to q's dtype; the softmax (its sum in float32) and ``P @ V`` (accumulated in
float32) follow in q's dtype. bfloat16 is not declared: clang 14 (Debian 12's), the
compiler of the CPU device, refuses ``__bf16`` for the target tinygrad compiles for.

Findings (backends/expected_failures/tinygrad.yaml, reproduced directly in
tests/backends/test_tinygrad_findings.py): a softmax over a single key is folded to 1,
so a query whose one key is masked gets that key's value instead of NaN.

Cost: tinygrad schedules, writes and compiles the kernels of every new shape, dtype and
call form (~0.5 CPU s for ``sdpa``, ~1.3 for ``sdpa_vjp``, clang's compiles about a
third of it; tinygrad keeps the compiled kernels in its ``CACHEDB``), so the tox
environment certifies float32 alone.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import shutil

import numpy as np

from . import rules

_DTYPES = frozenset({"float64", "float32", "float16"})


def _tensor_class():
    """tinygrad's Tensor, imported when the backend is built, compiling in
    this process: tinygrad's default is a pool of spawned workers, each importing
    tinygrad again and replaced after 16 kernels, which on the spec's small calls costs
    more CPU than the compiles it spreads (PARALLEL, unless the environment sets it)."""
    os.environ.setdefault("PARALLEL", "0")
    from tinygrad import Tensor

    return Tensor


class TinygradBackend:
    """tinygrad's scaled_dot_product_attention, softmax and autograd on its CPU device."""

    name = "tinygrad"
    dtypes = _DTYPES
    dtype_notes = {"bfloat16": "the CPU device compiles its kernels with clang, and clang "
                               "14 (Debian 12's) refuses __bf16 for the target tinygrad "
                               "compiles for: no bfloat16 kernel builds there"}
    policy = {
        # a bool mask becomes -inf, added to the logits: an empty row is -inf - -inf = NaN
        "fully_masked_rows": "nan",
        "neg_inf_bias_rows": "nan",
        # the mask is added to the logits, so a NaN logit stays NaN, and P @ V reads every V
        "masked_key_nan": "propagates",
        "masked_value_nan": "propagates",
        # q @ kᵀ, the softmax's sum and P @ V accumulate in float32 for float16 (the
        # logits and P are rounded to float16 between them)
        "accumulation": "float32",
        "padded_query_rows": "zeros",
    }
    paths = {
        "sdpa": "native: Tensor.scaled_dot_product_attention (is_causal for top-left "
                "causal; bottom-right causal, windows, masks and bias as one attn_mask; "
                "enable_gqa; scale by pre-scaling q)",
        "attention_weights": "native: Tensor.scaled_dot_product_attention with "
                             "V = identity(Lk)",
        "sdpa_vjp": "native: tinygrad's autograd (Tensor.gradient) of "
                    "Tensor.scaled_dot_product_attention",
        "softmax": "native: Tensor.softmax",
    }

    def __init__(self):
        compiler = os.environ.get("CC", "clang")
        if shutil.which(compiler) is None:
            raise RuntimeError(f"tinygrad's CPU device compiles its kernels with {compiler}, "
                               "which is not installed (apt-get install clang)")
        self.Tensor = _tensor_class()
        self.versions = {"tinygrad": importlib.metadata.version("tinygrad"), "device": "CPU",
                         "numpy": np.__version__}
        self.policy = dict(self.policy)
        self.paths = dict(self.paths)

    # ------------------------------------------------------------ conversions

    def _check(self, a, softcap=None, sink=None):
        name = np.dtype(np.asarray(a).dtype).name
        if name not in self.dtypes:
            raise NotImplementedError(f"tinygrad does not support dtype {name}")
        if softcap is not None:
            raise NotImplementedError("tinygrad: Tensor.scaled_dot_product_attention has no "
                                      "softcap")
        if sink is not None:
            raise NotImplementedError("tinygrad: Tensor.scaled_dot_product_attention has no "
                                      "attention sink")

    def _tensor(self, a):
        return None if a is None else self.Tensor(np.array(a, copy=True), device="CPU")

    @staticmethod
    def _numpy(t, dtype):
        return np.array(t.numpy(), dtype=dtype, copy=True)

    # ------------------------------------------------------------ the call

    def _prescaled(self, q, scale):
        """(q for tinygrad, the factor): tinygrad divides the logits by sqrt(Dk), so a
        given scale is q * (scale * sqrt(Dk)), rounded once to q's dtype; None keeps q."""
        q = np.asarray(q)
        if scale is None:
            return q, None
        factor = float(scale) * math.sqrt(q.shape[-1])
        return (q.astype(np.float64) * factor).astype(q.dtype), factor

    def _attn_mask(self, layout, mask, bias, causal, window, dtype):
        """(attn_mask, is_causal) for scaled_dot_product_attention."""
        lq, lk = layout.lq, layout.lk
        if (mask is None and bias is None and window is None
                and (causal == "top_left" or (causal is not None and lq == lk))):
            return None, True
        allowed = rules.and_masks(layout.scores(mask, np.broadcast_to),
                                  rules.allowed(lq, lk, causal, window))
        bias = layout.scores(bias, np.broadcast_to)
        if bias is None:
            return allowed, False
        if allowed is None:
            return bias, False
        return np.where(allowed, bias, np.array(-np.inf, dtype=dtype)), False

    def _attend(self, layout, q, k, v, attn_mask, is_causal):
        """scaled_dot_product_attention of tinygrad tensors of the interface's shapes,
        folded to (B, H, L, D) by tinygrad's own expand and reshape, and back."""
        expand = lambda t, shape: t.expand(shape)   # noqa: E731 (Layout's broadcast_to)
        tq, tk, tv = layout.fold(q, k, v, expand)
        out = tq.scaled_dot_product_attention(tk, tv, attn_mask=self._tensor(attn_mask),
                                              is_causal=is_causal,
                                              enable_gqa=layout.hq != layout.hkv)
        return layout.restore(out)

    def _inputs(self, q, k, v, mask, bias, causal, window, scale):
        dtype = np.asarray(q).dtype
        layout = rules.Layout(q, k, v, mask, bias)
        q, factor = self._prescaled(q, scale)
        attn_mask, is_causal = self._attn_mask(layout, mask, bias, causal, window, dtype)
        return layout, (q, k, v), attn_mask, is_causal, factor

    # ------------------------------------------------------------ the interface

    def softmax(self, x, axis=-1):
        self._check(x)
        return self._numpy(self._tensor(x).softmax(axis), np.asarray(x).dtype)

    @rules.lengths_as_mask
    def attention_weights(self, q, k, *, mask=None, bias=None, sink=None, causal=None,
                          scale=None, softcap=None, window=None):
        return self.sdpa(q, k, rules.identity_values(q, k), mask=mask, bias=bias, sink=sink, causal=causal,
                         scale=scale, softcap=softcap, window=window)

    @rules.lengths_as_mask
    def sdpa(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
             softcap=None, window=None):
        self._check(q, softcap, sink)
        layout, qkv, attn_mask, is_causal, _ = self._inputs(q, k, v, mask, bias, causal,
                                                            window, scale)
        out = self._attend(layout, *(self._tensor(x) for x in qkv), attn_mask, is_causal)
        return self._numpy(out, np.asarray(q).dtype)

    @rules.lengths_as_mask
    def sdpa_vjp(self, q, k, v, d_out, *, mask=None, bias=None, sink=None, causal=None,
                 scale=None, softcap=None, window=None):
        self._check(q, softcap, sink)
        layout, qkv, attn_mask, is_causal, factor = self._inputs(q, k, v, mask, bias,
                                                                 causal, window, scale)
        leaves = [self._tensor(x) for x in qkv]
        out = self._attend(layout, *leaves, attn_mask, is_causal)
        d_out = np.broadcast_to(np.asarray(d_out), out.shape)
        grads = out.gradient(*leaves, gradient=self._tensor(d_out))
        grads[0].realize(*grads[1:])       # one schedule for the three, not one each
        dq, dk, dv = (self._numpy(g, np.asarray(x).dtype) for g, x in zip(grads, qkv))
        if factor is not None:   # d(q * factor)/dq
            dq = (dq.astype(np.float64) * factor).astype(dq.dtype)
        return dq, dk, dv
