"""A FlashAttention-style forward kernel in Triton, certified on the CPU through Triton's
interpreter (TRITON_INTERPRET=1; docs/adding-a-backend.md, "A Triton kernel on the CPU").

One program computes a BLOCK_M x Dv tile of the output for one (batch, head): it walks
the keys BLOCK_N at a time with an online softmax in float32, skips the key blocks that
causal attention hides, and masks the keys of the last, partial block. Plug it in with
    --backend examples/triton_attention/flash_forward.py:TritonFlashForward
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: no GPU needed

import numpy as np
import torch
import triton
import triton.language as tl

BLOCK_M, BLOCK_N = 32, 32


@triton.jit
def _forward(Q, K, V, O, LSE, scale, Lq, Lk, D, DV, heads, group, offset,
             CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    start_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // heads, bh % heads
    kv = b * (heads // group) + h // group          # grouped-query: h reads kv head h // group
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    d, dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    q = tl.load(Q + (bh * Lq + rows[:, None]) * D + d[None, :],
                mask=(rows[:, None] < Lq) & (d[None, :] < D), other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    end = Lk
    if CAUSAL:                                  # key j is visible to row i when j <= i + offset
        end = tl.minimum(Lk, (start_m + 1) * BLOCK_M + offset)
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(K + (kv * Lk + cols[None, :]) * D + d[:, None],
                    mask=(cols[None, :] < Lk) & (d[:, None] < D), other=0.0)
        s = tl.dot(q, k, out_dtype=tl.float32) * scale
        visible = cols[None, :] < Lk
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + offset)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # a row with nothing visible yet
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + (kv * Lk + cols[:, None]) * DV + dv[None, :],
                    mask=(cols[:, None] < Lk) & (dv[None, :] < DV), other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, out_dtype=tl.float32)
        m_i = m_new
    empty = l_i == 0.0                          # every key hidden: zeros, lse -inf
    out = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, l_i)[:, None])
    tl.store(O + (bh * Lq + rows[:, None]) * DV + dv[None, :], out.to(O.dtype.element_ty),
             mask=(rows[:, None] < Lq) & (dv[None, :] < DV))
    lse = tl.where(empty, float("-inf"), m_i + tl.log(tl.where(empty, 1.0, l_i)))
    tl.store(LSE + bh * Lq + rows, lse, mask=rows < Lq)


class TritonFlashForward:
    """sdpa and sdpa_lse in float32 and float16: broadcast batch dims, grouped-query heads,
    causal either way, a scale; anything else (a mask, a bias, ...) is unsupported."""

    name = "triton-flash-forward"
    dtypes = {"float32", "float16"}
    dtype_notes = {"bfloat16": "Triton 3.9.0's interpreter gives tl.dot of bfloat16 inputs "
                               "wrongly (errors of ~1e10 on a 16 x 16 product) and truncates "
                               "float32 to bfloat16 rather than rounding; on a GPU it takes it"}
    policy = {"fully_masked_rows": "zeros", "neg_inf_bias_rows": "nan",
              "masked_key_nan": "ignored", "masked_value_nan": "propagates",
              "accumulation": "float32", "padded_query_rows": "zeros"}
    versions = {"triton": triton.__version__, "torch": torch.__version__,
                "device": "cpu (TRITON_INTERPRET=1)"}
    paths = {"sdpa": "native: the Triton kernel", "sdpa_lse": "native: the Triton kernel"}

    def sdpa(self, q, k, v, *, causal=None, scale=None):
        return self._run(q, k, v, causal, scale)[0]

    def sdpa_lse(self, q, k, v, *, causal=None, scale=None):
        out, lse = self._run(q, k, v, causal, scale)
        return out, lse.astype(np.float32)      # float32 beside float16 too (the interface's)

    def _run(self, q, k, v, causal, scale):
        if q.ndim < 2 or not k.ndim == v.ndim == q.ndim:
            raise NotImplementedError("takes q, k and v of one rank")
        if q.ndim > 2 and (q.shape[-3] % k.shape[-3] or k.shape[-3] != v.shape[-3]):
            raise NotImplementedError("takes kv heads that divide the query heads")
        lead = np.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
        h, hk = (q.shape[-3], k.shape[-3]) if q.ndim > 2 else (1, 1)
        (lq, d), (lk, dv) = q.shape[-2:], v.shape[-2:]
        b = int(np.prod(lead))
        t = [torch.from_numpy(np.array(np.broadcast_to(x, lead + x.shape[-3:] if x.ndim > 2
                                                       else x.shape), order="C"))
             .reshape(b, -1, *x.shape[-2:]) for x in (q, k, v)]
        out = torch.empty((b, h, lq, dv), dtype=t[0].dtype)
        lse = torch.empty((b, h, lq), dtype=torch.float32)
        offset = lk - lq if causal == "bottom_right" else 0
        grid = (triton.cdiv(lq, BLOCK_M), b * h)
        _forward[grid](*t, out, lse, d ** -0.5 if scale is None else scale, lq, lk, d, dv,
                       h, h // hk, offset, CAUSAL=causal is not None,
                       BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                       BLOCK_D=max(16, triton.next_power_of_2(d)),
                       BLOCK_DV=max(16, triton.next_power_of_2(dv)))
        shape = lead + q.shape[-3:-1] if q.ndim > 2 else q.shape[:-1]
        return out.reshape(*shape, dv).numpy(), lse.reshape(shape).numpy()

