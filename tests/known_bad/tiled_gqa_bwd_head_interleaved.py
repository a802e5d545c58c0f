"""Known bug: the backward sums kv gradients over interleaved query heads (h % Hkv).

The forward maps query head h to kv head h // (Hq / Hkv); the backward reduces dK and dV
over heads h with h % Hkv = kv head. Upstream: XunhaoLai/native-sparse-attention-triton
issue 27 (backward_dkdv splits the flat head index with a different divisor than the
forward); HazyResearch/HipKittens PR 22 (GQA head mapping, also in the backward kernels).
"""

from _tiled import TiledPlanted


class TiledGqaBwdHeadInterleaved(TiledPlanted):
    """GQA backward head mapping wrong: dk, dv summed over h % Hkv instead of h // group."""

    @staticmethod
    def _group_sum(g, shape):
        if g.shape == tuple(shape):
            return g
        hkv = shape[-3]
        return g.reshape(*g.shape[:-3], g.shape[-3] // hkv, hkv, *g.shape[-2:]).sum(axis=-4)
