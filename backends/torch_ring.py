"""Ring attention over torch.distributed: the `torch-ring` backend (sharded cases only).

Each rank holds its shard of the sequence (docs/interface.md, "Sharded cases": its
queries and keys at the global positions ``shard["q_positions"][rank]`` and
``shard["kv_positions"][rank]``). Over W steps the key/value blocks travel around the
ring (``torch.distributed.batch_isend_irecv`` to rank + 1, from rank - 1); at each step a
rank attends its queries to the block it holds with the torch backend's own sdpa_lse
(its composed kernel on tensors, the mask of the block from the global positions: causal,
window, and the packed documents' ids and the block mask, which every rank receives for
the whole sequence and reads at those positions, rules.shard_allowed), skips
a block no query of its may see, and merges the block's partial state into its own
through their log-sum-exp. The backward pass travels the ring again: each block's
gradients follow from the block's sdpa_lse by autograd, weighted by the block's share of
the global softmax, and dK/dV accumulate as they travel, home after the last step.

Half-precision inputs are computed in float32 (the merge's state too) and rounded once.
A call without ``shard`` (a single-device case) is unsupported: the torch backend
certifies that arithmetic.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.distributed as dist

from . import rules
from .torch import TorchBackend, _to_numpy, _to_torch


def _rotate(tensors, rank: int, world: int) -> list:
    """Each tensor sent to rank + 1 and its like received from rank - 1 (one batch)."""
    received = [torch.empty_like(t) for t in tensors]
    ops = [dist.P2POp(dist.isend, t.contiguous(), (rank + 1) % world) for t in tensors]
    ops += [dist.P2POp(dist.irecv, t, (rank - 1) % world) for t in received]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return received


class TorchRingBackend:
    """Ring attention, one rank per process of a torch.distributed (gloo) group."""

    name = "torch-ring"
    dtypes = frozenset({"float64", "float32", "float16", "bfloat16"})
    distributed = "torch.distributed"
    policy = {
        "fully_masked_rows": "zeros",
        "neg_inf_bias_rows": "zeros",
        "masked_key_nan": "per_row",     # a block no query sees is skipped
        "masked_value_nan": "propagates",
        "accumulation": "float32",
        "padded_query_rows": "zeros",
        "lse_base": "e",              # the lse it returns, merged around the ring: natural logs
    }
    versions = {"torch": torch.__version__, "device": "cpu", "process group": "gloo"}
    paths = {
        "sdpa": "composed: ring over torch.distributed (batch_isend_irecv), each block by "
                "the torch backend's sdpa_lse, merged through the lse",
        "sdpa_lse": "composed: as sdpa, with the merged lse",
        "sdpa_vjp": "composed: a second ring; autograd through each block's sdpa_lse, dK/dV "
                    "accumulated as they travel",
    }

    def __init__(self, device=None):
        self.kernel = TorchBackend(device)
        self.block_lse = self.kernel._lse_path(None)    # the torch backend's sdpa_lse, on tensors
        self._warm_up()

    def _warm_up(self) -> None:
        """One tiny block forward and backward here, so that the ranks forked from this
        process inherit what torch loads at its first autograd call (~3 s in every rank)."""
        leaves = [torch.ones(1, 2, 2, requires_grad=True) for _ in range(3)]
        out, lse = self.block_lse(*leaves, mask=torch.ones(2, 2, dtype=torch.bool))
        torch.autograd.grad((out, lse), leaves, (torch.ones_like(out), torch.ones_like(lse)))

    # ------------------------------------------------------------------ the interface
    def sdpa(self, q, k, v, *, causal=None, scale=None, softcap=None, window=None,
             q_segment_ids=None, kv_segment_ids=None, block_mask=None, block_size=None,
             shard=None):
        ring = self._ring(shard, q, k, causal, window, q_segment_ids=q_segment_ids,
                          kv_segment_ids=kv_segment_ids, block_mask=block_mask,
                          block_size=block_size)
        return self._numpy(self._forward(ring, *self._tensors(q, k, v), scale, softcap)[0], q)

    def sdpa_lse(self, q, k, v, *, causal=None, scale=None, softcap=None, window=None,
                 shard=None):
        ring = self._ring(shard, q, k, causal, window)
        out, lse = self._forward(ring, *self._tensors(q, k, v), scale, softcap)
        return self._numpy(out, q), _to_numpy(lse)     # float32 beside half: computed in it

    def sdpa_vjp(self, q, k, v, d_out, *, causal=None, scale=None, softcap=None, window=None,
                 q_segment_ids=None, kv_segment_ids=None, block_mask=None, block_size=None,
                 shard=None):
        ring = self._ring(shard, q, k, causal, window, q_segment_ids=q_segment_ids,
                          kv_segment_ids=kv_segment_ids, block_mask=block_mask,
                          block_size=block_size)
        tq, tk, tv, tdo = self._tensors(q, k, v, d_out)
        out, lse = self._forward(ring, tq, tk, tv, scale, softcap)
        grads = self._backward(ring, tq, tk, tv, tdo, out, lse, scale, softcap)
        return tuple(self._numpy(g, q) for g in grads)

    # ------------------------------------------------------------------ the ring
    def _ring(self, shard, q, k, causal, window, **structure) -> dict:
        """The call's place in the ring; `structure` holds the documents and the block
        mask, whole-sequence params read at the global positions (rules.shard_allowed)."""
        if shard is None:
            raise NotImplementedError("torch-ring computes sharded cases only (the torch "
                                      "backend certifies the single-device arithmetic)")
        rules.check_causal(causal)
        rank, world = shard["rank"], shard["world_size"]
        if not dist.is_initialized() or dist.get_world_size() != world:
            raise RuntimeError(f"rank {rank} is in no torch.distributed group of {world}")
        lq = sum(len(p) for p in shard["q_positions"])
        lk = sum(len(p) for p in shard["kv_positions"])
        return {"rank": rank, "world": world, "shard": shard, "lq": lq, "lk": lk,
                "causal": causal, "window": window, "ndim": max(q.ndim, k.ndim),
                "structure": {n: a for n, a in structure.items() if a is not None}}

    def _visits(self, ring) -> list[int]:
        """The ranks whose key/value block this rank holds at each step, in order."""
        return [(ring["rank"] - step) % ring["world"] for step in range(ring["world"])]

    def _allowed(self, ring, source: int) -> np.ndarray:
        """Bool (..., n_q, n_kv), broadcastable to the block's scores: which of this rank's
        queries may see which keys of `source`'s block, from their global positions."""
        shard = ring["shard"]
        keep = rules.shard_allowed(shard, source, ring["ndim"], causal=ring["causal"],
                                   window=ring["window"], **ring["structure"])
        if keep is None:
            return np.ones((len(shard["q_positions"][ring["rank"]]),
                            len(shard["kv_positions"][source])), dtype=bool)
        return keep

    def _skips(self, ring, source: int, allowed: np.ndarray) -> bool:
        """Whether the block is skipped: no query of this rank may see any of its keys."""
        return not allowed.any()

    def _merge(self, out, lse, block_out, block_lse):
        """Two partial states (outputs normalised by their own lse) merged through the
        natural log-sum-exp; a row empty in both stays (0, -inf)."""
        merged = torch.logaddexp(lse, block_lse)
        safe = torch.where(torch.isfinite(merged), merged, torch.zeros_like(merged))
        return (torch.exp(lse - safe)[..., None] * out
                + torch.exp(block_lse - safe)[..., None] * block_out), merged

    def _forward(self, ring, q, k, v, scale, softcap):
        out = torch.zeros(*np.broadcast_shapes(q.shape[:-1], v.shape[:-3] + q.shape[-3:-1]),
                          v.shape[-1], dtype=q.dtype)
        lse = torch.full(out.shape[:-1], -math.inf, dtype=q.dtype)
        for step, source in enumerate(self._visits(ring)):
            if step:
                k, v = _rotate([k, v], ring["rank"], ring["world"])
            allowed = self._allowed(ring, source)
            if self._skips(ring, source, allowed):
                continue
            block_out, block_lse = self.block_lse(q, k, v, mask=torch.from_numpy(allowed),
                                                  scale=scale, softcap=softcap)
            out, lse = self._merge(out, lse, block_out, block_lse)
        return out, lse

    #: whether dK and dV travel with their block and come home summed over every rank
    reduces_kv_grads = True

    def _backward(self, ring, q, k, v, d_out, out, lse, scale, softcap):
        rank, world = ring["rank"], ring["world"]
        dq = torch.zeros_like(q)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        own = None
        delta = (d_out * out).sum(-1)                  # rowsum(dO * O) of the global output
        for step, source in enumerate(self._visits(ring)):
            if step:
                k, v, dk, dv = _rotate([k, v, dk, dv], rank, world)
            allowed = self._allowed(ring, source)
            if not self._skips(ring, source, allowed):
                grads = self._block_grads(q, k, v, d_out, lse, delta, allowed, scale, softcap)
                dq, dk, dv = dq + grads[0], dk + grads[1], dv + grads[2]
            if step == 0:
                own = (dk, dv)
        if not self.reduces_kv_grads:
            return dq, *own
        if world > 1:
            dk, dv = _rotate([dk, dv], rank, world)     # each block's sums go home
        return dq, dk, dv

    def _block_grads(self, q, k, v, d_out, lse, delta, allowed, scale, softcap):
        """dq, dk, dv of one block: autograd through the block's sdpa_lse, upstream the
        block's share of the global softmax (w = exp(lse_b - lse)): dO_b = w dO and
        dlse_b = w (rowsum(dO * O_b) - rowsum(dO * O)). A row that sees no key of the block
        sees all of them here, with upstream 0 (no NaN from an empty logsumexp)."""
        seen = torch.from_numpy(allowed.any(-1))
        mask = torch.from_numpy(allowed) | ~seen[..., None]
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        with torch.enable_grad():
            block_out, block_lse = self.block_lse(*leaves, mask=mask, scale=scale,
                                                  softcap=softcap)
        live = seen & torch.isfinite(lse)
        safe = torch.where(live, lse, torch.zeros_like(lse))
        weight = torch.where(live, torch.exp(block_lse.detach() - safe), torch.zeros_like(lse))
        block_delta = (d_out * block_out.detach()).sum(-1)
        upstream = (weight[..., None] * d_out, weight * (block_delta - delta))
        return torch.autograd.grad((block_out, block_lse), leaves, upstream)

    # ------------------------------------------------------------------ conversion
    def _tensors(self, *arrays) -> list[torch.Tensor]:
        """Torch tensors of the inputs, half precision widened to float32."""
        tensors = [_to_torch(a) for a in arrays]
        return [t.float() if t.dtype in (torch.float16, torch.bfloat16) else t
                for t in tensors]

    @staticmethod
    def _numpy(t: torch.Tensor, like: np.ndarray) -> np.ndarray:
        wanted = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(like.dtype.name)
        return _to_numpy(t.to(wanted) if wanted is not None else t)
