"""NumPy arrays into torch tensors and back, for the torch adapters (each call converts
several: what every conversion pays is kept small). Not a backend itself; imported by
backends/torch.py, whose names for these the other torch adapters import."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import torch

_BFLOAT16, _CPU = np.dtype(ml_dtypes.bfloat16), torch.device("cpu")


@functools.lru_cache(maxsize=64)
def _name(dtype: np.dtype) -> str:
    return dtype.name               # dtype.name is slow, and every call asks


#: torch's own mode stack and device context, read to skip get_default_device's walk; a
#: torch without them (these are private) takes get_default_device every time
_MODE_STACK_DEPTH = getattr(torch._C, "_len_torch_function_stack", None)
_DEVICE_CONTEXT = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)


def _default_device() -> torch.device:
    """torch.get_default_device(), which walks torch's mode stack in Python (~6 us, for
    every array converted): the CPU at once when no mode (device or other) is active."""
    if _MODE_STACK_DEPTH is not None and _DEVICE_CONTEXT is not None \
            and _MODE_STACK_DEPTH() == 0 \
            and getattr(_DEVICE_CONTEXT, "device_context", None) is None:
        return _CPU
    return torch.get_default_device()


def _to_torch(a, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A fresh tensor holding a copy of NumPy array ``a`` (bfloat16 via its bits), on the
    default device (the backend's own while an op runs: ``TorchBackend._running``)."""
    a = np.array(a, order="C", copy=True)
    if a.dtype == _BFLOAT16:
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(a)
    return t.to(device=_default_device(), dtype=dtype)


def _mask_to_torch(mask) -> torch.Tensor | None:
    if mask is None:
        return None
    return torch.from_numpy(np.array(mask, dtype=bool, order="C")).to(_default_device())


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    """A fresh NumPy array of the tensor's dtype (bfloat16 as ml_dtypes.bfloat16)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return np.array(t.view(torch.int16).numpy().view(ml_dtypes.bfloat16), copy=True)
    return np.array(t.numpy(), copy=True)
