"""Ring attention in JAX under ``shard_map``: the `jax-ring` backend (sharded cases only).

The distributed form is ``spmd`` (docs/interface.md, "Sharded cases"): one call holds
every rank's shard stacked on a leading axis, which ``shard_map`` splits over a mesh of
W host devices (axis ``ring``). On each device the key/value block and its global
positions travel around the ring with ``jax.lax.ppermute`` (to device + 1); each step
attends the device's queries to the block it holds, masked by the global positions
(causal, window), the packed documents (each device's key ids travel with its block) and
the block mask (whole, read at the positions), and merges the block's partial state
through the log-sum-exp. The backward pass is JAX's own: ``jax.vjp`` of the sharded forward, where the transpose of
each ``ppermute`` carries dK and dV back around the ring to the device that holds them.

W host devices need ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` before jax is
imported: this module sets it (N = 8, unless the flag is set already) when it is
imported first in its process, as in the backend's own process of a run. Half-precision
inputs are computed in float32 and rounded once. A call without ``shard`` is
unsupported: the jax backend certifies the single-device arithmetic.
"""

from __future__ import annotations

import functools
import os
import sys

#: host devices made for the ring (the largest world size it can run)
HOST_DEVICES = 8


def _host_devices(count: int = HOST_DEVICES) -> None:
    """Ask XLA for `count` CPU devices, before jax is imported (it reads XLA_FLAGS once)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "jax" not in sys.modules and "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()


_host_devices()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, PartitionSpec  # noqa: E402

from . import rules  # noqa: E402

RING = "ring"


def _allowed(q_pos, kv_pos, offset, causal, left, right):
    """Bool (n_q, n_kv) from global positions: the interface's rule, step 4."""
    p = q_pos[:, None] + offset
    keep = jnp.ones((q_pos.shape[0], kv_pos.shape[0]), dtype=bool)
    if causal is not None:
        keep &= kv_pos[None, :] <= p
    if left is not None:
        keep &= kv_pos[None, :] >= p - left
    if right is not None:
        keep &= kv_pos[None, :] <= p + right
    return keep


def _structure(q_ids, kv_ids, q_pos, kv_pos, blocks, block_size, ndim):
    """Bool (..., n_q, n_kv): the packed documents (the query's id equals the key's; ids
    (n,) for the batch or (B, n) per element of dim 0) and the block mask, a whole-sequence
    (..., ceil(Lq/Bq), ceil(Lk/Bk)) read at the global positions."""
    same = q_ids[..., :, None] == kv_ids[..., None, :]
    if same.ndim == 3:                          # per element of dim 0: (B, 1.., n_q, n_kv)
        same = same.reshape(same.shape[:1] + (1,) * (ndim - 3) + same.shape[1:])
    seen = jnp.take(jnp.take(blocks, q_pos // block_size[0], axis=-2),
                    kv_pos // block_size[1], axis=-1)
    return same & seen


def _block(q, k, v, keep, scale, softcap):
    """(out, lse) of q over one key block, safe for rows the block leaves without keys
    (out 0, lse -inf) and for their gradients."""
    group = q.shape[-3] // k.shape[-3]
    k, v = jnp.repeat(k, group, axis=-3), jnp.repeat(v, group, axis=-3)
    s = jnp.einsum("...qd,...kd->...qk", q, k) * scale
    if softcap is not None:
        s = softcap * jnp.tanh(s / softcap)
    s = jnp.where(keep, s, -jnp.inf)
    m = jax.lax.stop_gradient(s.max(-1, keepdims=True))
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(s - m)
    total = p.sum(-1)
    seen = total > 0
    safe = jnp.where(seen, total, 1.0)
    out = jnp.einsum("...qk,...kd->...qd", p, v) / safe[..., None]
    return out, jnp.where(seen, jnp.log(safe) + m[..., 0], -jnp.inf)


def _merge(out, lse, block_out, block_lse):
    merged = jnp.logaddexp(lse, block_lse)
    safe = jnp.where(jnp.isfinite(merged), merged, 0.0)
    return (jnp.exp(lse - safe)[..., None] * out
            + jnp.exp(block_lse - safe)[..., None] * block_out), merged


@functools.lru_cache(maxsize=64)
def _program(mesh: Mesh, vjp: bool, offset: int, causal, window, scale, softcap,
             block_size: tuple, ndim: int):
    """The jitted ring over a mesh of W devices for one set of params (shapes retrace in
    jit)."""
    left, right = rules.window_sides(window)
    world = mesh.devices.size
    perm = [(i, (i + 1) % world) for i in range(world)]

    def step(q, q_pos, q_ids, blocks, carry, _):
        out, lse, k, v, kv_pos, kv_ids = carry
        keep = (_allowed(q_pos, kv_pos, offset, causal, left, right)
                & _structure(q_ids, kv_ids, q_pos, kv_pos, blocks, block_size, ndim))
        out, lse = _merge(out, lse, *_block(q, k, v, keep, scale, softcap))
        k, v, kv_pos, kv_ids = (jax.lax.ppermute(x, RING, perm)
                                for x in (k, v, kv_pos, kv_ids))
        return (out, lse, k, v, kv_pos, kv_ids), None

    def rank(q, k, v, q_pos, kv_pos, q_ids, kv_ids, blocks):  # this device's: leading axis 1
        q, k, v, q_pos, kv_pos, q_ids, kv_ids = (x[0] for x in (q, k, v, q_pos, kv_pos,
                                                               q_ids, kv_ids))
        zero = jnp.zeros_like(q[..., 0])            # varying over the ring, as the carry
        out, lse = zero[..., None] + jnp.zeros(v.shape[-1], q.dtype), zero - jnp.inf
        (out, lse, *_), _ = jax.lax.scan(functools.partial(step, q, q_pos, q_ids, blocks),
                                         (out, lse, k, v, kv_pos, kv_ids), length=world)
        return out[None], lse[None]

    spec = PartitionSpec(RING)
    sharded = jax.shard_map(rank, mesh=mesh, in_specs=(spec,) * 7 + (PartitionSpec(),),
                            out_specs=(spec, spec))
    if not vjp:
        return jax.jit(sharded)

    def gradients(q, k, v, d_out, *places):
        (out, lse), pull = jax.vjp(lambda *x: sharded(*x, *places), q, k, v)
        return pull((d_out, jnp.zeros_like(lse)))
    return jax.jit(gradients)


@functools.lru_cache(maxsize=8)
def _mesh(devices: tuple) -> Mesh:
    return Mesh(np.array(devices), (RING,))


class JaxRingBackend:
    """Ring attention under shard_map over W host devices, ppermute around the ring."""

    name = "jax-ring"
    #: whether a call's inputs are every rank's shards stacked on a leading axis (spmd)
    stacked = True
    dtypes = frozenset({"float64", "float32", "float16", "bfloat16"})
    distributed = "spmd"
    policy = {
        "fully_masked_rows": "zeros",
        "neg_inf_bias_rows": "zeros",
        "masked_key_nan": "propagates",
        "masked_value_nan": "propagates",
        "accumulation": "float32",
        "padded_query_rows": "zeros",
        "lse_base": "e",              # the lse it returns, merged around the ring: natural logs
    }
    paths = {
        "sdpa": "composed: ring under jax.shard_map, ppermute of K/V and their positions, "
                "each block's (out, lse) merged through the lse",
        "sdpa_lse": "composed: as sdpa, with the merged lse",
        "sdpa_vjp": "composed: jax.vjp of the sharded forward (ppermute's transpose carries "
                    "dK/dV around the ring)",
    }

    def __init__(self):
        jax.config.update("jax_enable_x64", True)    # else float64 is computed in float32
        self.versions = {"jax": jax.__version__, "device": "cpu",
                         "host devices": str(len(jax.devices("cpu")))}

    def sdpa(self, q, k, v, *, causal=None, scale=None, softcap=None, window=None,
             q_segment_ids=None, kv_segment_ids=None, block_mask=None, block_size=None,
             shard=None):
        program, places = self._ring(shard, q, k, causal, window, scale, softcap, False,
                                     (q_segment_ids, kv_segment_ids, block_mask, block_size))
        return self._result(program(*self._inputs(q, k, v), *places)[0], q.dtype)

    def sdpa_lse(self, q, k, v, *, causal=None, scale=None, softcap=None, window=None,
                 shard=None):
        program, places = self._ring(shard, q, k, causal, window, scale, softcap, False)
        out, lse = program(*self._inputs(q, k, v), *places)
        return self._result(out, q.dtype), self._result(lse, rules.lse_dtype(q.dtype))

    def sdpa_vjp(self, q, k, v, d_out, *, causal=None, scale=None, softcap=None, window=None,
                 q_segment_ids=None, kv_segment_ids=None, block_mask=None, block_size=None,
                 shard=None):
        program, places = self._ring(shard, q, k, causal, window, scale, softcap, True,
                                     (q_segment_ids, kv_segment_ids, block_mask, block_size))
        grads = program(*self._inputs(q, k, v, d_out), *places)
        return tuple(self._result(g, q.dtype) for g in grads)

    def _ring(self, shard, q, k, causal, window, scale, softcap, vjp,
              structure=(None, None, None, None)):
        """The jitted ring for this call and its sharded arguments: the positions, the
        document ids (W, ..., n) of each rank's tokens, the whole block mask."""
        if shard is None:
            raise NotImplementedError("jax-ring computes sharded cases only (the jax backend "
                                      "certifies the single-device arithmetic)")
        rules.check_causal(causal)
        mesh = self._mesh(shard["world_size"])
        lq, lk = (sum(len(p) for p in shard[n]) for n in ("q_positions", "kv_positions"))
        scale = 1.0 / float(np.sqrt(q.shape[-1])) if scale is None else float(scale)
        window = None if window is None else tuple(window)
        q_ids, kv_ids, blocks, block_size = structure
        program = _program(mesh, vjp, rules.causal_offset(lq, lk, causal), causal, window,
                           scale, None if softcap is None else float(softcap),
                           (lq, lk) if blocks is None else tuple(map(int, block_size)),
                           max(q.ndim, k.ndim) - self.stacked)    # the scores' rank
        positions = [np.asarray(shard[n], dtype=np.int32) for n in ("q_positions", "kv_positions")]
        ids = [np.stack([np.take(np.asarray([0] * length if given is None else given,
                                            dtype=np.int32), rows, axis=-1) for rows in side])
               for given, length, side in ((q_ids, lq, positions[0]), (kv_ids, lk, positions[1]))]
        blocks = np.ones((1, 1), dtype=bool) if blocks is None else np.asarray(blocks) != 0
        return program, [*self._places(*positions, *ids), self._whole(blocks)]

    def _places(self, *stacked):
        """The positions and document ids of every rank (W, ...) as the ring's arguments."""
        return self._inputs(*stacked, wide=False)

    @staticmethod
    def _mesh(world: int) -> Mesh:
        """W host devices of this process, the ring's axis."""
        count = len(jax.devices("cpu"))
        if world > count:
            raise NotImplementedError(f"{world} ranks, but jax has {count} host devices "
                                      "(XLA_FLAGS was set before this module)")
        return _mesh(tuple(jax.devices("cpu")[:world]))

    @staticmethod
    def _whole(a) -> jax.Array:
        """An argument every device holds whole (the block mask)."""
        return jnp.asarray(a)

    @staticmethod
    def _inputs(*arrays, wide=True):
        """The stacked shards (W, ...) as the ring's arguments; floats at least float32."""
        dtype = jnp.promote_types(arrays[0].dtype, jnp.float32) if wide else None
        return [jnp.asarray(a, dtype=dtype) for a in arrays]

    @staticmethod
    def _result(x, dtype) -> np.ndarray:
        return np.array(np.asarray(x).astype(dtype), copy=True)
