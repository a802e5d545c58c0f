"""PyTorch backend: a thin adapter from the attention interface to PyTorch's own ops.

NumPy arrays are copied into torch tensors on the backend's device (``device=None`` or
``"cpu"``: the CPU; ``"cuda"``, ``"cuda:N"``: a CUDA device, refused at construction when
there is none), the framework's public op is called, and the result is copied back into a
fresh NumPy array of the input dtype.

Each op's path (native: the framework's own op; composed: built from torch ops) is in
``TorchBackend.paths``. SDPA is called with ``is_causal`` for top-left causal alone,
``causal_lower_right`` for bottom-right alone and ``enable_gqa`` for grouped-query heads;
any other mix of mask, causal, window and bias is folded into one ``attn_mask``. The
composed paths (softcap, sinks, the lse) reproduce the native op's declared policies:
disallowed positions are *added* as ``-inf``, and a row with no allowed key gets zero
weights and gradients, as SDPA gives.

Known difference (torch 2.13 CPU, kept visible on purpose): with ``is_causal=True``
(top-left causal alone, or bottom-right with Lq == Lk) and Dk == Dv, SDPA takes its
flash kernel, which ignores a NaN in a causally hidden key (and, past one key block,
a NaN in a hidden value); every other path, and any explicit mask, propagates it. The
declaration says so by condition: ``masked_key_nan`` is ``propagates``, and ``per_row``
under causal alone (``policy_when``). fp8 (sdpa, paged_sdpa): torch's SDPA takes no
float8 on the CPU, so torch's own float8 cast to float32, times the descales, then SDPA.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import numpy as np
import torch
import torch.nn.functional as F

from . import _torch_mha, _torch_serving, rules
from ._torch_arrays import _mask_to_torch, _name, _to_numpy, _to_torch

_TORCH_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


# ---------------------------------------------------------------- masks


def _allowed(mask: torch.Tensor | None, lq: int, lk: int, causal, window):
    """The bool mask and-ed with the keys causal and window allow (rules.allowed), or
    None when there is neither."""
    return rules.and_masks(mask, _mask_to_torch(rules.allowed(lq, lk, causal, window)))


# ---------------------------------------------------------------- attention core


def _is_gqa(q: torch.Tensor, k: torch.Tensor) -> bool:
    hq, hkv = (q.shape[-3], k.shape[-3]) if q.dim() >= 3 and k.dim() >= 3 else (1, 1)
    return hq != hkv and hkv > 1 and hq % hkv == 0


def _broadcast(q, k, v, mask, bias, gqa: bool):
    """Expand q, k, v to one common batch shape (mask and bias shapes included)."""
    cut = 3 if gqa else 2
    shapes = [t.shape[:-cut] for t in (q, k, v, mask, bias) if t is not None]
    if shapes.count(shapes[0]) == len(shapes):      # nothing to expand (most calls)
        return q, k, v
    # numpy's rule, the same as torch's: torch.broadcast_shapes imports sympy at its first
    # call (~0.45 s), which nothing else in a certification run needs
    lead = np.broadcast_shapes(*shapes)
    return tuple(t.expand(*lead, *t.shape[-cut:]) for t in (q, k, v))


def _to_4d(t: torch.Tensor, rank: int, lead) -> torch.Tensor:
    """(..., X, Y, Z) at the common rank -> (B, X, Y, Z), the batch dims ``lead`` flattened
    into B: the layout of torch's fused kernels and of flex_attention."""
    t = t.reshape((1,) * (rank - t.dim()) + tuple(t.shape))
    if rank > 4:
        t = t.expand(*lead, *t.shape[-3:]).reshape(-1, *t.shape[-3:])
    return t


def _attend(q, k, v, *, mask=None, bias=None, causal=None, scale=None,
            softcap=None, window=None) -> torch.Tensor:
    """The sdpa path on tensors: native SDPA, or composed when softcap is given."""
    if softcap is not None:
        return _composed_lse(q, k, v, mask=mask, bias=bias, causal=causal, scale=scale,
                             softcap=float(softcap), window=window)[0]
    gqa = _is_gqa(q, k)
    q, k, v = _broadcast(q, k, v, mask, bias, gqa)
    lq, lk = q.shape[-2], k.shape[-2]
    kwargs = {"scale": None if scale is None else float(scale), "enable_gqa": gqa}
    if mask is None and bias is None and window is None and causal is not None:
        if causal == "top_left":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, **kwargs)
        if causal == "bottom_right":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=_lower_right(lq, lk), **kwargs)
    allowed = _allowed(mask, lq, lk, causal, window)
    attn_mask = allowed
    if bias is not None:
        attn_mask = bias if allowed is None else torch.where(allowed, bias, -math.inf)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **kwargs)


def _streams(params) -> bool:
    """Does torch compute this call without holding its scores (its flash kernel: causal
    top-left and nothing else)? rules.sized checks the size of every other call."""
    return params.get("causal") == "top_left" and all(
        params.get(name) is None for name in ("mask", "bias", "sink", "softcap", "window",
                                              "q_lengths", "kv_lengths"))


def _lower_right(lq: int, lk: int):
    # imported at the first use: torch.nn.attention.bias imports torch._dynamo (about as
    # long as torch itself), which a run without bottom-right causal never needs
    from torch.nn.attention.bias import causal_lower_right

    with warnings.catch_warnings():
        # torch warns that Lq > Lk "will produce NaNs"; its SDPA gives zero rows instead.
        warnings.filterwarnings("ignore", message="Lower right causal bias")
        return causal_lower_right(lq, lk)


def _composed_lse(q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
                  softcap=None, window=None):
    """(softmax(s) v, logsumexp(s)) of the score pipeline s with torch ops; a sink is one
    more score column (a key of value 0). torch has no public op returning the lse."""
    gqa = _is_gqa(q, k)
    q, k, v = _broadcast(q, k, v, mask, bias, gqa)
    lq, lk = q.shape[-2], k.shape[-2]
    if gqa:
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, -3), v.repeat_interleave(group, -3)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap is not None:
        if softcap <= 0:
            raise ValueError(f"softcap must be positive, got {softcap}")
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    allowed = _allowed(mask, lq, lk, causal, window)
    if allowed is not None:
        # added, not filled, as SDPA does: a NaN score at a disallowed key stays NaN
        s = s + torch.zeros((), dtype=s.dtype).masked_fill(~allowed, -math.inf)
    if sink is not None:
        s = torch.cat([s, sink[..., None, None].to(s.dtype).expand(*s.shape[:-1], 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)             # -inf for a row without keys
    empty = torch.isneginf(s).all(dim=-1, keepdim=True)
    zero = torch.zeros((), dtype=s.dtype)
    p = torch.where(empty, zero, torch.softmax(torch.where(empty, zero, s), dim=-1))
    return torch.matmul(p[..., :lk], v), lse


# ---------------------------------------------------------------- the backend


def _device(name: str, device, cuda_only: bool = False) -> torch.device:
    """The torch device a backend runs on; a device this machine lacks is refused here,
    at construction (so at load), never silently replaced by the CPU."""
    if device is None:
        device = "cuda" if cuda_only else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: unknown device {device!r}; torch backends take "
                         "cpu, cuda or cuda:N")
    if dev.type == "cpu":
        if cuda_only:
            raise RuntimeError(f"{name} is a CUDA kernel (torch has no CPU implementation "
                               f"of it): it cannot run on device {device!r}")
        return dev
    if not torch.cuda.is_available():
        raise RuntimeError(f"{name} needs a CUDA device ({device!r}); "
                           "torch.cuda.is_available() is False")
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index >= count:
        raise RuntimeError(f"{name}: no device {device!r}; torch sees {count} CUDA device(s)")
    return torch.device("cuda", index)


def _device_label(dev: torch.device) -> str:
    if dev.type == "cuda":
        return f"{dev} ({torch.cuda.get_device_name(dev)})"
    return str(dev)


class TorchBackend:
    """The attention interface on PyTorch (CPU by default; ``device="cuda"``, ``"cuda:N"``)."""

    name = "torch"
    dtypes = frozenset(_TORCH_DTYPES) | frozenset(_torch_serving.FP8)
    versions = {"torch": torch.__version__}
    policy = {
        "fully_masked_rows": "zeros",
        "neg_inf_bias_rows": "zeros",
        # a NaN key reaches every row through attn_mask and on the math kernel; under
        # causal alone, policy_when below
        "masked_key_nan": "propagates",
        "masked_value_nan": "propagates",
        "accumulation": "float32",
        # a padded query (past q_lengths) gets output, weight and dq rows of 0
        "padded_query_rows": "zeros",
        # every lse it returns or takes is a natural log
        "lse_base": "e",
    }
    #: causal alone (nothing to fold into attn_mask): the CPU flash kernel (4-D, Dk == Dv)
    #: skips hidden key blocks, so only rows whose visited blocks hold a NaN key get it
    policy_when = [
        {"when": {"causal": True, "mask": False, "window": False, "bias": False,
                  "lengths": False},
         "policy": {"masked_key_nan": "per_row"}},
    ]
    paths = {
        "softmax": "native: torch.softmax",
        "scores": "composed: torch.matmul / torch.tanh (torch has no score-function API)",
        "attention_weights": "native: F.scaled_dot_product_attention with V = identity(Lk) "
                             "(keeps SDPA's masking); composed with softcap, and with a sink "
                             "(one more score column of value 0: SDPA has no sink)",
        "sdpa": "native: F.scaled_dot_product_attention (is_causal, causal_lower_right, "
                "enable_gqa; mask/causal/window/bias folded into attn_mask); "
                "composed (torch ops) only with softcap, and with a sink (SDPA has none)",
        "self_attention": "composed projections (torch.matmul), then native SDPA",
        "multi_head_attention": "native: torch.nn.MultiheadAttention (bias=False); composed "
                                "(torch.matmul + SDPA enable_gqa) for grouped-query or head "
                                "sizes the module cannot express",
        "sdpa_vjp": "native: torch.autograd.grad through the sdpa path (through the composed "
                    "path with a sink: d_sink)",
        "paged_sdpa": "composed: the pages read back (rules.gather_pages), then sdpa with "
                      "kv_lengths (torch has no paged attention)",
        "merge_states": "composed: torch ops in float32 (float64 for float64; torch has no merge op)",
        "sdpa_lse": "composed: torch.logsumexp and softmax of the score pipeline (torch has "
                    "no public op returning the lse; the private "
                    "_scaled_dot_product_flash_attention_for_cpu gives 0 on rows without keys)",
    }

    #: whether sdpa_lse and sinks take the composed path (a kernel's own backend: no)
    composes_lse = True

    #: whether multi_head_attention may run nn.MultiheadAttention (whose SDPA call is
    #: not a flex_attention call: torch-flex composes every case)
    mha_module = True

    #: True for kernels that exist only on CUDA (their default device is then cuda)
    cuda_only = False

    #: the bitwise invariants it declares on the CPU (none on CUDA, where none is checked)
    cpu_invariants = ("deterministic",)

    def __init__(self, device=None):
        # per-instance copies, so that one instance's edits never leak into another
        self.versions = dict(self.versions)
        self.policy = dict(self.policy)
        self.policy_when = [dict(rule) for rule in self.policy_when]
        self.paths = dict(self.paths)
        self.device = _device(self.name, device, self.cuda_only)
        self.versions["device"] = _device_label(self.device)
        # checked bit for bit on the CPU by the invariance cases (docs/interface.md)
        self.invariants = self.cpu_invariants if self.device.type == "cpu" else ()

    #: the sdpa path on tensors (a subclass may adapt the layout around it)
    _attend = staticmethod(_attend)

    def _running(self):
        """The context every op runs in: tensors are made on the backend's device (the
        CPU is torch's own default: no device mode to pay for)."""
        return contextlib.nullcontext() if self.device.type == "cpu" else self.device

    # ------------------------------------------------------------ helpers

    def _dtype(self, a) -> torch.dtype:
        name = _name(np.asarray(a).dtype)
        if name not in self.dtypes or name not in _TORCH_DTYPES:
            raise NotImplementedError(f"torch backend does not support dtype {name}")
        return _TORCH_DTYPES[name]

    def _sdpa_inputs(self, q, k, v, mask, bias):
        dt = self._dtype(q)
        tq, tk, tv = (_to_torch(a, dt) for a in (q, k, v))
        tb = None if bias is None else _to_torch(bias, dt)
        return tq, tk, tv, _mask_to_torch(mask), tb

    # ------------------------------------------------------------ operations

    def softmax(self, x, axis=-1):
        with self._running():
            return _to_numpy(torch.softmax(_to_torch(x, self._dtype(x)), dim=axis))

    def scores(self, q, k, *, kind, scale=None, w=None, u=None, v=None):
        with self._running():
            dt = self._dtype(q)
            tq, tk = _to_torch(q, dt), _to_torch(k, dt)
            if kind == "dot":
                s = torch.matmul(tq, tk.transpose(-1, -2))
            elif kind == "scaled_dot":
                scale = 1.0 / math.sqrt(tk.shape[-1]) if scale is None else float(scale)
                s = torch.matmul(tq, tk.transpose(-1, -2)) * scale
            elif kind == "bilinear":
                s = torch.matmul(torch.matmul(tq, _to_torch(w, dt)), tk.transpose(-1, -2))
            elif kind == "additive":
                kw = torch.matmul(tk, _to_torch(w, dt))            # (*, Lk, Da)
                qu = torch.matmul(tq, _to_torch(u, dt))            # (*, Lq, Da)
                hidden = torch.tanh(kw.unsqueeze(-3) + qu.unsqueeze(-2))  # (*, Lq, Lk, Da)
                s = torch.matmul(hidden, _to_torch(v, dt))
            else:
                raise ValueError(f"unknown score kind {kind!r}")
            return _to_numpy(s)

    def _lse_path(self, sink):
        """The composed path of sdpa_lse and of sinks, or NotImplementedError for a kernel's
        own backend (it certifies that kernel, which returns no lse and has no sink)."""
        if not self.composes_lse:
            raise NotImplementedError(f"{self.name}: the kernel returns no lse and has no"
                                      " attention sink" if sink is None else
                                      f"{self.name}: no attention sink in the kernel")
        return _composed_lse

    @rules.sized(streams=_streams)
    @rules.lengths_as_mask
    def attention_weights(self, q, k, *, mask=None, bias=None, sink=None, causal=None,
                          scale=None, softcap=None, window=None):
        with self._running():
            dt = self._dtype(q)
            tq, tk = _to_torch(q, dt), _to_torch(k, dt)
            tm, tb = _mask_to_torch(mask), None if bias is None else _to_torch(bias, dt)
            lk = tk.shape[-2]
            eye = torch.eye(lk, dtype=dt).expand(*tk.shape[:-2], lk, lk)  # SDPA(q, k, I) = P
            if sink is not None:
                p, _ = self._lse_path(sink)(tq, tk, eye, mask=tm, bias=tb,
                                            sink=_to_torch(sink, dt), causal=causal,
                                            scale=scale, softcap=softcap, window=window)
            else:
                p = self._attend(tq, tk, eye, mask=tm, bias=tb, causal=causal, scale=scale,
                                 softcap=softcap, window=window)
            return _to_numpy(p)

    @rules.descaled(_torch_serving.fp8_to_float32, quantize=_torch_serving.scaled_output)
    @rules.sized(streams=_streams)
    @rules.lengths_as_mask
    def sdpa(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
             softcap=None, window=None):
        if sink is not None:
            return self.sdpa_lse(q, k, v, mask=mask, bias=bias, sink=sink, causal=causal,
                                 scale=scale, softcap=softcap, window=window)[0]
        with self._running():
            tq, tk, tv, tm, tb = self._sdpa_inputs(q, k, v, mask, bias)
            out = self._attend(tq, tk, tv, mask=tm, bias=tb, causal=causal, scale=scale,
                               softcap=softcap, window=window)
            return _to_numpy(out)

    @rules.sized(streams=_streams)
    def sdpa_lse(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
                 softcap=None, window=None):
        path = self._lse_path(sink)
        with self._running():
            tq, tk, tv, tm, tb = self._sdpa_inputs(q, k, v, mask, bias)
            ts = None if sink is None else _to_torch(sink, tq.dtype)
            out, lse = path(tq, tk, tv, mask=tm, bias=tb, sink=ts, causal=causal, scale=scale,
                            softcap=softcap, window=window)
            return _to_numpy(out), _to_numpy(lse.to(_torch_serving.lse_dtype(tq.dtype)))

    @rules.sized(streams=_streams)
    @rules.lengths_as_mask
    def sdpa_vjp(self, q, k, v, d_out, *, mask=None, bias=None, sink=None, causal=None,
                 scale=None, softcap=None, window=None):
        path = None if sink is None else self._lse_path(sink)
        with self._running():
            tq, tk, tv, tm, tb = self._sdpa_inputs(q, k, v, mask, bias)
            leaves = tuple(t.requires_grad_() for t in (tq, tk, tv))
            if path is None:
                out = self._attend(*leaves, mask=tm, bias=tb, causal=causal, scale=scale,
                                   softcap=softcap, window=window)
            else:
                leaves += (_to_torch(sink, tq.dtype).requires_grad_(),)
                out, _ = path(*leaves[:3], mask=tm, bias=tb, sink=leaves[3], causal=causal,
                              scale=scale, softcap=softcap, window=window)
            grads = torch.autograd.grad(out, leaves, _to_torch(d_out, tq.dtype))
            return tuple(_to_numpy(g) for g in grads)

    def self_attention(self, x, w_q, w_k, w_v, *, mask=None, causal=None):
        with self._running():
            dt = self._dtype(x)
            tx = _to_torch(x, dt)
            tq, tk, tv = (torch.matmul(tx, _to_torch(w, dt)) for w in (w_q, w_k, w_v))
            out = self._attend(tq, tk, tv, mask=_mask_to_torch(mask), causal=causal)
            return _to_numpy(out)

    def multi_head_attention(self, query, key, value, *, w_q, w_k, w_v, w_o, num_heads,
                             num_kv_heads=None, mask=None, causal=None):
        with self._running():
            dt = self._dtype(query)
            tq, tk, tv = (_to_torch(a, dt) for a in (query, key, value))
            ws = [_to_torch(w, dt) for w in (w_q, w_k, w_v, w_o)]
            allowed = _allowed(_mask_to_torch(mask), tq.shape[-2], tk.shape[-2], causal, None)
            kv_heads = num_heads if num_kv_heads is None else num_kv_heads
            out = _torch_mha.multi_head_attention(self._attend, tq, tk, tv, ws, num_heads,
                                                  kv_heads, allowed, self.mha_module)
            return _to_numpy(out)

    def paged_sdpa(self, q, k_pages, v_pages, *, block_table, kv_lengths, page_layout="NHD",
                   **params):
        """The pages read back (rules.gather_pages), then this backend's sdpa with lengths."""
        k, v = rules.gather_pages(k_pages, v_pages, block_table, kv_lengths, page_layout)
        return self.sdpa(q, k, v, kv_lengths=kv_lengths, **params)

    def merge_states(self, outs, lses):
        with self._running():
            dt = self._dtype(outs)
            wide = torch.float64 if dt == torch.float64 else torch.float32
            out, lse = _torch_serving.merge_states(_to_torch(outs, wide), _to_torch(lses, wide),
                                                   self.policy["lse_base"])
            return _to_numpy(out.to(dt)), _to_numpy(lse.to(_torch_serving.lse_dtype(dt)))
