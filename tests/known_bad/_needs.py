"""Which kind of case can reveal a planted bug that not every case can see.

A bug listed here is only caught once the spec has a case of its kind; while it has
none, tests/meta/test_known_bad.py counts the bug as waiting for a case (an expected
failure), and tests/known_bad/revealing/ holds one case of each kind to show that the
suite's checks catch the bug given such a case.
"""

from __future__ import annotations

import numpy as np

from attention_conformance.golden import reference
from attention_conformance.golden.inputs import build_inputs


def _variant_inputs(case):
    return [build_inputs(case.inputs, variant.dims) for variant in case.variants]


def _token_names(case):
    return {"self_attention": ("x", "x"), "multi_head_attention": ("query", "key")}.get(
        case.op, ("q", "k"))


def causal_with_lq_ne_lk(case):
    q, k = _token_names(case)
    return bool(case.params.get("causal")) and k in case.inputs and any(
        a[q].shape[-2] != a[k].shape[-2] for a in _variant_inputs(case))


def _largest_score(case, arrays):
    """The largest score that reaches the softmax (allowed by mask, causal and window)."""
    if case.op == "softmax":
        scores, keep = arrays["x"], True
    elif case.op in ("attention_weights", "sdpa", "sdpa_vjp"):
        q, k, p = arrays["q"], reference._expand_kv(arrays["q"], arrays["k"]), case.params
        scale = 1 / np.sqrt(q.shape[-1]) if p.get("scale") is None else p["scale"]
        scores = reference._logits(q, k, scale=scale, softcap=p.get("softcap"),
                                   bias=arrays.get("bias"))
        keep = reference.allowed_keys(q.shape[-2], k.shape[-2], causal=p.get("causal"),
                                      window=p.get("window")) & arrays.get("mask", True)
    else:
        return -np.inf
    live = np.broadcast_to(keep, scores.shape) & np.isfinite(scores)
    return float(np.max(np.where(live, scores, -np.inf), initial=-np.inf))


def scores_overflow(case):
    """exp overflows past 88.7 in float32 (the compute dtype of every dtype but float64),
    and past 709.8 in float64."""
    limit = 90.0 if set(case.dtypes) - {"float64"} else 710.0
    return any(_largest_score(case, a) > limit for a in _variant_inputs(case))


def grouped_query(case):
    if case.op == "multi_head_attention":
        heads = case.params["num_heads"]
        return 1 < (case.params.get("num_kv_heads") or heads) < heads
    if case.op not in ("attention_weights", "sdpa", "sdpa_vjp"):
        return False
    return any(a["q"].ndim >= 3 and a["k"].ndim >= 3 and 1 < a["k"].shape[-3] < a["q"].shape[-3]
               for a in _variant_inputs(case))


def bias_over_key_tiles(case, tile=16):
    """A bias over more keys than one tile of `tile` (the tiled known-bad adapters' size)."""
    if "bias" not in case.inputs or case.op not in ("attention_weights", "sdpa", "sdpa_vjp"):
        return False
    return any(a["k"].shape[-2] > tile for a in _variant_inputs(case))


def _row_largest_scores(case, arrays):
    """The largest score that reaches the softmax in each query row (-inf: no key)."""
    if case.op not in ("attention_weights", "sdpa", "sdpa_vjp"):
        return np.array([])
    q, k, p = arrays["q"], reference._expand_kv(arrays["q"], arrays["k"]), case.params
    scale = 1 / np.sqrt(q.shape[-1]) if p.get("scale") is None else p["scale"]
    scores = reference._logits(q, k, scale=scale, softcap=p.get("softcap"),
                               bias=arrays.get("bias"))
    keep = reference.allowed_keys(q.shape[-2], k.shape[-2], causal=p.get("causal"),
                                  window=p.get("window")) & arrays.get("mask", True)
    live = np.broadcast_to(keep, scores.shape) & np.isfinite(scores)
    return np.max(np.where(live, scores, -np.inf), axis=-1, initial=-np.inf)


def row_scores_below_minus_5e4(case):
    """Some query row whose every allowed score lies below -5e4 (a finite sentinel)."""
    return any(np.any(np.isfinite(m) & (m < -5e4))
               for a in _variant_inputs(case) for m in [_row_largest_scores(case, a)])


#: bug -> (the kind of case that reveals it, a test of a case for being of that kind)
NEEDS = {
    "bias_ignored_with_mask": ("case with both a mask and a bias",
                               lambda c: {"mask", "bias"} <= set(c.inputs)),
    "causal_alignment_swapped": ("causal case with Lq != Lk", causal_with_lq_ne_lk),
    "gqa_heads_tiled": ("grouped-query case (1 < kv heads < query heads)", grouped_query),
    "key_padding_mask_inverted": ("case with a boolean mask", lambda c: "mask" in c.inputs),
    "nan_fully_masked_rows": ("case with a fully_masked_rows policy",
                              lambda c: "fully_masked_rows" in c.expect.get("policy", {})),
    "no_max_subtraction": ("softmax or attention case whose scores overflow exp (past 88 in "
                           "float32, 709 in float64)", scores_overflow),
    "tiled_bias_column_offset": ("case with a bias over more than one key tile of 16",
                                 bias_over_key_tiles),
    "tiled_finite_initial_max": ("case with a query row whose allowed scores all lie below "
                                 "-5e4", row_scores_below_minus_5e4),
    "vjp_missing_scale": ("sdpa_vjp case with a scale other than 1",
                          lambda c: c.op == "sdpa_vjp" and c.params.get("scale") != 1),
    "block_table_16bit_ids": ("paged_sdpa case with a block id above 65,535",
                              lambda c: c.op == "paged_sdpa" and any(
                                  i > 65535 for row in c.params["block_table"] for i in row)),
    "last_page_read_in_full": ("paged_sdpa case whose last page is partly filled",
                               lambda c: c.op == "paged_sdpa"),
    "unused_page_slots_read": ("paged_sdpa case whose block table lists pages past a length",
                               lambda c: c.op == "paged_sdpa"),
    "lse_base2_merged_as_e": ("merge_states case", lambda c: c.op == "merge_states"),
    "empty_state_merged_as_zero_over_zero": ("merge_states case with a row of empty states",
                                             lambda c: c.op == "merge_states"),
    "inf_lse_taken_as_real_state": ("merge_states case with an lse of +inf",
                                    lambda c: c.op == "merge_states"),
    "qv_default_scale_from_dk": ("sdpa case with qv and the default scale",
                                 lambda c: "qv" in c.inputs and c.params.get("scale") is None),
    "strides_read_as_packed": ("case with a strided input layout", lambda c: bool(c.layout)),
}
