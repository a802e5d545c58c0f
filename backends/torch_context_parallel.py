"""PyTorch's own context parallelism on CUDA: the `torch-context-parallel` backend
(sharded cases only; ``distributed = "torch.distributed"``).

Prepared without a GPU and unverified on hardware. On the CPU,
``torch.distributed.tensor.experimental.context_parallel`` does not run (SDPA takes its
CPU flash kernel, which has no DTensor sharding strategy:
tests/backends/test_context_parallel_cpu.py reproduces it), so without CUDA this
backend loads and every test is unsupported with that reason (backends/_cuda.py);
scripts/gpu_certify.sh certifies it on a GPU machine.

In each rank (a process the suite forks, in its gloo group: docs/interface.md, "Sharded
cases") the call:

1. gathers every rank's shard over the suite's gloo group (CPU tensors) and puts the
   rows at their global positions: ``context_parallel`` takes whole buffers and shards
   them by its own scheme (head-tail, the suite's zigzag, when the length divides by 2W;
   contiguous otherwise);
2. runs ``F.scaled_dot_product_attention`` (is_causal) inside ``context_parallel(mesh,
   buffers=[q, k, v, d_out], buffer_seq_dims=[2, ...])`` on a DeviceMesh of its own
   process group: NCCL with one GPU per rank where there are W GPUs, else the suite's
   gloo group with every rank on GPU ``rank % count`` (NCCL refuses two ranks on one
   GPU); the backward by ``torch.autograd.grad`` inside the same context;
3. unshards the results with ``context_parallel_unshard`` and returns its own rows.

Grouped-query heads: K and V heads repeated on each rank's shard inside the context
(autograd sums their gradients back), since the ring's kernels take equal heads.
What its ring dispatches (flash, memory-efficient or cuDNN SDPA) takes no mask, window or
softcap, and F.scaled_dot_product_attention returns no lse: those are unsupported, as is
bottom-right causal with Lq != Lk (is_causal is top-left; one sharding for q and kv).
"""

from __future__ import annotations

import numpy as np

from ._cuda import CudaAdapter, cuda_count, refuse


class TorchContextParallelBackend(CudaAdapter):
    name = "torch-context-parallel"
    package = "torch with CUDA"
    cuda_why = ("on the CPU, context_parallel's SDPA is the CPU flash kernel, which has no "
                "DTensor sharding strategy")
    distributed = "torch.distributed"
    dtypes = frozenset({"float32", "float16", "bfloat16"})
    dtype_notes = {"float64": "CUDA's fused SDPA kernels, which the ring dispatches, take "
                              "no float64"}
    policy = {
        "fully_masked_rows": "zeros",
        "neg_inf_bias_rows": "zeros",
        "masked_key_nan": "per_row",
        "masked_value_nan": "propagates",
        "accumulation": "float32",
        "padded_query_rows": "zeros",
        "lse_base": "e",
    }
    paths = {
        "sdpa": "native: F.scaled_dot_product_attention inside torch.distributed.tensor."
                "experimental.context_parallel, over NCCL (one GPU per rank) or gloo",
        "sdpa_vjp": "native: torch.autograd.grad inside the same context",
    }

    def _import(self):
        import torch.distributed.tensor.experimental  # noqa: F401  (the ranks inherit it)
        from torch.distributed.tensor.experimental import _attention

        count = cuda_count()
        self.versions.update(gpus=str(count), **{
            "process group": f"nccl where W <= {count} (one GPU per rank), else gloo"})
        return _attention

    # ------------------------------------------------------------------ the interface
    def sdpa(self, q, k, v, *, causal=None, scale=None, softcap=None, window=None, shard=None):
        return self._run(q, k, v, None, causal, scale, softcap, window, shard)[0]

    def sdpa_lse(self, q, k, v, *, causal=None, scale=None, softcap=None, window=None,
                 shard=None):
        self._ready()
        raise NotImplementedError(f"{self.name}: F.scaled_dot_product_attention returns no "
                                  "lse under context_parallel")

    def sdpa_vjp(self, q, k, v, d_out, *, causal=None, scale=None, softcap=None, window=None,
                 shard=None):
        return self._run(q, k, v, d_out, causal, scale, softcap, window, shard)

    # ------------------------------------------------------------------ one rank
    def _run(self, q, k, v, d_out, causal, scale, softcap, window, shard):
        self._ready()
        if shard is None:
            raise NotImplementedError(f"{self.name} computes sharded cases only")
        refuse(self.name, softcap=softcap, window=window)
        lq = sum(len(p) for p in shard["q_positions"])
        lk = sum(len(p) for p in shard["kv_positions"])
        if lq != lk:
            raise NotImplementedError(f"{self.name}: context_parallel shards q and kv alike "
                                      f"(Lq {lq} != Lk {lk}); its is_causal is top-left")
        if np.ndim(q) != 4:
            raise NotImplementedError(f"{self.name}: the ring's SDPA takes (B, H, L, D)")
        rank = shard["rank"]
        whole = [self._gather(a, shard, "q_positions" if i in (0, 3) else "kv_positions")
                 for i, a in enumerate((q, k, v, d_out)) if a is not None]
        results = self._context_parallel(whole, causal is not None, scale, shard,
                                         np.dtype(q.dtype).name)
        own = [shard["q_positions"][rank]] + [shard["kv_positions"][rank]] * 2
        return tuple(self._numpy(r[:, :, own[i]], q) for i, r in enumerate(results))

    def _gather(self, a, shard, positions):
        """This rank's shard and every other's, the rows at their global positions (a CPU
        tensor of the input dtype; float32 for half precision, which gloo may not carry)."""
        import torch
        import torch.distributed as dist

        from .torch import _to_torch

        mine = _to_torch(a).contiguous()
        if mine.dtype in (torch.float16, torch.bfloat16):
            mine = mine.float()
        parts = [torch.empty_like(mine) for _ in range(shard["world_size"])]
        dist.all_gather(parts, mine)
        whole = torch.empty(*mine.shape[:-2], sum(p.shape[-2] for p in parts), mine.shape[-1],
                            dtype=mine.dtype)
        for rows, part in zip(shard[positions], parts):
            whole[..., rows, :] = part
        return whole

    def _group(self, world: int):
        """(process group, device) of this rank: NCCL with a GPU each where there are W,
        else the suite's own gloo group, ranks sharing the GPUs."""
        import torch
        import torch.distributed as dist

        rank, count = dist.get_rank(), cuda_count()
        device = torch.device("cuda", rank % count)
        torch.cuda.set_device(device)
        if count >= world:
            return dist.new_group(backend="nccl"), device, "nccl"
        return dist.group.WORLD, device, "gloo"

    def _context_parallel(self, whole, causal: bool, scale, shard, dtype_name: str):
        import torch
        import torch.nn.functional as F
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import context_parallel_unshard
        from torch.nn.attention import SDPBackend, sdpa_kernel

        group, device, _ = self._group(shard["world_size"])
        mesh = DeviceMesh.from_group(group, "cuda")
        dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(dtype_name,
                                                                          torch.float32)
        buffers = [t.to(device=device, dtype=dtype) for t in whole]
        fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                 SDPBackend.CUDNN_ATTENTION]
        with sdpa_kernel(fused), context_parallel(mesh, buffers=buffers,
                                                  buffer_seq_dims=[2] * len(buffers),
                                                  no_restore_buffers=set(buffers)):
            leaves = [t.detach().requires_grad_(len(buffers) == 4) for t in buffers[:3]]
            group_size = leaves[0].shape[1] // leaves[1].shape[1]
            k, v = (t.repeat_interleave(group_size, dim=1) for t in leaves[1:])
            out = F.scaled_dot_product_attention(leaves[0], k, v, is_causal=causal,
                                                 scale=None if scale is None else float(scale))
            results = [out] if len(buffers) == 3 else \
                list(torch.autograd.grad(out, leaves, buffers[3]))
            return context_parallel_unshard(mesh, [r.detach() for r in results],
                                            [2] * len(results))

    def _numpy(self, t, like):
        from .torch import _TORCH_DTYPES, _to_numpy

        return _to_numpy(t.to(_TORCH_DTYPES[np.dtype(like.dtype).name]))
