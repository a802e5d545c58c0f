"""ONNX reference backend: one-node ONNX ``Attention`` models run by
``onnx.reference.ReferenceEvaluator``, the operator's executable definition in NumPy.

The models and the mapping of every op are those of ``backends/_onnx.py`` (shared with
the onnxruntime backend), at the newest opset the installed onnx defines for
``Attention`` (25 with onnx 1.23): windows go in natively as ``left_window_size`` /
``right_window_size``, aligned by the same ``nonpad_kv_seqlen`` offset as bottom-right
causal. One evaluator is kept per signature (shapes, dtypes, attributes).

- ``sdpa``, ``attention_weights`` (``qk_matmul_output`` mode 3), ``scores`` (mode 0):
  native ``Attention``; ``softmax``: a ``Softmax`` node;
- ``self_attention`` / ``multi_head_attention``: ``MatMul`` nodes around one
  ``Attention`` node on 3-D inputs;
- ``sdpa_vjp``: unsupported (the evaluator runs no gradient).

Declared policies, as the evaluator behaves (checked by the policy cases):
- ``fully_masked_rows: zeros``, ``neg_inf_bias_rows: zeros``: the operator's
  fully-masked-row guard;
- ``masked_key_nan: propagates``: a boolean mask becomes a ``-inf`` bias that is
  added, and NaN + -inf is NaN;
- ``masked_value_nan: propagates``: ``P @ V`` with ``0 * NaN = NaN``.

Known differences (onnx 1.23; backends/expected_failures/onnx-reference.yaml): a given
``scale`` is a float32 attribute and the evaluator takes its square root in float32
even for float64 inputs (relative error ~3e-8); a negative scale gives NaN (the square
root of a negative number); bfloat16 runs the whole softmax in bfloat16.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from ._onnx import OPS, OnnxAttention, attention_opset


class OnnxReferenceBackend(OnnxAttention):
    """The attention interface on onnx's reference evaluator."""

    name = "onnx-reference"
    # checked bit for bit by the invariance cases (docs/interface.md, "Declared invariants")
    invariants = ("deterministic", "batch_invariant", "split_invariant")
    opset = attention_opset()
    native_window = opset >= 25
    policy = {
        "fully_masked_rows": "zeros",
        "neg_inf_bias_rows": "zeros",
        "masked_key_nan": "propagates",
        "masked_value_nan": "propagates",
        "accumulation": "input",
        # a padded query (past q_lengths) gets output, weight and dq rows of 0
        "padded_query_rows": "zeros",
    }
    paths = {
        "softmax": "native: a Softmax node",
        "scores": "native: Attention's qk_matmul_output, mode 0 (dot: scale 1; bilinear: "
                  "a MatMul by W first); additive has no Attention form (unsupported)",
        "attention_weights": "native: Attention's qk_matmul_output, mode 3",
        "sdpa": "native: Attention (GQA 4-D K/V; bottom-right causal via nonpad_kv_seqlen; "
                "windows as left/right_window_size from opset 25, else an explicit mask)",
        "self_attention": "composed: MatMul projections around one Attention node",
        "multi_head_attention": "composed: MatMul projections and W_o around one Attention "
                                "node on 3-D inputs (q_num_heads, kv_num_heads)",
        "sdpa_vjp": "unsupported: the reference evaluator has no gradient",
    }

    def __init__(self):
        super().__init__()
        self.versions = {"onnx": onnx.__version__, "opset": str(self.opset),
                         "numpy": np.__version__}
        self.policy = dict(self.policy)
        self.paths = dict(self.paths)

    def _session(self, model):
        return ReferenceEvaluator(model)

    def _run(self, session, output, feeds):
        with np.errstate(all="ignore"):  # NaN and inf are the cases' business, not warnings
            return session.run([output], feeds)[0]


assert set(OnnxReferenceBackend.paths) == set(OPS)
