"""Known bug: the sink joins the row sum as exp(sink - m) with the running max m as it
is, never raised to the sink: a row without keys (m = -inf) gets an infinite sum (lse
+inf instead of the sink), and a sink far above every score overflows.

Upstream: NVIDIA/cudnn-frontend PR 333 (block-sparse attention, review of
csrc/utils/softmax.py: "Handle sink_val when the row has no finite scores": with
row_max still -inf the sink's contribution becomes inf and the final LSE NaN instead of
the finite sink value).
"""

import numpy as np

from _tiled import TiledPlanted


class TiledSinkUnguardedMax(TiledPlanted):
    """The sink added to l as exp(sink - m), m the keys' running max (maybe -inf)."""

    def _fold_sink(self, m, l, acc, sink):
        return m, l + np.exp(sink - m), acc
