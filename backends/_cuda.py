"""What the GPU-only adapters (flashinfer, vllm-flash, torch-context-parallel) share.

Loaded on a machine without CUDA they do not fail: they load, import no library of
theirs, and every call raises NotImplementedError with the reason ("flashinfer:
unsupported: needs CUDA (...)"), so that each test is *unsupported* with it. Loaded
where CUDA is present, they import their library there and then; a library that is not
installed is the same kind of reason. An explicit ``device`` that is no CUDA device
this machine has is refused at construction, as for every torch backend.

CUDA is counted through NVML (``torch.cuda.device_count``), which initialises no CUDA
context: the ranks that the suite forks from the backend's process can still use CUDA.
Nothing here imports torch before a backend is constructed.
"""

from __future__ import annotations

import numpy as np

#: the head sizes the FlashAttention-style kernels compile; a smaller head is padded
#: with zero columns up to the next one (exact: a zero column adds 0 to every score, and
#: a zero column of V is an output column that is cut off again)
HEAD_SIZES = (64, 128, 256)


def cuda_count() -> int:
    """CUDA devices torch sees, without initialising CUDA (NVML where it answers)."""
    import torch

    return torch.cuda.device_count()


def _no_cuda_reason() -> str:
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build (torch.version.cuda is None)"
    return "torch.cuda.device_count() is 0"


def resolve_device(name: str, device):
    """(torch.device or None, the reason it is unavailable or None). device None: the
    first CUDA device, or none with the reason; "cuda"/"cuda:N": that device, or a load
    error; anything else: a load error."""
    import torch

    count = cuda_count()
    if device is None:
        if count == 0:
            return None, f"{name}: unsupported: needs CUDA ({_no_cuda_reason()})"
        return torch.device("cuda", 0), None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        dev = None
    if dev is None or dev.type != "cuda":
        raise ValueError(f"{name}: device {device!r} is not a CUDA device; it runs on "
                         "cuda or cuda:N only")
    index = dev.index or 0
    if index >= count:
        raise RuntimeError(f"{name} needs a CUDA device ({device!r}); torch sees {count}"
                           f" ({_no_cuda_reason() if count == 0 else 'fewer'})")
    return torch.device("cuda", index), None


class CudaAdapter:
    """Base of a GPU-only adapter: ``library`` is imported by ``_import`` only where CUDA
    is; ``_ready()`` raises the reason it is unavailable at every call."""

    name: str
    package: str            # what pip installs
    #: why it needs CUDA, beyond its library being a CUDA one (said with the reason)
    cuda_why: str = ""
    unavailable: str | None

    def __init__(self, device=None):
        self.device, self.unavailable = resolve_device(self.name, device)
        if self.unavailable is not None and self.cuda_why:
            self.unavailable += f"; {self.cuda_why}"
        self.versions = {"device": "none (no CUDA)" if self.device is None else str(self.device)}
        if self.unavailable is None:
            try:
                self.lib = self._import()
            except ImportError as exc:
                self.unavailable = (f"{self.name}: unsupported: needs {self.package} "
                                    f"({type(exc).__name__}: {exc})")
        if self.unavailable is None:
            import torch

            self.versions.update(torch=torch.__version__, cuda=str(torch.version.cuda))
            if not getattr(self, "distributed", None):   # CUDA is not initialised before
                self.versions["gpu"] = torch.cuda.get_device_name(self.device)   # a fork

    def _import(self):
        raise NotImplementedError

    def _ready(self) -> None:
        if self.unavailable is not None:
            raise NotImplementedError(self.unavailable)


# ---------------------------------------------------------------- arrays in and out


def to_cuda(a, device, dtype=None):
    """A NumPy array (bfloat16 as ml_dtypes) as a fresh tensor on the device."""
    from .torch import _to_torch

    return _to_torch(a, dtype).to(device)


def to_numpy(t, like=None) -> np.ndarray:
    """A fresh NumPy array of the tensor, cast to ``like``'s dtype when given (``like``:
    an array, or a dtype itself: ``rules.lse_dtype(q.dtype)`` for an lse)."""
    from .torch import _TORCH_DTYPES, _to_numpy

    if like is not None:
        t = t.to(_TORCH_DTYPES[np.dtype(getattr(like, "dtype", like)).name])
    return _to_numpy(t)


def is_fp8(a) -> bool:
    return np.asarray(a).dtype.name in ("float8_e4m3fn", "float8_e5m2")


def to_cuda_padded(a, device, size: int):
    """The array as a tensor on the device, its last axis padded with zero columns to
    ``size``; an fp8 array (ml_dtypes) as torch's float8 dtype of the same bits, padded
    as bytes (0x00 is +0 in both formats: torch pads no float8 tensor)."""
    import torch
    import torch.nn.functional as F

    from ._torch_serving import FP8

    a = np.ascontiguousarray(a)
    if not is_fp8(a):
        return pad_head(to_cuda(a, device), size)
    bits = torch.from_numpy(a.view(np.uint8).copy())
    bits = bits if bits.shape[-1] == size else F.pad(bits, (0, size - bits.shape[-1]))
    return bits.view(FP8[a.dtype.name]).to(device)


def float32_like(*arrays):
    """What an output is converted to: float32 in an fp8 case (docs/interface.md, "fp8
    inputs and descale factors"), else the first array's dtype (an empty array of it)."""
    if any(is_fp8(a) for a in arrays):
        return np.zeros(0, np.float32)
    return np.asarray(arrays[0])


def per_tensor(name: str, descale) -> float | None:
    """A ``(1,)`` descale as the float FlashInfer's k_scale/v_scale take; a per (batch,
    kv head) one is unsupported (not folded into one)."""
    if descale is None:
        return None
    d = np.asarray(descale, np.float32)
    if d.size != 1:
        raise NotImplementedError(f"{name}: descales per (batch, kv head) {list(d.shape)}: "
                                  "its q_scale/k_scale/v_scale are one per tensor")
    return float(d.reshape(()))


def sink_rows(sink, batch: tuple, hq: int) -> np.ndarray | None:
    """The interface's sink (broadcasting to ``(*batch, Hq)``) as ``(B, Hq)``; None stays
    None."""
    if sink is None:
        return None
    return np.broadcast_to(np.asarray(sink), tuple(batch) + (hq,)).reshape(-1, hq)


def padded_head(d: int, name: str) -> int:
    """The head size a head of d columns is padded to (HEAD_SIZES), or unsupported."""
    for size in HEAD_SIZES:
        if d <= size:
            return size
    raise NotImplementedError(f"{name}: head size {d} is past the kernels' largest, "
                              f"{HEAD_SIZES[-1]}")


def pad_head(t, size: int):
    """The last axis padded with zeros to ``size`` columns."""
    import torch.nn.functional as F

    return t if t.shape[-1] == size else F.pad(t, (0, size - t.shape[-1]))


def refuse(name: str, **given) -> None:
    """NotImplementedError naming the first given param (not None) the adapter lacks."""
    for param, value in given.items():
        if value is not None:
            raise NotImplementedError(f"{name}: no {param} (the library has no such input)")
