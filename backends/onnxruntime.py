"""ONNX Runtime backend: one-node ONNX ``Attention`` models run by onnxruntime (CPU).

Each call builds (or takes from a cache keyed by shapes, dtypes and attributes) an
ONNX model whose one ``Attention`` node does the work, and runs it in an
``onnxruntime.InferenceSession`` on the CPU execution provider with one intra-op thread
(on the spec's tiny inputs a thread hand-off costs more than the arithmetic: with
onnxruntime's default thread pool the quick profile took 4 minutes instead of 15-35 s on
the project's 2-core machine). The models
and the mapping of every op are described in ``backends/_onnx.py``; in short:

- ``sdpa``: native ``Attention`` (opset 24, the newest for which onnxruntime registers
  a CPU kernel: at opset 25 it expands the operator's function body instead), GQA via
  4-D K/V with fewer heads, bottom-right causal via ``nonpad_kv_seqlen = Lk``; a window
  (opset 25 only) is folded into an explicit boolean ``attn_mask``.
- ``attention_weights``: the node's ``qk_matmul_output`` with mode 3; ``scores``: mode
  0 (``bilinear`` with a ``MatMul`` first; ``additive`` unsupported).
- ``self_attention`` / ``multi_head_attention``: ``MatMul`` nodes around one
  ``Attention`` node on 3-D inputs (``q_num_heads`` / ``kv_num_heads``).
- ``softmax``: a ``Softmax`` node. ``sdpa_vjp``: unsupported (plain onnxruntime has no
  gradient; that is onnxruntime-training).

Declared policies, as onnxruntime behaves (checked by the policy cases):
- ``fully_masked_rows: zeros`` and ``neg_inf_bias_rows: zeros``: the operator's
  fully-masked-row guard gives a zero row in Y and in the mode-3 weights;
- ``masked_key_nan: propagates``: a boolean mask is added as a ``-inf`` bias, and
  NaN + -inf is NaN;
- ``masked_value_nan: propagates``: ``P @ V`` with ``0 * NaN = NaN``.

Known differences (onnxruntime 1.32, CPU; backends/expected_failures/onnxruntime.yaml):
no float64 kernel, so float64 models run the operator's function body, which computes
``sqrt(scale)`` in float32 (relative error ~3e-8 in float64 results); there a negative
scale gives NaN, while the float32 kernel refuses a scale <= 0 when the session is
created; no bfloat16 kernel (unsupported).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as _OrtNotImplemented

from ._onnx import OPS, OnnxAttention


class OnnxruntimeBackend(OnnxAttention):
    """The attention interface on onnxruntime's CPU execution provider."""

    name = "onnxruntime"
    # checked bit for bit by the invariance cases (docs/interface.md, "Declared invariants")
    invariants = ("deterministic", "batch_invariant", "split_invariant")
    opset = 24
    native_window = False
    policy = {
        "fully_masked_rows": "zeros",
        "neg_inf_bias_rows": "zeros",
        "masked_key_nan": "propagates",
        "masked_value_nan": "propagates",
        "accumulation": "float32",
        # a padded query (past q_lengths) gets output, weight and dq rows of 0
        "padded_query_rows": "zeros",
    }
    paths = {
        "softmax": "native: a Softmax node",
        "scores": "native: Attention's qk_matmul_output, mode 0 (dot: scale 1; bilinear: "
                  "a MatMul by W first); additive has no Attention form (unsupported)",
        "attention_weights": "native: Attention's qk_matmul_output, mode 3",
        "sdpa": "native: Attention (opset 24; GQA 4-D K/V; bottom-right causal via "
                "nonpad_kv_seqlen; a window as an explicit attn_mask)",
        "self_attention": "composed: MatMul projections around one Attention node",
        "multi_head_attention": "composed: MatMul projections and W_o around one Attention "
                                "node on 3-D inputs (q_num_heads, kv_num_heads)",
        "sdpa_vjp": "unsupported: onnxruntime has no gradient (onnxruntime-training)",
    }

    def __init__(self):
        super().__init__()
        self.versions = {"onnxruntime": ort.__version__, "onnx": onnx.__version__,
                         "opset": str(self.opset), "numpy": np.__version__}
        self.policy = dict(self.policy)
        self.paths = dict(self.paths)
        self._options = ort.SessionOptions()
        self._options.intra_op_num_threads = 1
        self._options.inter_op_num_threads = 1
        self._options.log_severity_level = 4  # errors come back as exceptions

    def _session(self, model):
        try:
            return ort.InferenceSession(model.SerializeToString(), self._options,
                                        providers=["CPUExecutionProvider"])
        except _OrtNotImplemented as e:  # no kernel for this dtype
            raise NotImplementedError(f"onnxruntime: {e}") from None


assert set(OnnxruntimeBackend.paths) == set(OPS)
