"""The sampled golden (``expect: {golden: sampled}``): the forward pass checked at chosen
query rows, at a fraction of the cost of every row.

The output of a query row needs that row's scores alone (Lk x D), so a case of sdpa or
sdpa_lse can be checked at the rows where kernels go wrong, computed by the blocked
float64 reference (blocks.py) and compared under the tolerance rule of every golden:
the plain same-dtype error, taken over the same rows, and u x max|golden|. The rows
(sampled_rows) are the first and the last; both sides of every power-of-two boundary
from 2**10 up (where 16-bit and 32-bit indices wrap); both sides of the tile boundaries
of 64 and 128, at the start and at the last whole tile; the rows just past 65,535 (a
CUDA grid's second dimension); and a seeded random sample of RANDOM_ROWS rows, or of a
quarter of the rows where that is fewer (decode: each of a few queries reads every key,
so a row costs a whole cache). Every batch element and head is checked at those rows; a
case of at most EVERY_ROW_UP_TO rows, at every row.

The backward pass (sdpa_vjp, sampled_vjp.py) is checked at the same query rows for dq,
and at key columns for dk and dv chosen by the same rule over the keys (its own seed):
the first and the last key, both sides of every power of two from 2**10, of the tiles
of 64 and 128, the keys just past 65,535, and a seeded random sample.
"""

from __future__ import annotations

import zlib

import numpy as np


#: rows of the seeded random sample (at most a quarter of the rows)
RANDOM_ROWS = 32
#: a case of at most this many query rows is checked at every row
EVERY_ROW_UP_TO = 4
#: tile sizes whose boundaries are checked
TILES = (64, 128)
#: the first power of two whose boundary is checked
FIRST_POWER = 10
#: the ops a sampled golden can check
OPS = ("sdpa", "sdpa_lse", "sdpa_vjp")
#: the outputs checked at sampled key columns (the others: at sampled query rows)
KEY_OUTPUTS = ("dk", "dv")


def is_sampled(expect: dict) -> bool:
    """Does this expectation (a case's expect, or a policy outcome) ask for sampled rows?"""
    return expect.get("golden") == "sampled"


def sampled_rows(lq: int, seed: int) -> np.ndarray:
    """The query rows checked out of lq, ascending (see the module docstring)."""
    if lq <= EVERY_ROW_UP_TO:
        return np.arange(lq, dtype=np.int64)
    chosen = {0, lq - 1, 65535, 65536, 65537}
    power = FIRST_POWER
    while 2 ** power <= lq:
        chosen.update((2 ** power - 1, 2 ** power))
        power += 1
    for tile in TILES:
        last = (lq // tile) * tile
        chosen.update((tile - 1, tile, last - 1, last))
    drawn = min(RANDOM_ROWS, lq // 4)
    chosen.update(np.random.RandomState(seed).choice(lq, size=drawn, replace=False).tolist())
    return np.array(sorted(r for r in chosen if 0 <= r < lq), dtype=np.int64)


def seed_of(case, variant) -> int:
    """The random sample's seed: fixed by the case id and variant label."""
    return zlib.crc32(f"{case.id}[{variant.label}]".encode())


def rows_for(case, variant, lq: int) -> np.ndarray:
    return sampled_rows(lq, seed_of(case, variant))


def columns_for(case, variant, lk: int) -> np.ndarray:
    """The key columns at which dk and dv are checked: sampled_rows' rule over the keys,
    its random sample seeded apart from the rows'."""
    return sampled_rows(lk, seed_of(case, variant) ^ 0x5EED)


def positions_for(case, variant, name: str, arrays) -> tuple[np.ndarray, int]:
    """(the sampled indices of output `name` along its row axis, that axis' length): key
    columns for dk and dv, query rows for the rest."""
    if name in KEY_OUTPUTS:
        lk = np.shape(arrays["k"])[-2]
        return columns_for(case, variant, lk), lk
    lq = np.shape(arrays["q"])[-2]
    return rows_for(case, variant, lq), lq


def describe_rows(rows, lq: int, shown: int = 12, what: str = "query rows") -> str:
    """The row (or key column) set in words, for failure messages and reports."""
    rows = [int(r) for r in rows]
    listed = ", ".join(map(str, rows[:shown])) + (f", ... {rows[-1]}" if len(rows) > shown
                                                  else "")
    return f"{len(rows)} sampled {what} of {lq:,} ({listed})"


def describe(name: str, positions, length: int) -> str:
    """describe_rows of output `name`'s sampled positions (key columns of dk and dv)."""
    return describe_rows(positions, length,
                         what="key columns" if name in KEY_OUTPUTS else "query rows")


def select(output: np.ndarray, name: str, rows) -> np.ndarray:
    """The sampled rows of a backend's output: `out` along its row axis (-2), `lse`
    along its last."""
    return output[..., rows] if name == "lse" else output[..., rows, :]


def row_axis(name: str, ndim: int) -> int:
    return ndim - 1 if name == "lse" else ndim - 2
