"""Known bug: descale factors given per (batch, kv head), as FlashAttention 3 and
FlashInfer take them, applied as one per tensor (the first), so every head but one is
scaled wrongly (the issue's "descale factors are per (batch, kv head) in FA3 and
FlashInfer")."""

import numpy as np

from _plant import Planted
from attention_conformance.backends.numpy import NumpyBackend


def _first(descale):
    return None if descale is None else np.asarray(descale).reshape(-1)[:1]


class DescalePerTensorNotPerHead(Planted):
    """Descale per tensor where per (batch, kv head) was given: its first value for all."""

    def sdpa(self, q, k, v, *, q_descale=None, k_descale=None, v_descale=None, **params):
        return NumpyBackend.sdpa(self, q, k, v, q_descale=_first(q_descale),
                                 k_descale=_first(k_descale), v_descale=_first(v_descale),
                                 **params)
