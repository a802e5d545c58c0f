"""Known bug: the last page of a sequence read in full, as if every page were full (the
length rounded up to a whole number of pages), so the slots past it are attended."""

from _plant import Planted
from attention_conformance.backends import rules


class LastPageReadInFull(Planted):
    """Last page read in full: the slots past a sequence's length taken as its tokens."""

    def paged_sdpa(self, q, k_pages, v_pages, *, block_table, kv_lengths, page_layout="NHD",
                   **params):
        size = k_pages.shape[1 if page_layout == "NHD" else 2]
        full = [-(-n // size) * size for n in kv_lengths]
        k, v = rules.gather_pages(k_pages, v_pages, block_table, full, page_layout)
        return self.sdpa(q, k, v, kv_lengths=full, **params)
