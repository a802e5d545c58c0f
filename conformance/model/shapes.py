"""Output shapes of each op from its input shapes (ValueError when they are inconsistent).

ops.py names one of these per op; validation runs them on every case, the runner on
every backend output.
"""

from __future__ import annotations

import operator

import numpy as np


def broadcast(*shapes) -> tuple[int, ...]:
    """np.broadcast_shapes of shapes given as sequences of ints, without making an array
    of each (its cost, several us: the runner checks the shapes of every output);
    ValueError when they do not broadcast or a dim is negative."""
    ndim = max(map(len, shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        for axis, size in enumerate(shape, ndim - len(shape)):
            size = operator.index(size)
            if size < 0:
                raise ValueError(f"negative dimension {size}")
            if size != 1 and out[axis] != size:
                if out[axis] != 1:
                    raise ValueError(f"dimension {size} against {out[axis]}")
                out[axis] = size
    return tuple(out)


def _bcast(*shapes, what):
    try:
        return broadcast(*shapes)
    except ValueError:
        raise ValueError(f"{what}: shapes {' and '.join(map(str, shapes))} do not broadcast") from None


def _width(a, b, name_a, name_b, axis_a=-1, axis_b=-1):
    if a[axis_a] != b[axis_b]:
        raise ValueError(f"{name_a} has width {a[axis_a]} but {name_b} has {b[axis_b]}"
                         f" ({name_a} {a}, {name_b} {b})")


def attention(q, k, v, mask, bias):
    """Score shape and output shape of attention over q, k (and v)."""
    if len(q) < 2 or len(k) < 2:
        raise ValueError("q and k need at least two dims (tokens, features)")
    _width(q, k, "q", "k")
    kb = list(k[:-2])
    if len(q) >= 3 and len(k) >= 3 and k[-3] not in (1, q[-3]):
        if q[-3] % k[-3]:
            raise ValueError(f"{q[-3]} query heads are not a multiple of {k[-3]} kv heads")
        kb[-1] = q[-3]
    batch = _bcast(q[:-2], tuple(kb), what="q and k batch dims")
    score = batch + (q[-2], k[-2])
    for name, shape in (("mask", mask), ("bias", bias)):
        if shape is not None:
            if len(_bcast(shape, score, what=f"{name} against scores {score}")) != len(score):
                raise ValueError(f"{name} {shape} has more dims than the scores {score}")
    if v is None:
        return score, score
    if v[-2] != k[-2]:
        raise ValueError(f"k has {k[-2]} tokens but v has {v[-2]}")
    return score, batch + (q[-2], v[-1])


def softmax(s, params):
    axis = params.get("axis", -1)
    if not -len(s["x"]) <= axis < len(s["x"]):
        raise ValueError(f"axis {axis} is out of range for x of {len(s['x'])} dims")
    return (s["x"],)


def scores(s, params):
    q, k, kind = s["q"], s["k"], params["kind"]
    if kind in ("dot", "scaled_dot"):
        _width(q, k, "q", "k")
    elif kind == "bilinear":
        _width(q, s["w"], "q", "w", -1, 0)
        _width(k, s["w"], "k", "w", -1, 1)
    elif kind == "additive":
        _width(k, s["w"], "k", "w", -1, 0)
        _width(q, s["u"], "q", "u", -1, 0)
        _width(s["w"], s["u"], "w", "u")
        _width(s["w"], s["v"], "w", "v", -1, 0)
    return (_bcast(q[:-2], k[:-2], what="q and k batch dims") + (q[-2], k[-2]),)


def sink(shape, score):
    """A sink (one logit per query head) broadcasts to the score shape without its last
    two axes, (*batch, Hq): `(Hq,)`, `(1,)` or `(B, Hq)`."""
    if shape is None:
        return
    if len(shape) < 1:
        raise ValueError("sink needs at least one dim (one logit per query head)")
    heads = tuple(score[:-2])
    if len(shape) > len(heads) or _bcast(shape, heads, what=f"sink against {heads}") != heads:
        raise ValueError(f"sink {shape} does not broadcast to the score shape's"
                         f" (*batch, Hq) = {heads}")


def descales(s, batch: int, kv_heads: int):
    """fp8 descale factors: each `(1,)` (the tensor) or `(B, Hkv)` (per batch element and
    kv head; then q, k and v are (B, H, L, D))."""
    for name in ("q_descale", "k_descale", "v_descale"):
        shape = s.get(name)
        if shape is None or tuple(shape) == (1,):
            continue
        if tuple(shape) != (batch, kv_heads):
            raise ValueError(f"{name} {tuple(shape)} is neither (1,) nor (B, Hkv) ="
                             f" {(batch, kv_heads)}")


def lengths(score, params, s):
    """q_lengths / kv_lengths: one int per element of dim 0 of the scores, each within
    0..Lq (0..Lk); q, k and v then have that batch dim (the scores' rank and dim 0)."""
    if params.get("q_lengths") is None and params.get("kv_lengths") is None:
        return
    given = [n for n in ("q_lengths", "kv_lengths") if params.get(n) is not None]
    if len(score) < 3:
        raise ValueError(f"{given[0]} needs a batch dim: the scores {score} have none")
    for name in ("q", "k", "v"):
        shape = s.get(name)
        if shape is not None and (len(shape) != len(score) or shape[0] != score[0]):
            raise ValueError(f"with q_lengths or kv_lengths, {name} {tuple(shape)} needs the"
                             f" batch dim of the scores {score} (same rank, same dim 0)")
    for name, full in (("q_lengths", score[-2]), ("kv_lengths", score[-1])):
        value = params.get(name)
        if value is None:
            continue
        if len(value) != score[0]:
            raise ValueError(f"{name} has {len(value)} lengths for a batch of {score[0]}"
                             f" (dim 0 of the scores {score})")
        bad = [n for n in value if not 0 <= n <= full]
        if bad:
            raise ValueError(f"{name} {bad[0]} is outside 0..{full}")


def segments(score, params):
    """q_segment_ids / kv_segment_ids, given together: Lq (Lk) ints shared by the batch, or
    one such list per element of dim 0 of the scores."""
    given = params.get("q_segment_ids") is not None, params.get("kv_segment_ids") is not None
    if not any(given):
        return
    if not all(given):
        raise ValueError("q_segment_ids and kv_segment_ids are given together")
    for name, size in (("q_segment_ids", score[-2]), ("kv_segment_ids", score[-1])):
        ids = params[name]
        rows = ids if isinstance(ids[0], list) else [ids]
        if rows is ids and (len(score) < 3 or len(ids) != score[0]):
            raise ValueError(f"{name} has {len(ids)} lists: one a batch element needs"
                             f" {score[0]} and a batch dim (the scores {score})")
        if any(len(row) != size for row in rows):
            raise ValueError(f"{name} needs {size} ids a list (the scores {score})")


def blocks(score, params):
    """block_mask with block_size = [Bq, Bk], given together: a 0/1 array whose last two
    axes are (ceil(Lq / Bq), ceil(Lk / Bk)) and whose leading axes broadcast to the
    scores' (at most their rank)."""
    given = params.get("block_mask") is not None, params.get("block_size") is not None
    if not any(given):
        return
    if not all(given):
        raise ValueError("block_mask and block_size are given together")
    try:
        shape = np.shape(np.asarray(params["block_mask"], dtype=np.int64))
    except ValueError:
        raise ValueError("block_mask is not a regular array (rows of unequal length)") from None
    size_q, size_k = params["block_size"]
    want = (-(-score[-2] // size_q), -(-score[-1] // size_k))
    if len(shape) < 2 or shape[-2:] != want:
        raise ValueError(f"block_mask {shape} needs last axes {want}: blocks of {size_q} x "
                         f"{size_k} over the scores {score}")
    if len(shape) > len(score):
        raise ValueError(f"block_mask {shape} has more dims than the scores {score}")
    lead = tuple(score[:-2])
    if _bcast(shape[:-2], lead, what="block_mask against the scores' batch and heads") != lead:
        raise ValueError(f"block_mask {shape} does not broadcast to the scores {score}")


def attention_weights(s, params):
    score = attention(s["q"], s["k"], None, s.get("mask"), s.get("bias"))[0]
    sink(s.get("sink"), score)
    lengths(score, params, s)
    segments(score, params)
    blocks(score, params)
    return (score,)


def qv(s, width):
    """The absorbed MLA form's qv (FlashAttention 3's): one row of width Dv per query."""
    if s.get("qv") is not None and tuple(s["qv"]) != tuple(s["q"][:-1]) + (width,):
        raise ValueError(f"qv {s['qv']} is not q's {s['q']} with the values' width {width}")


def sdpa(s, params):
    score, out = attention(s["q"], s["k"], s["v"], s.get("mask"), s.get("bias"))
    qv(s, s["v"][-1])
    sink(s.get("sink"), score)
    if any(s.get(name) is not None for name in ("q_descale", "k_descale", "v_descale")):
        per_head = len(s["q"]) == 4 and len(s["k"]) == 4 and s["q"][0] == s["k"][0] == s["v"][0]
        descales(s, *(s["k"][:2] if per_head else (0, 0)))
    lengths(score, params, s)
    segments(score, params)
    blocks(score, params)
    return (out,)


def sdpa_lse(s, params):
    out = sdpa(s, params)[0]
    return (out, out[:-1])


def sdpa_vjp(s, params):
    out = sdpa(s, params)[0]
    if tuple(s["d_out"]) != tuple(out):
        raise ValueError(f"d_out {s['d_out']} is not the output shape {out}")
    grads = (s["q"], s["k"], s["v"])
    return grads + ((s["sink"],) if s.get("sink") is not None else ())


def self_attention(s, params):
    x = s["x"]
    for w in ("w_q", "w_k", "w_v"):
        _width(x, s[w], "x", w, -1, 0)
    _width(s["w_q"], s["w_k"], "w_q", "w_k")
    q, v = x[:-1] + (s["w_q"][1],), x[:-1] + (s["w_v"][1],)
    return (attention(q, q, v, s.get("mask"), None)[1],)


def multi_head_attention(s, params):
    heads = params["num_heads"]
    kv_heads = params.get("num_kv_heads") or heads
    for w, x in (("w_q", "query"), ("w_k", "key"), ("w_v", "value")):
        _width(s[x], s[w], x, w, -1, 0)
    for w, h in (("w_q", heads), ("w_k", kv_heads), ("w_v", kv_heads)):
        if s[w][1] % h:
            raise ValueError(f"{w} width {s[w][1]} is not divisible by {h} heads")
    if s["w_q"][1] // heads != s["w_k"][1] // kv_heads:
        raise ValueError("w_q and w_k give different head widths")
    if heads % kv_heads:
        raise ValueError(f"{heads} heads are not a multiple of {kv_heads} kv heads")
    if s["w_o"][0] != heads * (s["w_v"][1] // kv_heads):
        raise ValueError(f"w_o has {s['w_o'][0]} rows, expected heads x value head width")
    batch = _bcast(s["query"][:-2], s["key"][:-2], s["value"][:-2], what="batch dims")
    if s["key"][-2] != s["value"][-2]:
        raise ValueError("key and value have different numbers of tokens")
    if s.get("mask") is not None:
        _bcast(s["mask"], batch + (heads, s["query"][-2], s["key"][-2]), what="mask")
    return (batch + (s["query"][-2], s["w_o"][1]),)


#: the page layouts of a paged KV cache (the `page_layout` param): tokens then heads
#: (FlashInfer's and vLLM's NHD) or heads then tokens (HND)
PAGE_LAYOUTS = ("NHD", "HND")


def page_pool(shape, layout) -> tuple[int, int, int, int]:
    """(num_pages, page_size, Hkv, D) of a page pool in its layout."""
    if len(shape) != 4:
        raise ValueError(f"a page pool has 4 dims (pages, page_size, heads, D), not {shape}")
    if layout not in PAGE_LAYOUTS:
        raise ValueError(f"page_layout {layout!r} is not NHD or HND")
    pages, a, b, width = shape
    return (pages, a, b, width) if layout == "NHD" else (pages, b, a, width)


def _block_table(table, kv_lengths, pages, page_size):
    """Each sequence's row lists at least the pages of its kv_lengths, every id a page."""
    if len(table) != len(kv_lengths):
        raise ValueError(f"block_table has {len(table)} rows for {len(kv_lengths)} kv_lengths")
    for b, (row, length) in enumerate(zip(table, kv_lengths)):
        if not isinstance(row, list) or -(-length // page_size) > len(row):
            raise ValueError(f"block_table row {b} lists too few pages for kv_lengths {length}"
                             f" (page_size {page_size})")
        bad = [i for i in row if not isinstance(i, int) or not 0 <= i < pages]
        if bad:
            raise ValueError(f"block_table row {b} has page id {bad[0]} outside 0..{pages - 1}")


def paged_sdpa(s, params):
    q = s["q"]
    k_pool = page_pool(s["k_pages"], params.get("page_layout", "NHD"))
    v_pool = page_pool(s["v_pages"], params.get("page_layout", "NHD"))
    if k_pool[:3] != v_pool[:3]:
        raise ValueError(f"k_pages {s['k_pages']} and v_pages {s['v_pages']} hold different pages")
    pages, page_size, heads, width = k_pool
    if len(q) != 4:
        raise ValueError(f"q of paged_sdpa is (B, Hq, Lq, Dk), not {q}")
    if q[-1] != width:
        raise ValueError(f"q has width {q[-1]} but the key pages {width}")
    if q[1] % heads:
        raise ValueError(f"{q[1]} query heads are not a multiple of {heads} kv heads")
    kv_lengths = params["kv_lengths"]
    _block_table(params["block_table"], kv_lengths, pages, page_size)
    qv(s, v_pool[3])
    score = paged_scores(s, params)
    sink(s.get("sink"), score)
    descales(s, q[0], heads)
    lengths(score, {k: params.get(k) for k in ("q_lengths", "kv_lengths")}, {"q": q})
    return (q[:3] + (v_pool[3],),)


def paged_scores(s, params) -> tuple:
    """(B, Hq, Lq, L): the scores of paged_sdpa over each sequence's keys, L the longest."""
    return tuple(s["q"][:3]) + (max(max(params["kv_lengths"]), 1),)


def merge_states(s, params):
    outs, lses = s["outs"], s["lses"]
    if len(outs) < 3 or tuple(lses) != tuple(outs[:-1]):
        raise ValueError(f"outs (N, *batch, Lq, Dv) and lses (N, *batch, Lq) do not match:"
                         f" {outs} and {lses}")
    return (tuple(outs[1:]), tuple(lses[1:]))


def score_shape(op: str, s: dict, params: dict) -> tuple | None:
    """The shape of the score matrix an op computes on the way (None: it computes none),
    for inputs whose shapes are already known to be consistent."""
    if op in ("attention_weights", "sdpa", "sdpa_lse", "sdpa_vjp"):
        return attention(s["q"], s["k"], None, s.get("mask"), s.get("bias"))[0]
    if op == "paged_sdpa":
        return paged_scores(s, params)
    if op == "self_attention":
        return s["x"][:-1] + (s["x"][-2],)
    if op == "multi_head_attention":
        batch = _bcast(s["query"][:-2], s["key"][:-2], s["value"][:-2], what="batch dims")
        return batch + (params["num_heads"], s["query"][-2], s["key"][-2])
    return None
