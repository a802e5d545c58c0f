"""Inputs of a case, generated deterministically in float64 (or bool for masks).

Random draws use NumPy's legacy ``RandomState``, whose streams NumPy promises to keep
unchanged across versions (NEP 19), so golden data stay valid on any NumPy.
"""

from __future__ import annotations

import numpy as np

from ..model.indexing import parse_index


def resolve(size, dims: dict) -> int:
    """A shape entry: an integer, or the name of one of the variant's dims."""
    if isinstance(size, str):
        if size not in dims:
            raise ValueError(f"dim {size!r} is not defined in this variant's dims")
        return dims[size]
    return int(size)


def _shape(shape, dims) -> tuple[int, ...]:
    return tuple(resolve(s, dims) for s in shape)


def _values(spec):
    kind = spec.get("dtype")
    array = np.array(spec["values"], dtype=bool if kind == "bool" else None)
    if array.dtype == object:
        raise ValueError("inline values are ragged: every row needs the same length")
    if kind == "float" or (kind is None and array.dtype != bool):
        array = array.astype(np.float64)
    return array


_RNG = np.random.RandomState()


def _seeded(seed) -> np.random.RandomState:
    """The legacy stream of `seed`: reseeding one RandomState gives exactly the draws of
    RandomState(seed), at a fiftieth of the cost of constructing one."""
    _RNG.seed(seed)
    return _RNG


def _normal(g, dims):
    rng = _seeded(g["seed"])
    return g.get("mean", 0.0) + g.get("std", 1.0) * rng.standard_normal(_shape(g["shape"], dims))


def _uniform(g, dims):
    rng = _seeded(g["seed"])
    return rng.uniform(g.get("low", 0.0), g.get("high", 1.0), _shape(g["shape"], dims))


def _bernoulli(g, dims):
    rng = _seeded(g["seed"])
    keep = rng.random_sample(_shape(g["shape"], dims)) < g["p"]
    if g.get("keep_first"):
        keep[..., 0] = True   # every query keeps key 0, so no row is fully masked
    return keep


def _full(g, dims):
    value = g["value"]
    return np.full(_shape(g["shape"], dims), value, dtype=bool if isinstance(value, bool) else np.float64)


def _key_padding(g, dims):
    lengths = [resolve(n, dims) for n in g["lengths"]]
    size = resolve(g["size"], dims)
    keep = np.arange(size)[None, :] < np.array(lengths)[:, None]
    rank = g.get("rank", 3)
    return keep.reshape((len(lengths),) + (1,) * (rank - 2) + (size,))


def _triangle(g, dims):
    rows, cols = resolve(g["rows"], dims), resolve(g["cols"], dims)
    return np.arange(cols)[None, :] <= np.arange(rows)[:, None] + g.get("offset", 0)


def _onehot(g, dims):
    indices = np.array(g["indices"], dtype=int).reshape(-1)
    if indices.size and indices.max() >= g["depth"]:
        raise IndexError(f"onehot index {indices.max()} is out of range for depth {g['depth']}")
    rows = np.zeros((indices.size, g["depth"]))      # np.eye(depth) would take depth**2
    rows[np.arange(indices.size), indices] = 1.0
    return rows


GENERATORS = {
    "normal": _normal, "uniform": _uniform, "bernoulli": _bernoulli, "full": _full,
    "key_padding": _key_padding, "triangle": _triangle, "onehot": _onehot,
}


def _generate(spec: dict, dims: dict) -> np.ndarray:
    if "values" in spec:
        return _values(spec)
    for name, generator in GENERATORS.items():
        if name in spec:
            return generator(spec[name], dims)
    raise ValueError(f"no generator in {sorted(spec)}")


def _planned(spec: dict, dims: dict, known: dict) -> tuple[int, ...] | None:
    """The shape an input's generator will make, found without making it (None: not
    known, the generator itself will then report the problem)."""
    shape = _generated_shape(spec, dims, known)
    if shape is None or "columns" not in spec:
        return shape
    return tuple(shape[:-1]) + (min(spec["columns"], shape[-1]),) if shape else shape


def _generated_shape(spec: dict, dims: dict, known: dict) -> tuple[int, ...] | None:
    try:
        if "same_as" in spec:
            return known.get(spec["same_as"])
        if "values" in spec:
            return tuple(np.shape(spec["values"]))
        for name in ("normal", "uniform", "bernoulli", "full"):
            if name in spec:
                return _shape(spec[name]["shape"], dims)
        if "key_padding" in spec:
            g = spec["key_padding"]
            return (len(g["lengths"]),) + (1,) * (g.get("rank", 3) - 2) + (resolve(g["size"], dims),)
        if "triangle" in spec:
            return resolve(spec["triangle"]["rows"], dims), resolve(spec["triangle"]["cols"], dims)
        if "onehot" in spec:
            return len(spec["onehot"]["indices"]), spec["onehot"]["depth"]
    except (ValueError, TypeError, KeyError):
        return None
    return None


def planned_shapes(inputs: dict, dims: dict) -> dict[str, tuple[int, ...] | None]:
    """Every input's shape, computed without allocating anything (see _planned)."""
    known: dict = {}
    pending = list(inputs)
    while pending:                  # a same_as chain resolves one link a round
        for name in pending:
            known[name] = _planned(inputs[name], dims, known)
        left = [name for name in pending if known[name] is None]
        if len(left) == len(pending):           # nothing more can be known
            break
        pending = left
    return {name: known.get(name) for name in inputs}


_NUMBER_WORDS = {".nan": np.nan, ".inf": np.inf, "-.inf": -np.inf}


def _modify(array: np.ndarray, spec: dict) -> np.ndarray:
    if "columns" in spec:           # MLA: V is a view of K's first Dv columns
        if array.ndim == 0 or spec["columns"] > array.shape[-1]:
            raise ValueError(f"columns {spec['columns']} of an input of shape {array.shape}")
        array = array[..., :spec["columns"]]
    if "times" in spec:
        array = array * spec["times"]
    if "plus" in spec:
        array = array + spec["plus"]
    for entry in spec.get("set", ()):
        array = np.array(array, copy=True)
        value = entry["value"]
        array[parse_index(entry["at"])] = _NUMBER_WORDS.get(value, value) \
            if isinstance(value, str) else value
    return array


def build_inputs(inputs: dict, dims: dict) -> dict[str, np.ndarray]:
    """Every input array of a case variant: float64, or bool for masks.

    A `same_as` input copies another input after that one's modifiers (chains allowed).
    """
    arrays, pending = {}, dict(inputs)
    while pending:
        ready = [n for n, s in pending.items() if s.get("same_as") in (None, *arrays)]
        if not ready:
            name, spec = next(iter(pending.items()))
            why = "unknown input" if spec["same_as"] not in inputs else "(in a cycle) input"
            raise ValueError(f"input {name!r} is same_as {why} {spec['same_as']!r}")
        for name in ready:
            spec = pending.pop(name)
            source = spec.get("same_as")
            arrays[name] = _modify(arrays[source] if source else _generate(spec, dims), spec)
    return {name: arrays[name] for name in inputs}
