"""Ring attention over a multi-process JAX cluster: the `jax-ring-processes` backend
(sharded cases only; ``distributed = "jax.distributed"``).

The ring of `jax-ring` (backends/jax_ring.py: shard_map over a mesh, ppermute of K/V,
their positions and document ids, jax.vjp for the gradients), run as JAX runs across
hosts: one process per rank. The suite forks W ranks and makes each one process of a
JAX cluster (``jax.distributed.initialize``, a coordinator on the loopback, CPU
collectives through gloo: docs/interface.md, "Sharded cases"); each rank's call gets
its own shard, builds the global arrays from its process-local data
(``jax.make_array_from_process_local_data``) on a mesh of one CPU device per process,
runs the same jitted ring, and returns its own rows. The ppermutes cross processes.

JAX's backend must not start in the process the ranks are forked from (initialize comes
first in each): this adapter touches no device there, and refuses a call without
``shard``. A rank compiles its program itself (JAX's persistent cache, as the jax-ring
environment sets it, keeps it for the next).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from .jax_ring import RING, JaxRingBackend, _mesh


class JaxRingProcessesBackend(JaxRingBackend):
    """jax-ring, one JAX process per rank of a jax.distributed cluster."""

    name = "jax-ring-processes"
    distributed = "jax.distributed"
    stacked = False                                  # each rank's call: its own shard
    paths = {op: path.replace("under jax.shard_map", "under jax.shard_map across processes")
             for op, path in JaxRingBackend.paths.items()}

    def __init__(self):
        jax.config.update("jax_enable_x64", True)    # a setting: no device is started here
        self.versions = {"jax": jax.__version__, "device": "cpu",
                         "processes": "one per rank (jax.distributed, gloo collectives)"}

    @staticmethod
    def _mesh(world: int):
        """One CPU device of each process, in rank order."""
        if jax.process_count() != world:
            raise RuntimeError(f"{world} ranks, but this JAX cluster has "
                               f"{jax.process_count()} processes")
        return _mesh(tuple(jax.local_devices(process_index=p)[0] for p in range(world)))

    def _inputs(self, *arrays, wide=True):
        """This rank's shards as its rows of the global (W, ...) arrays."""
        dtype = jnp.promote_types(arrays[0].dtype, jnp.float32) if wide else None
        sharding = NamedSharding(self._mesh(jax.process_count()), PartitionSpec(RING))
        return [jax.make_array_from_process_local_data(
                    sharding, np.asarray(a, dtype=dtype)[None]) for a in arrays]

    def _places(self, *stacked):
        return self._inputs(*(a[jax.process_index()] for a in stacked), wide=False)

    def _whole(self, a):
        sharding = NamedSharding(self._mesh(jax.process_count()), PartitionSpec())
        return jax.make_array_from_process_local_data(sharding, np.asarray(a))

    @staticmethod
    def _result(x, dtype) -> np.ndarray:
        """This rank's rows of a global output, in dtype (jax_ring's _result)."""
        [local] = x.addressable_shards
        return np.array(np.asarray(local.data)[0].astype(dtype), copy=True)
