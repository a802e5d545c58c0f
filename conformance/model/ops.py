"""The operations of the attention interface: one table that validation, the reference's
dispatch, the runner, properties, fuzzing, the command line and the docs all read.

Adding an op starts here (docs/contributing.md has the whole checklist).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import shapes
from .dtypes import FP8_DTYPES

#: the alignments of a causal mask when Lq != Lk (the `causal` param)
CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")
#: the score functions of the `scores` op (its `kind` param)
SCORE_KINDS = ("dot", "scaled_dot", "bilinear", "additive")


@dataclass(frozen=True)
class Op:
    name: str
    positional: tuple[str, ...]       # inputs passed positionally, in this order
    keyword_inputs: tuple[str, ...]   # optional array inputs, passed by keyword
    params: tuple[str, ...]           # keyword parameters (plain values)
    required_params: tuple[str, ...]
    outputs: tuple[str, ...]          # a tuple return is matched to these in order
    shapes: Callable                  # (input shapes, params) -> output shapes
    query_side: tuple[str, ...]       # inputs whose axis -2 runs over queries
    key_side: tuple[str, ...]         # inputs whose axis -2 runs over keys
    policy_aware: bool                # its result depends on the declared policies
    fuzzed: bool                      # drawn by `attention-conformance fuzz`
    summary: str
    #: outputs that follow `outputs` only when a keyword input is given: (output, input)
    optional_outputs: tuple[tuple[str, str], ...] = ()

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.positional + self.keyword_inputs

    def outputs_for(self, inputs) -> tuple[str, ...]:
        """The outputs of a call with these input names: `outputs`, then each optional
        output whose input is given (sdpa_vjp with `sink` also returns `d_sink`)."""
        if not self.optional_outputs:
            return self.outputs
        return self.outputs + tuple(out for out, given in self.optional_outputs
                                    if given in inputs)

    @property
    def all_outputs(self) -> tuple[str, ...]:
        return self.outputs + tuple(out for out, _ in self.optional_outputs)


_PIPELINE = ("causal", "scale", "softcap", "window")
#: per-batch sequence lengths (variable-length batches): lists of ints over dim 0
_LENGTHS = ("q_lengths", "kv_lengths")
#: packed documents: a document id per query and per key (lists of ints)
_SEGMENTS = ("q_segment_ids", "kv_segment_ids")
#: block-sparse masks: which (query block, key block) pairs are computed, and block sizes
_BLOCKS = ("block_mask", "block_size")
#: the params of the attention ops that take lengths and structure
_ATTENTION = _PIPELINE + _LENGTHS + _SEGMENTS + _BLOCKS
#: fp8: the factor each stored q, k, v is multiplied by, per tensor or per (batch, kv head)
DESCALES = ("q_descale", "k_descale", "v_descale")
#: fp8: the output written in the case's fp8 format as out / o_scale (its dequantization
#: factor: FlashInfer's o_scale, vLLM's output_scale)
OUTPUT_SCALE = ("o_scale",)
#: the case computed over W ranks by the backend's distributed form (model/sharding.py)
_SHARDING = ("sharding",)
#: a paged KV cache: the pages of each sequence, its length, and the layout of a page
_PAGED = ("block_table", "kv_lengths", "page_layout")
#: the page layouts (the `page_layout` param): (pages, page_size, Hkv, D) or (pages, Hkv, page_size, D)
PAGE_LAYOUTS = shapes.PAGE_LAYOUTS

OPS: dict[str, Op] = {op.name: op for op in (
    Op("softmax", ("x",), (), ("axis",), (), ("out",), shapes.softmax, (), (),
       False, False, "softmax of x along an axis"),
    Op("scores", ("q", "k"), ("w", "u", "v"), ("kind", "scale"), ("kind",), ("out",),
       shapes.scores, ("q",), ("k",), False, False,
       "the score matrix of a score function: dot, scaled_dot, bilinear or additive"),
    Op("attention_weights", ("q", "k"), ("mask", "bias", "sink"), _ATTENTION, (), ("out",),
       shapes.attention_weights, ("q",), ("k",), True, True,
       "softmax(q kᵀ · scale + bias, masked) over the keys"),
    Op("sdpa", ("q", "k", "v"), ("mask", "bias", "sink", "qv") + DESCALES,
       _ATTENTION + _SHARDING + OUTPUT_SCALE, (), ("out",), shapes.sdpa,
       ("q", "qv"), ("k", "v"), True, True, "scaled dot-product attention: weights @ v"),
    Op("sdpa_lse", ("q", "k", "v"), ("mask", "bias", "sink"), _PIPELINE + _SHARDING, (),
       ("out", "lse"),
       shapes.sdpa_lse, ("q",), ("k", "v"), True, True,
       "sdpa and the natural log-sum-exp of each row's scores (FlashAttention's softmax_lse)"),
    Op("self_attention", ("x", "w_q", "w_k", "w_v"), ("mask",), ("causal",), (), ("out",),
       shapes.self_attention, ("x",), ("x",), True, False,
       "sdpa of x w_q, x w_k, x w_v (one head)"),
    Op("multi_head_attention", ("query", "key", "value"), ("w_q", "w_k", "w_v", "w_o", "mask"),
       ("num_heads", "num_kv_heads", "causal"), ("num_heads",), ("out",),
       shapes.multi_head_attention, ("query",), ("key", "value"), True, False,
       "projections, heads (grouped-query with num_kv_heads), sdpa, output projection"),
    Op("sdpa_vjp", ("q", "k", "v", "d_out"), ("mask", "bias", "sink"), _ATTENTION + _SHARDING,
       (), ("dq", "dk", "dv"), shapes.sdpa_vjp, ("q",), ("k", "v"), True, True,
       "the gradients of sdpa for an upstream gradient d_out (and d_sink with a sink)",
       (("d_sink", "sink"),)),
    Op("paged_sdpa", ("q", "k_pages", "v_pages"), ("sink", "qv") + DESCALES,
       ("causal", "scale", "softcap", "window", "q_lengths") + _PAGED + OUTPUT_SCALE, _PAGED[:2],
       ("out",),
       shapes.paged_sdpa, ("q", "qv"), (), True, False,
       "sdpa of each sequence over its keys and values in a paged KV cache (block table)"),
    Op("merge_states", ("outs", "lses"), (), (), (), ("out", "lse"), shapes.merge_states,
       (), (), True, False,
       "N partial attention states (output, lse) merged into one, in the declared lse base"),
)}


def op(name: str) -> Op:
    return OPS[name]


def takes_dtype(name: str, dtype: str) -> bool:
    """Whether a case of op `name` may have this dtype: a plain dtype any op; an fp8 one
    only an op that takes descale factors (DESCALES), by which its inputs are dequantized."""
    return dtype not in FP8_DTYPES or DESCALES[0] in OPS[name].inputs


def ops_taking(dtype: str, among=None) -> tuple[str, ...]:
    """The ops (of `among`, default every op) a case of this dtype may have."""
    return tuple(name for name in (OPS if among is None else among) if takes_dtype(name, dtype))


def outputs_for(name: str, inputs) -> tuple[str, ...]:
    """Names of op `name`'s outputs for a call with these input names."""
    return OPS[name].outputs_for(inputs)


def output_shapes(name: str, input_shapes: dict, params: dict) -> tuple[tuple, ...]:
    """Shapes of op `name`'s outputs; ValueError if the inputs are inconsistent."""
    if name not in OPS:
        raise ValueError(f"unknown op {name!r}")
    return OPS[name].shapes(input_shapes, params)
