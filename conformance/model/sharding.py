"""The `sharding` param: a case computed by a distributed implementation over W ranks.

A sharded case is the same attention as its single-device form (the same golden, the
same tolerance); `sharding` says only how its sequence is split over the ranks:

- ``{world_size: W}`` or ``{world_size: W, scheme: contiguous}``: rank r holds tokens
  ``[r L/W, (r + 1) L/W)`` (L divisible by W);
- ``{world_size: W, scheme: zigzag}``: the sequence cut into 2W equal chunks, rank r
  holds chunks r and 2W-1-r (L divisible by 2W), which balances causal work;
- ``{world_size: W, scheme: explicit, positions: [[...], ...]}``: rank r holds the
  listed token positions, in that order (any load-balancing scheme); ``kv_positions``
  gives the keys' split where it differs from the queries'. Every position once, and
  every rank the same number of them.

The queries (q, d_out; the rows of out, lse, dq) are split by their positions over Lq,
the keys (k, v; the rows of dk, dv) by theirs over Lk. The params are not split: causal
and window, the packed documents' ids and the block mask keep their meaning on the whole
sequence, and every rank receives them whole (it reads them at its global positions).
NumPy only: the suite's side.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCHEMES = ("contiguous", "zigzag", "explicit")
#: the distributed forms a backend may declare as `distributed` (backend/distributed.py)
FORMS = {"torch.distributed": "W rank processes in one torch.distributed gloo group",
         "jax.distributed": "W rank processes, one JAX cluster (jax.distributed, gloo collectives)",
         "spmd": "one call with every rank's shard stacked on a leading axis (shard_map)"}
#: the ops a case may shard, and its inputs and outputs on each side (axis, side)
SHARDED_OPS = ("sdpa", "sdpa_lse", "sdpa_vjp")
QUERY_INPUTS, KEY_INPUTS = ("q", "d_out"), ("k", "v")
OUTPUT_SIDES = {"out": (-2, "q"), "lse": (-1, "q"), "dq": (-2, "q"),
                "dk": (-2, "kv"), "dv": (-2, "kv")}
#: keyword inputs a sharded call cannot take: their key axis would be split as well
UNSHARDABLE = ("mask", "bias", "sink")


@dataclass(frozen=True)
class Sharding:
    world_size: int
    scheme: str = "contiguous"
    positions: tuple = ()          # explicit: per rank, the query positions
    kv_positions: tuple = ()       # explicit: per rank, the key positions (default: positions)

    @classmethod
    def of(cls, param: dict) -> "Sharding":
        """The param as the case gives it (a dict; the schema checked its keys)."""
        explicit = [tuple(int(p) for p in rank) for rank in param.get("positions", ())]
        kv = [tuple(int(p) for p in rank) for rank in param.get("kv_positions", ())]
        scheme = param.get("scheme", "explicit" if explicit else "contiguous")
        return cls(int(param["world_size"]), scheme, tuple(explicit), tuple(kv))

    def split(self, length: int, side: str) -> list[np.ndarray]:
        """Per rank, the positions (int64) of the tokens it holds of a side of `length`
        tokens ("q" or "kv"); ValueError if this sharding cannot split that length."""
        problem = self.problem(length, side)
        if problem:
            raise ValueError(problem)
        w = self.world_size
        if self.scheme == "contiguous":
            return [np.arange(r * length // w, (r + 1) * length // w) for r in range(w)]
        if self.scheme == "zigzag":
            chunk = length // (2 * w)
            return [np.concatenate([np.arange(r * chunk, (r + 1) * chunk),
                                    np.arange((2 * w - 1 - r) * chunk, (2 * w - r) * chunk)])
                    for r in range(w)]
        return [np.asarray(rank, dtype=np.int64) for rank in self._explicit(side)]

    def _explicit(self, side: str) -> tuple:
        return self.kv_positions if side == "kv" and self.kv_positions else self.positions

    def problem(self, length: int, side: str) -> str | None:
        """Why this sharding cannot split `length` tokens of a side, or None."""
        w, name = self.world_size, "Lq" if side == "q" else "Lk"
        if w < 1:
            return f"sharding world_size must be at least 1, not {w}"
        if self.scheme not in SCHEMES:
            return f"sharding scheme {self.scheme!r} is not one of {', '.join(SCHEMES)}"
        if self.scheme != "explicit" and (self.positions or self.kv_positions):
            return "sharding positions are given only with scheme explicit"
        if self.scheme == "contiguous" and length % w:
            return f"contiguous sharding over {w} ranks needs {name} divisible by {w}, not {length}"
        if self.scheme == "zigzag" and length % (2 * w):
            return (f"zigzag sharding over {w} ranks needs {name} divisible by {2 * w} "
                    f"(2W chunks), not {length}")
        if self.scheme == "explicit":
            return _explicit_problem(self._explicit(side), w, length, name)
        return None


def _explicit_problem(ranks: tuple, w: int, length: int, name: str) -> str | None:
    if len(ranks) != w:
        return f"explicit sharding lists {len(ranks)} ranks' positions for world_size {w}"
    if len({len(r) for r in ranks}) != 1:
        return ("explicit sharding gives the ranks "
                f"{[len(r) for r in ranks]} positions: every rank holds as many")
    listed = sorted(p for rank in ranks for p in rank)
    if listed != list(range(length)):
        return (f"explicit sharding positions must list each of the {length} positions of "
                f"{name} once")
    return None


def case_problems(op: str, shapes: dict, params: dict) -> list[str]:
    """Why a case's `sharding` cannot be run (its op, its inputs, its lengths): [] if it can."""
    if "sharding" not in params:
        return []
    if op not in SHARDED_OPS:
        return [f"sharding applies to {', '.join(SHARDED_OPS)}, not {op}"]
    problems = [f"a sharded case takes no {name} (its key axis would be split too)"
                for name in UNSHARDABLE if name in shapes]
    problems += [f"a sharded case takes no {name} (its distributed form is not specified)"
                 for name in ("q_lengths", "kv_lengths") if name in params]
    sharding = Sharding.of(params["sharding"])
    for side, name in (("q", "q"), ("kv", "k")):
        if name in shapes:
            problems += [p for p in [sharding.problem(shapes[name][-2], side)] if p]
    return problems


def shard_inputs(sharding: Sharding, arrays: dict) -> tuple[list[dict], dict]:
    """(per rank, its inputs; the positions of each side: {"q": [...], "kv": [...]})."""
    places = {"q": sharding.split(arrays["q"].shape[-2], "q"),
              "kv": sharding.split(arrays["k"].shape[-2], "kv")}
    ranks = []
    for r in range(sharding.world_size):
        side = {name: ("q" if name in QUERY_INPUTS else "kv") for name in arrays}
        ranks.append({name: np.ascontiguousarray(np.take(a, places[side[name]][r], axis=-2))
                      for name, a in arrays.items()})
    return ranks, places


def shard_description(sharding: Sharding, places: dict, rank: int | None) -> dict:
    """What a rank's call receives as `shard` (plain data): its rank (None in the SPMD
    form, where one call holds every rank), the world size, and every rank's positions."""
    return {"rank": rank, "world_size": sharding.world_size,
            "q_positions": [p.tolist() for p in places["q"]],
            "kv_positions": [p.tolist() for p in places["kv"]]}


def gather(name: str, shards: list, places: dict, shape: tuple) -> np.ndarray:
    """One output put back together from each rank's rows, at their global positions."""
    axis, side = OUTPUT_SIDES[name]
    whole = np.empty(shape, dtype=shards[0].dtype)
    moved = np.moveaxis(whole, axis, 0)
    for rows, part in zip(places[side], shards):
        moved[rows] = np.moveaxis(part, axis, 0)
    return whole


def shard_shape(name: str, shape: tuple, places: dict, rank: int) -> tuple:
    """The shape of rank `rank`'s share of an output of the whole `shape`."""
    axis, side = OUTPUT_SIDES[name]
    shape = list(shape)
    shape[axis] = len(places[side][rank])
    return tuple(shape)
