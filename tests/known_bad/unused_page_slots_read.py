"""Known bug: every page a block table lists is read and the keys past a sequence's
length are masked, so garbage there (NaN) still reaches the output through P V (0 x NaN)."""

from _plant import Planted
from attention_conformance.backends import rules


class UnusedPageSlotsRead(Planted):
    """Unused page slots read: all listed pages gathered, keys past the length masked."""

    def paged_sdpa(self, q, k_pages, v_pages, *, block_table, kv_lengths, page_layout="NHD",
                   **params):
        size = k_pages.shape[1 if page_layout == "NHD" else 2]
        listed = [len(row) * size for row in block_table]
        k, v = rules.gather_pages(k_pages, v_pages, block_table, listed, page_layout)
        lengths = [min(n, k.shape[-2]) for n in kv_lengths]
        return self.sdpa(q, k, v, kv_lengths=lengths, **params)
