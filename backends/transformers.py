"""Hugging Face transformers' attention functions as backends: transformers-sdpa,
transformers-eager and transformers-flex.

Models in transformers do not call ``F.scaled_dot_product_attention`` themselves: each
attention layer calls one function of the library, picked by ``attn_implementation``.
These backends call those functions on the interface's arrays, as a model's layer does
(``(B, H, L, D)`` tensors, a small module object with ``num_key_value_groups``, the
library's own masks), and convert the result back:

- ``transformers-sdpa``: ``transformers.integrations.sdpa_attention.sdpa_attention_forward``.
  A mask is the boolean 4-D mask the library's ``sdpa_mask`` builds (True = attend);
  top-left causal alone is the function's ``is_causal`` flag, as a model passes it (the
  function then crops keys and values to the first Lq when Lk > Lq > 1, and drops the
  flag when Lq = 1); bottom-right causal is the flag where it means the same (Lq = Lk),
  else a boolean mask, as ``masking_utils`` builds it; a window is a boolean mask (the
  library's sliding-window masks); a bias is the function's ``position_bias``, which it
  merges into a float mask with ``finfo(dtype).min`` at disallowed positions. The
  function has no softcap (it raises) and no sink (gpt-oss uses eager or flex for them):
  both unsupported.
- ``transformers-eager``: the Llama family's ``eager_attention_forward``
  (``models.llama.modeling_llama``), gemma2's with a ``softcap``
  (``models.gemma2.modeling_gemma2``), gpt-oss's with a ``sink``
  (``models.gpt_oss.modeling_gpt_oss``, the sinks as the module's ``sinks``, one per
  query head). The mask is the float mask of ``masking_utils.eager_mask`` (0 where
  allowed, ``finfo(dtype).min`` elsewhere), causal and windows folded in; a bias is merged
  by ``create_position_bias_mask`` (the same fill). The weights of
  ``attention_weights`` are the function's own second output.
- ``transformers-flex``: ``transformers.integrations.flex_attention.flex_attention_forward``
  with a ``BlockMask`` for masks, causal, windows and lengths, as a model's flex masks
  are (built as torch-flex builds it: ``create_block_mask`` of a mask_mod indexing the
  boolean mask), a bias as the function's ``position_bias`` and a softcap as its
  ``softcap``, both in its score_mod. The function calls the library's singleton
  ``torch.compile(flex_attention)`` (``WrappedFlexAttention``), which on this CPU
  compiles for ~25 s each new shape, dtype and mod (over two minutes the first time):
  the singleton is given torch's eager ``flex_attention`` instead, called as torch-flex
  calls it (the same unfused computation; torch-flex-compiled certifies the fused
  kernel). A sink is refused on the CPU by the function itself ("Attention sinks cannot
  be run on CPU"), and torch refuses flex's backward on the CPU: both unsupported with
  the library's reason.

Both: ``sdpa_vjp`` is ``torch.autograd.grad`` through the same call; per-batch lengths
are a boolean mask (``rules.lengths_as_mask``), as a model's padding mask is. ``softmax``,
``scores``, ``sdpa_lse`` and the projection ops are no attention function of the library:
unsupported (the torch backend certifies torch's own).

float64 on the eager path: its softmax runs in float32 (``softmax(..., dtype=float32)``),
so float64 is left out of ``dtypes`` (``dtype_notes`` says why).
"""

from __future__ import annotations

import math
import types
import warnings

import numpy as np
import torch
import transformers
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from transformers.integrations.flex_attention import (
    WrappedFlexAttention,
    flex_attention_forward,
)
from transformers.integrations.sdpa_attention import (
    create_position_bias_mask,
    sdpa_attention_forward,
)
from transformers.models.gemma2.modeling_gemma2 import (
    eager_attention_forward as gemma2_eager_attention_forward,
)
from transformers.models.gpt_oss.modeling_gpt_oss import (
    eager_attention_forward as gpt_oss_eager_attention_forward,
)
from transformers.models.llama.modeling_llama import eager_attention_forward

from . import rules
from .torch import _TORCH_DTYPES, _mask_to_torch, _to_numpy, _to_torch
from .torch_flex import TorchFlexBackend, _collector_paused, _hop_called_directly, _mask_mod

_UNSUPPORTED_OPS = ("softmax, scores, sdpa_lse and the projection ops are no attention "
                    "function of transformers (the torch backend certifies torch's)")


def _module(groups: int, head_dim: int, sinks=None):
    """What the attention functions read of a model's attention layer."""
    return types.SimpleNamespace(num_key_value_groups=groups, head_dim=head_dim,
                                 is_causal=True, training=False, sinks=sinks)


def _fill_mask(allowed, dtype):
    """masking_utils.eager_mask's float mask: 0 where allowed, finfo(dtype).min elsewhere."""
    if allowed is None:
        return None
    return torch.where(allowed, torch.zeros((), dtype=dtype), torch.finfo(dtype).min)


def _sinks(sink, hq: int):
    """gpt-oss's module.sinks, one per query head, from the interface's sink (broadcast to
    (*batch, Hq)); a sink that differs along the batch has no gpt-oss form."""
    if any(n != 1 for n in sink.shape[:-1]):
        raise NotImplementedError("transformers-eager: gpt-oss's sinks are one per head, "
                                  "shared by the batch (module.sinks)")
    return torch.broadcast_to(sink.reshape(sink.shape[-1:]), (hq,))


class _Call:
    """One call's inputs folded to the functions' (B, H, L, D) layout."""

    def __init__(self, q, k, v, mask, bias, causal, window):
        self.layout = rules.Layout(q, k, v, mask, bias)
        self.q, self.k, self.v = self.layout.fold(q, k, v, torch.broadcast_to)
        self.bias = self.layout.scores(bias, torch.broadcast_to)
        lay = self.layout
        self.mask = self.layout.scores(mask, torch.broadcast_to)
        self.causal, self.window = causal, window
        self.module = _module(lay.hq // lay.hkv, self.q.shape[-1])

    def allowed(self, *, flag: bool):
        """The boolean mask of mask, causal and window; with flag, the causal part left to
        the function's is_causal (returns (mask, is_causal))."""
        lq, lk = self.layout.lq, self.layout.lk
        if flag and self.mask is None and self.window is None and self.causal is not None \
                and (self.causal == "top_left" or lq == lk):
            return None, True
        extra = rules.allowed(lq, lk, self.causal, self.window)
        if extra is not None:          # 4-D, as the library's masks are
            extra = _mask_to_torch(extra).reshape(1, 1, lq, lk)
        return rules.and_masks(self.mask, extra), False

    def restore(self, out):
        """The functions' (B, Lq, H, Dv) output as the interface's (*batch, H, Lq, Dv)."""
        return self.layout.restore(out.transpose(1, 2))


class _TransformersBackend:
    """What both paths share: conversion, dtypes, the ops."""

    name: str
    dtypes = frozenset(_TORCH_DTYPES)

    def __init__(self):
        self.versions = {"transformers": transformers.__version__, "torch": torch.__version__,
                         "device": "cpu"}
        self.policy = dict(self.policy)
        self.paths = dict(self.paths)

    def _inputs(self, arrays):
        name = np.dtype(np.asarray(arrays[0]).dtype).name
        if name not in self.dtypes:
            raise NotImplementedError(f"{self.name} does not support dtype {name}")
        dt = _TORCH_DTYPES[name]
        return [None if a is None else _to_torch(a, dt) for a in arrays]

    def _forward(self, q, k, v, *, mask, bias, sink, causal, scale, softcap, window):
        """(output, weights or None) of the library's function on tensors."""
        raise NotImplementedError

    @rules.lengths_as_mask
    def attention_weights(self, q, k, *, mask=None, bias=None, sink=None, causal=None,
                          scale=None, softcap=None, window=None):
        tq, tk, tb, ts = self._inputs([q, k, bias, sink])
        lk = tk.shape[-2]
        eye = torch.eye(lk, dtype=tq.dtype).expand(*tk.shape[:-2], lk, lk)  # attend(I) = P
        out, weights = self._forward(tq, tk, eye, mask=_mask_to_torch(mask), bias=tb, sink=ts,
                                     causal=causal, scale=scale, softcap=softcap,
                                     window=window)
        return _to_numpy(out if weights is None else weights)

    @rules.lengths_as_mask
    def sdpa(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
             softcap=None, window=None):
        tq, tk, tv, tb, ts = self._inputs([q, k, v, bias, sink])
        out, _ = self._forward(tq, tk, tv, mask=_mask_to_torch(mask), bias=tb, sink=ts,
                               causal=causal, scale=scale, softcap=softcap, window=window)
        return _to_numpy(out)

    @rules.lengths_as_mask
    def sdpa_vjp(self, q, k, v, d_out, *, mask=None, bias=None, sink=None, causal=None,
                 scale=None, softcap=None, window=None):
        tq, tk, tv, tb, ts, td = self._inputs([q, k, v, bias, sink, d_out])
        leaves = [t.requires_grad_() for t in (tq, tk, tv)]
        if ts is not None:
            leaves.append(ts.requires_grad_())
        out, _ = self._forward(tq, tk, tv, mask=_mask_to_torch(mask), bias=tb, sink=ts,
                               causal=causal, scale=scale, softcap=softcap, window=window)
        return tuple(_to_numpy(g) for g in torch.autograd.grad(out, leaves, td))


class TransformersSdpaBackend(_TransformersBackend):
    """transformers' sdpa_attention_forward (attn_implementation="sdpa")."""

    name = "transformers-sdpa"
    policy = {
        # a boolean mask goes to torch's SDPA, which gives a row without keys zeros
        "fully_masked_rows": "zeros",
        "neg_inf_bias_rows": "zeros",
        # an explicit mask: SDPA's math kernel reads every key
        "masked_key_nan": "propagates",
        "masked_value_nan": "propagates",
        "accumulation": "float32",
        "padded_query_rows": "zeros",
        "lse_base": "e",
    }
    policy_when = [
        # is_causal without a mask: keys and values past Lq are cropped away (never read)
        # and the flash kernel skips hidden key blocks, so a NaN behind the causal mask
        # reaches few rows (keys) or none (values)
        {"when": {"causal": True, "mask": False, "window": False, "lengths": False},
         "policy": {"masked_key_nan": "per_row", "masked_value_nan": "ignored"}},
        # position_bias: masked logits are filled with finfo(dtype).min, a finite number,
        # so a row without keys is uniform over its keys
        {"when": {"bias": True}, "policy": {"fully_masked_rows": "uniform"}},
    ]
    paths = {
        "attention_weights": "native: sdpa_attention_forward with V = identity(Lk)",
        "sdpa": "native: transformers.integrations.sdpa_attention.sdpa_attention_forward "
                "(is_causal for top-left causal as a model passes it; boolean masks for "
                "masks, windows, bottom-right causal and lengths; position_bias for a bias)",
        "sdpa_vjp": "native: torch.autograd.grad through sdpa_attention_forward",
    }

    def _forward(self, q, k, v, *, mask, bias, sink, causal, scale, softcap, window):
        if softcap is not None:
            raise NotImplementedError("transformers-sdpa: sdpa_attention_forward has no "
                                      "softcap (it raises; gemma2 uses eager for it)")
        if sink is not None:
            raise NotImplementedError("transformers-sdpa: sdpa_attention_forward has no "
                                      "attention sink (gpt-oss uses eager or flex)")
        call = _Call(q, k, v, mask, bias, causal, window)
        allowed, is_causal = call.allowed(flag=True)
        out, _ = sdpa_attention_forward(call.module, call.q, call.k, call.v, allowed,
                                        scaling=None if scale is None else float(scale),
                                        is_causal=is_causal, position_bias=call.bias)
        return call.restore(out), None


class TransformersEagerBackend(_TransformersBackend):
    """The Llama family's eager_attention_forward (attn_implementation="eager"); gemma2's
    with a softcap, gpt-oss's with a sink."""

    name = "transformers-eager"
    dtypes = frozenset({"float32", "float16", "bfloat16"})
    dtype_notes = {"float64": "eager_attention_forward computes the softmax in float32 "
                              "(softmax(..., dtype=torch.float32)) and casts back: float64 "
                              "results carry float32 rounding (~1e-7)"}
    policy = {
        # the mask is a finite fill, finfo(dtype).min: a row without keys is uniform
        "fully_masked_rows": "uniform",
        "neg_inf_bias_rows": "nan",
        "masked_key_nan": "propagates",
        "masked_value_nan": "propagates",
        "accumulation": "float32",
        "padded_query_rows": "zeros",
        "lse_base": "e",
    }
    paths = {
        "attention_weights": "native: eager_attention_forward's own weights (gemma2's with "
                             "softcap, gpt-oss's with a sink)",
        "sdpa": "native: models.llama eager_attention_forward (gemma2's with softcap, "
                "gpt-oss's with a sink); masks as eager_mask's float mask",
        "sdpa_vjp": "native: torch.autograd.grad through eager_attention_forward",
    }

    def _forward(self, q, k, v, *, mask, bias, sink, causal, scale, softcap, window):
        call = _Call(q, k, v, mask, bias, causal, window)
        allowed, _ = call.allowed(flag=False)
        if call.bias is not None:
            attention_mask = create_position_bias_mask(call.bias, allowed, False, call.q,
                                                       call.k)
        else:
            attention_mask = _fill_mask(allowed, call.q.dtype)
        scaling = 1.0 / math.sqrt(call.q.shape[-1]) if scale is None else float(scale)
        kwargs = {}
        if sink is not None:
            if softcap is not None:
                raise NotImplementedError("transformers-eager: no eager function of the "
                                          "library has both a softcap and a sink")
            call.module.sinks = _sinks(sink, call.layout.hq)
            function = gpt_oss_eager_attention_forward
        elif softcap is not None:
            function, kwargs = gemma2_eager_attention_forward, {"softcap": float(softcap)}
        else:
            function = eager_attention_forward
        out, weights = function(call.module, call.q, call.k, call.v, attention_mask,
                                scaling=scaling, **kwargs)
        return call.restore(out), call.layout.restore(weights)


class TransformersFlexBackend(_TransformersBackend):
    """transformers' flex_attention_forward (attn_implementation="flex_attention"), with
    torch's eager flex_attention in place of the library's compiled one."""

    name = "transformers-flex"
    # flex_attention's own choices, as torch-flex declares them: a row without keys is 0,
    # a NaN key behind the BlockMask is never scored, a NaN value meets a weight of 0
    policy = TorchFlexBackend.policy
    paths = {
        "attention_weights": "native: flex_attention_forward with V = identity(Lk)",
        "sdpa": "native: transformers.integrations.flex_attention.flex_attention_forward "
                "(a BlockMask for masks, causal, windows and lengths; position_bias for a "
                "bias; softcap), its compiled flex_attention swapped for torch's eager one",
        "sdpa_vjp": "native: torch.autograd.grad through flex_attention_forward (torch "
                    "refuses flex's backward on the CPU)",
    }

    def __init__(self):
        super().__init__()
        self.versions["flex_attention"] = "eager"
        # the library's singleton, built as a model's first call builds it (training
        # False), holds torch's eager flex_attention: no compile for any shape
        WrappedFlexAttention(False)._compiled_flex_attention = flex_attention

    def _forward(self, q, k, v, *, mask, bias, sink, causal, scale, softcap, window):
        call = _Call(q, k, v, mask, bias, causal, window)
        b, hq, lq, lk = call.layout.b, call.layout.hq, call.layout.lq, call.layout.lk
        allowed, _ = call.allowed(flag=False)
        block_mask = None
        if allowed is not None:
            full = allowed.expand(b, hq, lq, lk)
            block_mask = create_block_mask(_mask_mod(full, None), b, hq, lq, lk,
                                           device=call.q.device)
        bias = None if call.bias is None else call.bias.expand(b, hq, lq, lk)
        direct = not any(t.requires_grad for t in (call.q, call.k, call.v))
        try:
            with warnings.catch_warnings(), _collector_paused(), _hop_called_directly(direct):
                warnings.filterwarnings("ignore", message="flex_attention called without")
                out, _ = flex_attention_forward(  # s_aux: refused on the CPU
                    call.module, call.q, call.k, call.v, block_mask,
                    scaling=None if scale is None else float(scale),
                    softcap=None if softcap is None else float(softcap),
                    s_aux=sink, position_bias=bias)
        except ValueError as e:
            if "Attention sinks cannot be run on CPU" in str(e):
                raise NotImplementedError(f"{self.name}: {e}") from None
            raise
        return call.restore(out), None
