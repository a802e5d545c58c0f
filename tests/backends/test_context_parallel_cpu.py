"""PyTorch's own context parallelism (torch.distributed.tensor.experimental.context_parallel)
does not run on the CPU: inside it, SDPA dispatches to the CPU flash kernel, which has no
DTensor sharding strategy. Reproduced here in the suite's own ranks (two, one gloo group),
so that a torch that makes it run fails this test and the adapter is written then. On
CUDA it takes NCCL and one GPU per rank (docs/findings.md)."""

import numpy as np
import pytest

pytest.importorskip("torch.distributed")

from _ring_tests import slow_ring  # noqa: E402
from attention_conformance.backend.in_process import InProcess  # noqa: E402
from attention_conformance.model.errors import Unsupported  # noqa: E402


class ContextParallelOnCpu:
    name = "torch-context-parallel-cpu"
    dtypes = {"float32"}
    policy = {"fully_masked_rows": "zeros"}
    distributed = "torch.distributed"

    def __init__(self):
        # imported here, once: the ranks forked from this process inherit them
        import torch.distributed.device_mesh  # noqa: F401
        import torch.distributed.tensor.experimental  # noqa: F401

    def sdpa(self, q, k, v, *, causal=None, shard):
        import torch
        import torch.nn.functional as F
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel

        mesh = init_device_mesh("cpu", (shard["world_size"],))
        q, k, v = (torch.from_numpy(a) for a in (q, k, v))
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True).numpy()


@slow_ring
def test_context_parallel_has_no_cpu_sharding_strategy_for_sdpa():
    q = np.random.default_rng(0).normal(size=(1, 2, 8, 4)).astype(np.float32)
    with pytest.raises(Unsupported, match="_scaled_dot_product_flash_attention_for_cpu"
                                          ".default does not have a sharding strategy"):
        InProcess(ContextParallelOnCpu()).call(
            "sdpa", {"q": q, "k": q.copy(), "v": q.copy()},
            {"causal": "top_left", "sharding": {"world_size": 2}})
