"""Known bug (ROCm/ATOM#702): block ids stored in 16 bits, so an id above 65,535 reads
another page (its low 16 bits)."""

import numpy as np

from _plant import Planted


class BlockTable16bitIds(Planted):
    """Block table read with 16-bit ids: page 65,537 becomes page 1."""

    def paged_sdpa(self, q, k_pages, v_pages, *, block_table, kv_lengths, **params):
        table = [np.asarray(row, dtype=np.int64).astype(np.uint16).tolist() for row in block_table]
        return super().paged_sdpa(q, k_pages, v_pages, block_table=table,
                                  kv_lengths=kv_lengths, **params)
