"""PyTorch's FlexAttention as a backend: torch-flex.

``torch.nn.attention.flex_attention.flex_attention`` takes the score pipeline as code:
a ``score_mod(score, b, h, q_idx, kv_idx)`` edits each scaled score and a
``mask_mod(b, h, q_idx, kv_idx)`` (compiled into a ``BlockMask`` by
``create_block_mask``) says which keys a query may see. The adapter maps the spec onto
them and calls nothing else:

- ``score_mod``: softcap ``c * tanh(s / c)``, then ``+ bias[b, h, q_idx, kv_idx]`` (the
  spec's order: scale, softcap, bias, mask; flex applies ``scale`` before score_mod);
- ``mask_mod``: the keys causal and window allow (``rules.allowed``, a (Lq, Lk) tensor
  indexed at ``[q_idx, kv_idx]``) and the boolean mask ``mask[b, h, q_idx, kv_idx]``,
  and-ed;
- grouped-query through ``enable_gqa=True``; Dv != Dk is native.

Inputs are brought to flex's (B, H, L, D) layout (rank 2 and 3 get leading 1s, batch
dims beyond one are flattened into B); flex takes no mask or bias tensor, so the adapter
broadcasts them to (B, Hq, Lq, Lk) itself, under NumPy rules, for the mods to index.

- ``sdpa``, ``self_attention`` (projections with ``torch.matmul``) and
  ``multi_head_attention`` (projections, head split, ``w_o`` with torch ops, every head
  through flex) call flex_attention;
- ``attention_weights``: flex_attention with V = identity(Lk), whose output is P itself
  with flex's own masking;
- ``sdpa_vjp``: ``torch.autograd.grad`` through flex_attention. On the CPU, torch 2.13
  refuses it ("FlexAttention does not support backward on CPU"), so those tests are
  unsupported there with torch's reason; on CUDA it runs.
- ``sdpa_lse``: flex_attention with ``return_aux=AuxRequest(lse=True)``, its own lse
  (-inf on a row without keys); a ``sink`` (flex has none) is folded in around that lse:
  ``lse' = logaddexp(lse, sink)``, ``out' = out exp(lse - lse')``, for attention_weights,
  sdpa, sdpa_lse and sdpa_vjp;
- ``softmax`` and ``scores`` call no flex_attention: unsupported (the torch backend
  certifies them).

Eager or compiled: by default flex_attention runs eagerly (torch's unfused reference
path, which materialises the scores; torch warns once that it is not compiled). With
``compiled=True`` (the built-in ``torch-flex-compiled``) it runs
``torch.compile(flex_attention)``, the fused kernel; on this project's CPU that costs
about 6 s for each new shape (30 s for the first), and the spec has over a thousand
shapes, so the whole spec takes hours compiled. ``paths`` says which one ran.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import warnings

import numpy as np

import torch
import torch.nn.attention.flex_attention as flex_module
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

from . import rules
from .torch import TorchBackend, _broadcast, _is_gqa, _mask_to_torch, _to_4d


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector paused for one call (refcounting still frees).
    Eager flex_attention allocates thousands of small Python objects a call (vmap,
    pytrees), which keeps triggering collections of torch's large heap: 50 ms a call
    with the collector, 7 ms without, on the spec's tiny inputs."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def _hop_called_directly(direct: bool):
    """Eager flex_attention, forward only: the same flex_attention_hop (and so the same
    unfused computation, bit for bit), called directly rather than through the
    ``torch.compile(backend="eager")`` wrapper flex puts around it, which traces again
    with dynamo for every new shape, dtype and mod (0.4-0.9 s each; the spec has
    thousands: half an hour instead of a minute). The switch is flex's own,
    ``_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG``, named in its warning; it is set only for
    the call, and never for a backward (where flex needs the wrapper)."""
    if not direct:
        yield
        return
    was = flex_module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG
    flex_module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    try:
        yield
    finally:
        flex_module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = was


def _score_mod(softcap, bias):
    if softcap is None and bias is None:
        return None

    def score_mod(score, b, h, q_idx, kv_idx):
        if softcap is not None:
            score = softcap * torch.tanh(score / softcap)
        if bias is not None:
            score = score + bias[b, h, q_idx, kv_idx]
        return score

    return score_mod


def _mask_mod(mask, allowed, documents=None, blocks=None):
    """flex's mask_mod: the keys causal and window allow (rules.allowed, (Lq, Lk)), the
    boolean mask (B, H, Lq, Lk), flex's document mask (documents: the query and key
    document ids, (B, Lq) and (B, Lk): ``q_doc[b, q_idx] == kv_doc[b, kv_idx]``) and the
    block-sparse mask (blocks: (B, H, Lq / Bq, Lk / Bk) and the block size (Bq, Bk)),
    and-ed; None when there is none of them."""
    if mask is None and allowed is None and documents is None and blocks is None:
        return None

    def mask_mod(b, h, q_idx, kv_idx):
        keep = []
        if allowed is not None:
            keep.append(allowed[q_idx, kv_idx])
        if mask is not None:
            keep.append(mask[b, h, q_idx, kv_idx])
        if documents is not None:
            keep.append(documents[0][b, q_idx] == documents[1][b, kv_idx])
        if blocks is not None:
            table, (size_q, size_k) = blocks
            keep.append(table[b, h, q_idx // size_q, kv_idx // size_k])
        result = keep[0]
        for more in keep[1:]:
            result = result & more
        return result

    return mask_mod


def _document_ids(ids, batch: int):
    """Segment ids (L,) or (B0, L) as a (batch, L) tensor of flex's flattened batch (each
    row of dim 0 repeated over the batch dims after it)."""
    ids = np.asarray(ids, dtype=np.int64)
    ids = np.broadcast_to(ids, (batch,) + ids.shape) if ids.ndim == 1 else \
        np.repeat(ids, batch // ids.shape[0], axis=0)
    return torch.from_numpy(np.ascontiguousarray(ids)).to(torch.get_default_device())


def _structure_native(method):
    """Take the segment ids and the block mask out of the call to the inherited op, for
    _attend to give flex as its own forms (the document mask_mod; a BlockMask of the
    given block size), not folded into a dense mask."""
    @functools.wraps(method)
    def wrapper(self, *args, **params):
        structure = {n: params.pop(n) for n in rules.STRUCTURE if n in params}
        if not structure:
            return method(self, *args, **params)
        for pair in (("q_segment_ids", "kv_segment_ids"), ("block_mask", "block_size")):
            if (structure.get(pair[0]) is None) != (structure.get(pair[1]) is None):
                raise ValueError(f"{pair[0]} and {pair[1]} are given together")
        self._structure = structure
        try:
            return method(self, *args, **params)
        finally:
            self._structure = None
    return wrapper


class TorchFlexBackend(TorchBackend):
    """The attention interface on torch.nn.attention.flex_attention (eager by default)."""

    name = "torch-flex"
    compiled = False
    mha_module = False
    cpu_invariants = ("deterministic", "batch_invariant")

    def _lse_path(self, sink):
        """flex's own lse; a sink folded in around it: lse' = logaddexp(lse, sink) and
        out' = out exp(lse - lse') (flex has no sink: composed on its native lse)."""
        def path(q, k, v, *, sink=None, **params):
            out, lse = self._attend(q, k, v, lse=True, **params)
            if sink is None:
                return out, lse
            column = sink[..., None].to(lse.dtype).expand(lse.shape)
            total = torch.logaddexp(lse, column)
            return out * torch.exp(lse - total)[..., None], total
        return path
    # Determined on torch 2.13 (CPU, eager): a row whose keys are all masked, or whose
    # scores are all -inf, gets output 0 (flex's safe softmax); flex evaluates mask_mod
    # on the scores, so a NaN key at a masked position is replaced, while a NaN value
    # still meets a weight of 0 in P @ V, and 0 * NaN = NaN.
    policy = {
        "fully_masked_rows": "zeros",
        "neg_inf_bias_rows": "zeros",
        "masked_key_nan": "ignored",
        "masked_value_nan": "propagates",
        "accumulation": "float32",
        # a padded query (past q_lengths) gets output, weight and dq rows of 0
        "padded_query_rows": "zeros",
        # every lse it returns or takes is a natural log
        "lse_base": "e",
    }
    #: the same choices on every call path (not the torch backend's causal condition)
    policy_when = []

    def __init__(self, device=None, compiled=None):
        super().__init__(device)
        if compiled is not None:
            self.compiled = bool(compiled)
        if self.compiled:
            # every shape is a new graph: never let dynamo give up and run eagerly instead
            torch._dynamo.config.cache_size_limit = max(
                torch._dynamo.config.cache_size_limit, 100_000)
            torch._dynamo.config.accumulated_cache_size_limit = max(
                torch._dynamo.config.accumulated_cache_size_limit, 100_000)
            self._flex = torch.compile(flex_attention, fullgraph=True)
            how = "torch.compile(flex_attention, fullgraph=True) (the fused kernel)"
        else:
            self._flex = flex_attention
            how = "flex_attention eagerly (torch's unfused reference path)"
        on = f"{how} on {self.device}"
        mods = "score_mod: softcap, bias; BlockMask from mask_mod: causal, window, mask, " \
               "documents (q_segment_ids, kv_segment_ids), block_mask (BLOCK_SIZE = " \
               "block_size); enable_gqa"
        self.versions["flex_attention"] = "compiled" if self.compiled else "eager"
        self.paths = {
            "softmax": "not run: calls no flex_attention (the torch backend certifies it)",
            "scores": "not run: calls no flex_attention (the torch backend certifies it)",
            "attention_weights": f"native: {on} with V = identity(Lk) ({mods})",
            "sdpa": f"native: {on} ({mods})",
            "sdpa_lse": f"native: {on} with return_aux=AuxRequest(lse=True); a sink composed "
                        "around it (lse' = logaddexp(lse, sink), out' = out exp(lse - lse'):"
                        " flex has no sink)",
            "sdpa_vjp": f"native: torch.autograd.grad through {on} (torch refuses flex's "
                        "backward on the CPU)",
            "self_attention": f"composed projections (torch.matmul), then {on}",
            "multi_head_attention": f"composed projections, heads and w_o (torch ops) "
                                    f"around {on}",
        }

    # ------------------------------------------------------------ the flex path

    def _attend(self, q, k, v, *, mask=None, bias=None, causal=None, scale=None,
                softcap=None, window=None, lse=False):
        """flex_attention's output (and, with lse, its log-sum-exp: AuxRequest(lse=True))."""
        allowed = _mask_to_torch(rules.allowed(q.shape[-2], k.shape[-2], causal, window))
        if softcap is not None and softcap <= 0:
            raise ValueError(f"softcap must be positive, got {softcap}")
        gqa = _is_gqa(q, k)
        q, k, v = _broadcast(q, k, v, mask, bias, gqa)
        rank = max(q.dim(), 4)
        lead = q.shape[:-3] if q.dim() > 3 else ()
        out_shape = (*q.shape[:-1], v.shape[-1])
        q4, k4, v4 = (_to_4d(t, rank, lead) for t in (q, k, v))
        b, hq, lq, _ = q4.shape
        lk = k4.shape[-2]
        full = (b, hq, lq, lk)     # flex's mods index the scores' own (b, h, q, kv)
        mask4 = None if mask is None else _to_4d(mask, rank, lead).expand(full)
        bias4 = None if bias is None else _to_4d(bias, rank, lead).expand(full)
        structure = self._structure or {}
        documents = None if structure.get("q_segment_ids") is None else \
            tuple(_document_ids(structure[n], b) for n in ("q_segment_ids", "kv_segment_ids"))
        blocks, sizes = None, {}
        if structure.get("block_mask") is not None:
            table = torch.from_numpy(np.asarray(structure["block_mask"]) != 0)
            table = _to_4d(table.to(q4.device), rank, lead)
            blocks = (table.expand(b, hq, *table.shape[-2:]), tuple(structure["block_size"]))
            sizes = {"BLOCK_SIZE": blocks[1]}      # flex's BlockMask of the spec's blocks
        mask_mod = _mask_mod(mask4, allowed, documents, blocks)
        block_mask = None
        if mask_mod is not None:
            batched = any(x is not None for x in (mask4, documents, blocks))
            block_mask = create_block_mask(mask_mod, b if batched else None,
                                           hq if batched else None, lq, lk,
                                           device=q4.device, **sizes)
        score_mod = _score_mod(None if softcap is None else float(softcap), bias4)
        direct = not self.compiled and not any(t.requires_grad for t in (q4, k4, v4))
        with warnings.catch_warnings(), _collector_paused(), _hop_called_directly(direct):
            # eager flex warns (once) that it is not compiled: paths says so already
            warnings.filterwarnings("ignore", message="flex_attention called without")
            aux = {"return_aux": AuxRequest(lse=True)} if lse else {}
            out = self._flex(q4, k4, v4, score_mod=score_mod, block_mask=block_mask,
                             scale=None if scale is None else float(scale),
                             enable_gqa=gqa, **aux)
        if lse:
            out, extra = out
            return out.reshape(out_shape), extra.lse.reshape(out_shape[:-1]).to(out.dtype)
        return out.reshape(out_shape)

    # ------------------------------------------------------------ operations

    _structure = None         # the segment ids and block mask of the call running
    attention_weights = _structure_native(TorchBackend.attention_weights)
    sdpa = _structure_native(TorchBackend.sdpa)
    sdpa_vjp = _structure_native(TorchBackend.sdpa_vjp)

    def softmax(self, x, axis=-1):
        raise NotImplementedError(f"{self.name}: softmax calls no flex_attention "
                                  "(certified by the torch backend)")

    def scores(self, q, k, *, kind, scale=None, w=None, u=None, v=None):
        raise NotImplementedError(f"{self.name}: scores call no flex_attention "
                                  "(certified by the torch backend)")


class TorchFlexCompiledBackend(TorchFlexBackend):
    """torch-flex with ``torch.compile(flex_attention)``: the fused kernel (slow to
    compile on the CPU: certify a subset there, with -k)."""

    name = "torch-flex-compiled"
    compiled = True
    cpu_invariants = ()       # the fused kernel's bits are not checked here
