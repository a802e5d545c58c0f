"""Each PyTorch SDPA kernel as a backend of its own: torch-math, torch-flash,
torch-efficient and torch-cudnn.

``F.scaled_dot_product_attention`` picks one of several kernels per call (math, flash,
memory-efficient, cuDNN), so the plain ``torch`` backend certifies whatever torch's
dispatch chose for each input. These backends are the torch adapter with every op run
inside ``torch.nn.attention.sdpa_kernel([ONE_KERNEL])``: the forward and the backward of
every SDPA call (also inside ``nn.MultiheadAttention``) use that kernel or none, never
silently another one. When the kernel refuses an input (head sizes, dtype, mask, GQA,
device...), torch raises "No available kernel" after warning why; the adapter turns that
into ``NotImplementedError`` carrying torch's own reasons, so the test is *unsupported*
with the reason, not failed and not run on a different kernel.

What does not reach SDPA is not these backends' to certify, and raises
``NotImplementedError`` too: ``softmax`` and ``scores`` (plain torch ops) and
``softcap`` (SDPA has no such parameter; the ``torch`` backend composes it from torch
ops). The ``torch`` backend certifies those.

Devices: torch-math and torch-flash run on the CPU (the default) or CUDA; torch's
memory-efficient and cuDNN kernels exist only on CUDA, so those two default to ``cuda``
and refuse to be built on a machine without it.
"""

from __future__ import annotations

import contextlib
import re
import warnings

from torch.nn.attention import SDPBackend, sdpa_kernel

from ._signature import signed
from .torch import TorchBackend, _attend, _broadcast, _is_gqa, _to_4d

_REFUSED = ("No available kernel", "No viable backend for scaled_dot_product_attention")
_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)\s*$")


def _from_sdpa(message) -> bool:
    """A warning of torch's kernel checks (aten/src/ATen/native/transformers/sdp_utils*)."""
    return "sdp_utils" in str(message) or "kernel not used because" in str(message)


def _reason(message) -> str:
    return _TRIGGERED.sub("", str(message)).strip()


def _attend_4d(q, k, v, *, mask=None, bias=None, **params):
    """The torch backend's sdpa path on the layout torch's fused kernels take: q, k, v as
    (B, H, L, D) ("All fused kernels requires query, key and value to be 4 dimensional")
    and masks as 2-D or 4-D. Rank 2 and 3 get leading 1s, batch dims beyond one are
    flattened into B, and the output gets its shape back; masks and biases of rank 3 or
    more are brought to the same 4-D layout. Rank 1 and 2 masks pass as they are: a
    2-D mask is what the kernels take, and a rank-1 one, which torch documents as
    broadcastable, is the flash kernel's finding (an IndexError), not ours to hide."""
    gqa = _is_gqa(q, k)
    q, k, v = _broadcast(q, k, v, mask, bias, gqa)
    rank = max(q.dim(), 4)
    lead = q.shape[:-3] if q.dim() > 3 else ()

    def scores(t):
        return t if t is None or t.dim() <= 2 else _to_4d(t, rank, lead)

    q4, k4, v4 = (_to_4d(t, rank, lead) for t in (q, k, v))
    out = _attend(q4, k4, v4, mask=scores(mask), bias=scores(bias), **params)
    return out.reshape(*q.shape[:-1], out.shape[-1])


def _keywords_of(parent_method):
    """An override shows the keywords of torch's own method, not its bare **params: a case
    whose param that method lacks is unsupported, never called and failed."""
    return lambda method: signed(method, parent_method)


class _KernelBackend(TorchBackend):
    """The torch adapter restricted to one SDPA kernel (``kernel``)."""

    #: one kernel alone propagates a NaN in a masked key to every row, whatever the
    #: call (torch's own dispatch, which may pick flash, declares per_row under causal
    #: alone); the flash kernel overrides it
    policy = dict(TorchBackend.policy, masked_key_nan="propagates")
    policy_when = []

    kernel: SDPBackend
    label: str
    _attend = staticmethod(_attend_4d)
    #: sdpa_lse and sinks are unsupported here: the torch backend composes them, which
    #: would certify no call of this path
    composes_lse = False

    def __init__(self, device=None):
        super().__init__(device)
        only = f"under sdpa_kernel([SDPBackend.{self.kernel.name}]) on {self.device}: " \
               f"the {self.label} kernel or unsupported, never another kernel"
        self.versions["sdpa_kernel"] = self.kernel.name
        not_here = "not run: no SDPA call to certify (the torch backend certifies it)"
        self.paths = {
            "softmax": not_here,
            "scores": not_here,
            "attention_weights": f"native: F.scaled_dot_product_attention with V = "
                                 f"identity(Lk), {only}; softcap not run (SDPA has none)",
            "sdpa": f"native: F.scaled_dot_product_attention {only} (is_causal, "
                    f"causal_lower_right, enable_gqa; other masks as attn_mask); "
                    f"softcap not run (SDPA has none)",
            "sdpa_vjp": f"native: torch.autograd.grad through the sdpa path, forward and "
                        f"backward {only}",
            "self_attention": f"composed projections (torch.matmul), then native SDPA {only}",
            "multi_head_attention": f"native: torch.nn.MultiheadAttention (bias=False) or "
                                    f"composed projections + SDPA, {only}",
        }

    @contextlib.contextmanager
    def _running(self):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with super()._running(), sdpa_kernel([self.kernel]):
                    yield
            except RuntimeError as exc:
                if not any(text in str(exc) for text in _REFUSED):
                    raise
                why = [_reason(w.message) for w in caught if _from_sdpa(w.message)]
                why = [w for w in why if not w.endswith("not used because:")] or [_reason(exc)]
                raise NotImplementedError(
                    f"{self.name}: the {self.label} kernel refused this input: "
                    + "; ".join(dict.fromkeys(why))) from None
        for w in caught:   # torch's other warnings are not ours to swallow
            if not _from_sdpa(w.message):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    @staticmethod
    def _no_softcap(softcap, name):
        if softcap is not None:
            raise NotImplementedError(f"{name}: SDPA has no softcap parameter (the torch "
                                      "backend composes it from torch ops, which run no "
                                      "SDPA kernel)")

    def softmax(self, x, axis=-1):
        raise NotImplementedError(f"{self.name}: softmax calls no SDPA kernel "
                                  "(certified by the torch backend)")

    def scores(self, q, k, *, kind, scale=None, w=None, u=None, v=None):
        raise NotImplementedError(f"{self.name}: scores call no SDPA kernel "
                                  "(certified by the torch backend)")

    @_keywords_of(TorchBackend.attention_weights)
    def attention_weights(self, q, k, *, softcap=None, **params):
        self._no_softcap(softcap, self.name)
        return super().attention_weights(q, k, **params)

    @_keywords_of(TorchBackend.sdpa)
    def sdpa(self, q, k, v, *, softcap=None, **params):
        self._no_softcap(softcap, self.name)
        return super().sdpa(q, k, v, **params)

    @_keywords_of(TorchBackend.sdpa_vjp)
    def sdpa_vjp(self, q, k, v, d_out, *, softcap=None, **params):
        self._no_softcap(softcap, self.name)
        return super().sdpa_vjp(q, k, v, d_out, **params)


class TorchMathBackend(_KernelBackend):
    """torch's math kernel: SDPA written in ATen ops (the reference path; CPU and CUDA)."""

    name = "torch-math"
    #: the math kernel is also batch-invariant on the CPU (TorchBackend: CPU only)
    cpu_invariants = ("deterministic", "batch_invariant")
    kernel = SDPBackend.MATH
    label = "math"


class TorchFlashBackend(_KernelBackend):
    """torch's flash-attention kernel (its own CPU implementation, or FlashAttention-2 on
    CUDA)."""

    name = "torch-flash"
    #: not batch-invariant: its float32 decode over 200 keys changes bits with the batch
    cpu_invariants = ("deterministic", "split_invariant")
    kernel = SDPBackend.FLASH_ATTENTION
    label = "flash"
    #: with is_causal the kernel skips the key blocks a query cannot see, so a NaN in a
    #: causally hidden key reaches only the rows whose visited blocks hold it (per_row:
    #: each row the ignored result or wholly NaN); an explicit mask propagates it
    policy = dict(TorchBackend.policy, masked_key_nan="propagates")
    policy_when = TorchBackend.policy_when


class TorchEfficientBackend(_KernelBackend):
    """torch's memory-efficient kernel (xFormers' cutlass kernel; CUDA only)."""

    name = "torch-efficient"
    kernel = SDPBackend.EFFICIENT_ATTENTION
    label = "memory-efficient"
    cuda_only = True


class TorchCudnnBackend(_KernelBackend):
    """torch's cuDNN attention kernel (CUDA only)."""

    name = "torch-cudnn"
    kernel = SDPBackend.CUDNN_ATTENTION
    label = "cuDNN"
    cuda_only = True
