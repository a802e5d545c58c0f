"""Ring attention in JAX under ``shard_map``: the `jax-ring` backend (sharded cases only).

The distributed form is ``spmd`` (docs/interface.md, "Sharded cases"): one call holds
every rank's shard stacked on a leading axis, which ``shard_map`` splits over a mesh of
W host devices (axis ``ring``). On each device the key/value block and its global
positions travel around the ring with ``jax.lax.ppermute`` (to device + 1); each step
attends the device's queries to the block it holds, masked by the global positions
(causal, window), and merges the block's partial state through the log-sum-exp. The
backward pass is JAX's own: ``jax.vjp`` of the sharded forward, where the transpose of
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
def _program(world: int, vjp: bool, offset: int, causal, window, scale, softcap):
    """The jitted ring for one world size and set of params (shapes retrace in jit)."""
    left, right = rules.window_sides(window)
    perm = [(i, (i + 1) % world) for i in range(world)]
    mesh = Mesh(np.array(jax.devices("cpu")[:world]), (RING,))

    def step(q, q_pos, carry, _):
        out, lse, k, v, kv_pos = carry
        keep = _allowed(q_pos, kv_pos, offset, causal, left, right)
        out, lse = _merge(out, lse, *_block(q, k, v, keep, scale, softcap))
        k, v, kv_pos = (jax.lax.ppermute(x, RING, perm) for x in (k, v, kv_pos))
        return (out, lse, k, v, kv_pos), None

    def rank(q, k, v, q_pos, kv_pos):               # this device's block: leading axis 1
        q, k, v, q_pos, kv_pos = (x[0] for x in (q, k, v, q_pos, kv_pos))
        zero = jnp.zeros_like(q[..., 0])            # varying over the ring, as the carry
        out, lse = zero[..., None] + jnp.zeros(v.shape[-1], q.dtype), zero - jnp.inf
        (out, lse, *_), _ = jax.lax.scan(functools.partial(step, q, q_pos),
                                         (out, lse, k, v, kv_pos), length=world)
        return out[None], lse[None]

    spec = PartitionSpec(RING)
    sharded = jax.shard_map(rank, mesh=mesh, in_specs=(spec,) * 5, out_specs=(spec, spec))
    if not vjp:
        return jax.jit(sharded)

    def gradients(q, k, v, d_out, q_pos, kv_pos):
        (out, lse), pull = jax.vjp(lambda *x: sharded(*x, q_pos, kv_pos), q, k, v)
        return pull((d_out, jnp.zeros_like(lse)))
    return jax.jit(gradients)


class JaxRingBackend:
    """Ring attention under shard_map over W host devices, ppermute around the ring."""

    name = "jax-ring"
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

    def sdpa(self, q, k, v, *, causal=None, scale=None, softcap=None, window=None, shard=None):
        return self.sdpa_lse(q, k, v, causal=causal, scale=scale, softcap=softcap,
                             window=window, shard=shard)[0]

    def sdpa_lse(self, q, k, v, *, causal=None, scale=None, softcap=None, window=None,
                 shard=None):
        program, positions = self._ring(shard, q, causal, window, scale, softcap, vjp=False)
        out, lse = program(*self._inputs(q, k, v), *positions)
        return self._result(out, q), self._result(lse, q)

    def sdpa_vjp(self, q, k, v, d_out, *, causal=None, scale=None, softcap=None, window=None,
                 shard=None):
        program, positions = self._ring(shard, q, causal, window, scale, softcap, vjp=True)
        grads = program(*self._inputs(q, k, v, d_out), *positions)
        return tuple(self._result(g, q) for g in grads)

    def _ring(self, shard, q, causal, window, scale, softcap, vjp):
        if shard is None:
            raise NotImplementedError("jax-ring computes sharded cases only (the jax backend "
                                      "certifies the single-device arithmetic)")
        rules.check_causal(causal)
        world = shard["world_size"]
        if world > len(jax.devices("cpu")):
            raise NotImplementedError(f"{world} ranks, but jax has {len(jax.devices('cpu'))} "
                                      "host devices (XLA_FLAGS was set before this module)")
        lq, lk = (sum(len(p) for p in shard[n]) for n in ("q_positions", "kv_positions"))
        scale = 1.0 / float(np.sqrt(q.shape[-1])) if scale is None else float(scale)
        window = None if window is None else tuple(window)
        program = _program(world, vjp, rules.causal_offset(lq, lk, causal), causal, window,
                           scale, None if softcap is None else float(softcap))
        positions = [jnp.asarray(np.asarray(shard[n], dtype=np.int32))
                     for n in ("q_positions", "kv_positions")]
        return program, positions

    @staticmethod
    def _inputs(*arrays):
        wide = jnp.promote_types(arrays[0].dtype, jnp.float32)
        return [jnp.asarray(a, dtype=wide) for a in arrays]

    @staticmethod
    def _result(x, like) -> np.ndarray:
        return np.array(np.asarray(x).astype(like.dtype), copy=True)
