"""Known bug: the keys' document ids do not travel with their block: a rank masks every
block it receives with the ids of its own keys, so document boundaries are drawn at the
wrong places on every block but its own.

Upstream: modelled on ring attention over packed sequences where K and V are rotated
around the ring but the key segment ids are not (JAX ring attention under shard_map that
ppermutes k and v alone; varlen rings that keep the local cu_seqlens for a received block)."""

from attention_conformance.backends import rules
from attention_conformance.backends.torch_ring import TorchRingBackend


class DocumentIdsLeftBehind(TorchRingBackend):
    """Key document ids left behind: each received block masked with the rank's own key ids."""

    name = "bad-document-ids-left-behind"

    def _allowed(self, ring, source):
        structure = dict(ring["structure"])
        q_ids = structure.pop("q_segment_ids", None)
        kv_ids = structure.pop("kv_segment_ids", None)
        keep = super()._allowed({**ring, "structure": structure}, source)
        if q_ids is None:
            return keep
        own = rules.shard_allowed(ring["shard"], ring["rank"], ring["ndim"],
                                  q_segment_ids=q_ids, kv_segment_ids=kv_ids)
        return keep & own
