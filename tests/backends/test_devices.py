"""Devices and single-kernel backends: --device DEVICE builds a backend with
device=DEVICE; a device the machine lacks is one clear load error, never a silent run on
the CPU; each torch SDPA kernel backend runs that kernel or reports the input unsupported.

On a machine with no accelerator (this project's) the CUDA and GPU cases check the
refusal; where torch or JAX sees one, those tests are skipped (scripts/gpu_certify.sh
certifies the accelerator itself).
"""

from __future__ import annotations

import numpy as np
import pytest

from attention_conformance.backend.resolve import BackendLoadError, load_backend
from attention_conformance.golden.reference import sdpa as reference_sdpa

from _cli_support import cli, make_spec


def _qkv(shape_q=(2, 3, 4, 8), shape_k=(2, 3, 6, 8), dv=8, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(shape_q).astype(dtype)
    k = rng.standard_normal(shape_k).astype(dtype)
    v = rng.standard_normal(shape_k[:-1] + (dv,)).astype(dtype)
    return q, k, v


# --------------------------------------------------------------- the loader, any backend


class _Plain:
    name, dtypes = "plain", {"float64"}
    policy = {"fully_masked_rows": "zeros", "neg_inf_bias_rows": "zeros",
              "masked_key_nan": "ignored", "masked_value_nan": "propagates"}


class _WithDevice(_Plain):
    def __init__(self, device=None):
        self.device = device


def test_a_backend_without_a_device_parameter_is_one_clear_error(monkeypatch):
    import sys
    import types
    module = types.ModuleType("_devices_adapters")
    module.Plain, module.WithDevice, module.built = _Plain, _WithDevice, _Plain()
    monkeypatch.setitem(sys.modules, "_devices_adapters", module)
    with pytest.raises(BackendLoadError, match=r"backend '_devices_adapters:Plain' does not "
                                               r"take a device .*--device cpu"):
        load_backend("_devices_adapters:Plain", device="cpu")
    with pytest.raises(BackendLoadError, match=r"already built: it cannot be given --device"):
        load_backend("_devices_adapters:built", device="cpu")
    assert load_backend("_devices_adapters:WithDevice", device="xpu:3").device == "xpu:3"
    assert load_backend("_devices_adapters:WithDevice").device is None   # no --device


def test_numpy_takes_no_device():
    with pytest.raises(BackendLoadError, match="backend 'numpy' does not take a device"):
        load_backend("numpy", device="cpu")


# --------------------------------------------------------------------------- torch


def _torch():
    return pytest.importorskip("torch")


def _no_cuda():
    if _torch().cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal cannot be seen here")


@pytest.mark.parametrize("name", ["torch", "torch-math", "torch-flash", "torch-flex"])
def test_torch_backends_run_on_the_cpu_they_are_given(name):
    torch = _torch()
    backend = load_backend(name, device="cpu")
    assert backend.device == torch.device("cpu")
    assert backend.versions["device"] == "cpu"
    assert load_backend(name).device == torch.device("cpu")      # the default
    q, k, v = _qkv()
    out = backend.sdpa(q, k, v)
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    np.testing.assert_allclose(out, reference_sdpa(q, k, v), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["torch", "torch-math", "torch-flash", "torch-flex"])
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1"])
def test_torch_refuses_cuda_when_there_is_none(name, device):
    _no_cuda()
    with pytest.raises(BackendLoadError, match=rf"{name} needs a CUDA device \('{device}'\); "
                                               r"torch.cuda.is_available\(\) is False"):
        load_backend(name, device=device)


@pytest.mark.parametrize("name", ["torch-efficient", "torch-cudnn"])
def test_cuda_only_kernels_are_refused_cleanly(name):
    _no_cuda()
    with pytest.raises(BackendLoadError, match=rf"{name} needs a CUDA device \('cuda'\); "
                                               r"torch.cuda.is_available\(\) is False"):
        load_backend(name)                     # their default device is cuda
    with pytest.raises(BackendLoadError, match=rf"{name} is a CUDA kernel .*cannot run on "
                                               r"device 'cpu'"):
        load_backend(name, device="cpu")


@pytest.mark.parametrize("device", ["gpu", "mps", "tpu", "cuda:x", ""])
def test_torch_names_the_devices_it_takes(device):
    _torch()
    with pytest.raises(BackendLoadError, match=rf"torch: unknown device '{device}'; torch "
                                               r"backends take cpu, cuda or cuda:N"):
        load_backend("torch", device=device)


def test_torch_tensors_follow_the_backend_device():
    """Every op makes its tensors on the backend's device (seen with torch's meta device,
    which needs no accelerator)."""
    torch = _torch()
    from attention_conformance.backends.torch import _mask_to_torch, _to_torch
    backend = load_backend("torch")
    backend.device = torch.device("meta")
    with backend._running():
        assert _to_torch(np.ones((2, 3)), torch.float32).device.type == "meta"
        assert _mask_to_torch(np.ones((2, 3), dtype=bool)).device.type == "meta"
        assert torch.eye(3).device.type == "meta"
    assert _to_torch(np.ones(2)).device.type == "cpu"     # and only while an op runs


# ------------------------------------------------------- one SDPA kernel per backend


def _aten_ops(fn):
    torch = _torch()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key for e in prof.key_averages()}


_MATH = "aten::_scaled_dot_product_attention_math"
_FLASH = "aten::_scaled_dot_product_flash_attention_for_cpu"


@pytest.mark.parametrize("name, runs, never", [("torch-math", _MATH, _FLASH),
                                               ("torch-flash", _FLASH, _MATH)])
@pytest.mark.parametrize("rank", [2, 3, 4, 5])
def test_each_kernel_backend_runs_its_kernel(name, runs, never, rank):
    _torch()
    backend = load_backend(name)
    lead = (2, 2, 3)[3 - (rank - 2):] if rank > 2 else ()     # (), (3,), (2, 3), (2, 2, 3)
    q, k, v = _qkv(lead + (4, 8), lead + (6, 8))
    mask = np.tril(np.ones((4, 6), dtype=bool), 2)
    for call in (lambda: backend.sdpa(q, k, v, causal="top_left"),
                 lambda: backend.sdpa(q, k, v, mask=mask),
                 lambda: backend.sdpa_vjp(q, k, v, np.ones(q.shape[:-1] + (8,)))):
        ops = _aten_ops(call)
        assert runs in ops and never not in ops, sorted(o for o in ops if "attention" in o)
    assert f"SDPBackend.{backend.kernel.name}" in backend.paths["sdpa"]
    assert backend.versions["sdpa_kernel"] == backend.kernel.name


def test_plain_torch_still_lets_torch_choose():
    _torch()
    backend = load_backend("torch")
    q, k, v = _qkv((3, 4, 8), (3, 6, 8))
    assert _MATH in _aten_ops(lambda: backend.sdpa(q, k, v))      # 3-D inputs: math
    q, k, v = _qkv()
    assert _FLASH in _aten_ops(lambda: backend.sdpa(q, k, v))     # 4-D inputs: flash


def test_a_refused_input_is_unsupported_with_torchs_reason():
    _torch()
    backend = load_backend("torch-flash")
    q, k, v = _qkv(dv=5)
    with pytest.raises(NotImplementedError, match=r"torch-flash: the flash kernel refused "
                                                  r"this input: Flash attention requires "
                                                  r"q,k,v to have the same last dimension"):
        backend.sdpa(q, k, v)
    np.testing.assert_allclose(load_backend("torch-math").sdpa(q, k, v),
                               reference_sdpa(q, k, v), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["torch-math", "torch-flash"])
def test_kernel_backends_refuse_what_reaches_no_kernel(name):
    _torch()
    backend = load_backend(name)
    q, k, v = _qkv()
    with pytest.raises(NotImplementedError, match="softmax calls no SDPA kernel"):
        backend.softmax(q)
    with pytest.raises(NotImplementedError, match="scores call no SDPA kernel"):
        backend.scores(q, k, kind="dot")
    for call in (lambda: backend.sdpa(q, k, v, softcap=5.0),
                 lambda: backend.attention_weights(q, k, softcap=5.0),
                 lambda: backend.sdpa_vjp(q, k, v, q, softcap=5.0)):
        with pytest.raises(NotImplementedError, match="SDPA has no softcap parameter"):
            call()


def test_kernel_layout_keeps_shapes_and_broadcasting():
    """Inputs of rank 2, 3 and 5 and masks of every rank reach the kernel as 4-D and
    come back in their own shape, equal to the reference."""
    _torch()
    backend = load_backend("torch-math")
    rng = np.random.default_rng(1)
    for shape_q, shape_k, mask_shape in [((4, 8), (6, 8), (6,)), ((3, 4, 8), (3, 6, 8), (3, 1, 6)),
                                        ((2, 2, 3, 4, 8), (2, 1, 3, 6, 8), (2, 1, 1, 4, 6)),
                                        ((2, 4, 4, 8), (2, 2, 6, 8), (2, 1, 4, 6))]:
        q, k, v = _qkv(shape_q, shape_k, dv=5)
        mask = rng.random(mask_shape) > 0.3
        mask[..., 0] = True
        got = backend.sdpa(q, k, v, mask=mask)
        np.testing.assert_allclose(got, reference_sdpa(q, k, v, mask=mask), rtol=1e-12,
                                   atol=1e-12)


# ------------------------------------------------------------------------ flex


def test_flex_maps_every_score_mod_and_mask_mod():
    _torch()
    backend = load_backend("torch-flex")
    rng = np.random.default_rng(2)
    q, k, v = _qkv((2, 4, 5, 8), (2, 2, 7, 8), dv=6)          # grouped-query, Dv != Dk
    bias = rng.standard_normal((4, 5, 7))
    mask = rng.random((2, 1, 1, 7)) > 0.2
    mask[..., -1] = True
    for params in ({"causal": "bottom_right", "window": (2, 1)}, {"causal": "top_left"},
                   {"softcap": 1.5, "scale": 0.7}, {"window": (1, None)}, {}):
        got = backend.sdpa(q, k, v, mask=mask, bias=bias, **params)
        want = reference_sdpa(q, k, v, mask=mask, bias=bias, **params)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=str(params))
    assert "eager" in backend.paths["sdpa"] and backend.versions["flex_attention"] == "eager"


def test_flex_backward_on_the_cpu_is_unsupported_with_torchs_reason():
    _torch()
    backend = load_backend("torch-flex")
    if backend.device.type != "cpu":
        pytest.skip("flex's backward runs on CUDA")
    q, k, v = _qkv()
    with pytest.raises(NotImplementedError, match="FlexAttention does not support backward "
                                                  "on CPU"):
        backend.sdpa_vjp(q, k, v, q)


# ----------------------------------------------------------------------------- JAX


def _jax():
    jax = pytest.importorskip("jax")
    try:
        jax.devices("gpu")
    except RuntimeError:
        return jax
    pytest.skip("this machine has a GPU for JAX: the refusal cannot be seen here")


def test_jax_runs_on_the_cpu_it_is_given():
    pytest.importorskip("jax")
    backend = load_backend("jax", device="cpu")
    assert backend.device.platform == "cpu"
    assert backend.versions["device"].startswith("cpu:0")
    q, k, v = _qkv((1, 2, 3, 4), (1, 2, 5, 4), dv=4)
    np.testing.assert_allclose(backend.sdpa(q, k, v, causal="top_left"),
                               reference_sdpa(q, k, v, causal="top_left"), rtol=1e-6)


@pytest.mark.parametrize("name", ["jax", "jax-cudnn"])
def test_jax_refuses_a_gpu_when_there_is_none(name):
    _jax()
    with pytest.raises(BackendLoadError, match=rf"{name} needs a GPU \('gpu'\); "
                                               r"jax.devices\('gpu'\) finds none"):
        load_backend(name, device="gpu")
    with pytest.raises(BackendLoadError, match=rf"{name}: unknown device 'cuda'; jax "
                                               r"backends take cpu, gpu or gpu:N"):
        load_backend(name, device="cuda")


def test_jax_cudnn_is_a_gpu_kernel():
    _jax()
    with pytest.raises(BackendLoadError, match=r"jax-cudnn needs a GPU \('gpu'\)"):
        load_backend("jax-cudnn")                  # its default device is the GPU
    with pytest.raises(BackendLoadError, match=r"jax-cudnn is cuDNN's attention, a GPU "
                                               r"kernel: it cannot run on device 'cpu'"):
        load_backend("jax-cudnn", device="cpu")


def test_jax_cudnn_refusals_are_unsupported_never_xla():
    """What cuDNN refuses (here: everything, as the CPU has no cuDNN) is
    NotImplementedError with cuDNN's reason, not a run of the XLA implementation."""
    jax = _jax()
    from attention_conformance.backends.jax import JaxCudnnBackend
    backend = object.__new__(JaxCudnnBackend)        # bypasses the GPU check on purpose
    backend.device = jax.devices("cpu")[0]
    q, k, v = _qkv((1, 2, 3, 4), (1, 2, 5, 4), dv=4, dtype=np.float16)
    with pytest.raises(NotImplementedError, match=r"jax-cudnn: cuDNN refused this input"):
        backend.sdpa(q, k, v)
    with pytest.raises(NotImplementedError, match="calls no cuDNN kernel"):
        backend.attention_weights(q, k)


# --------------------------------------------------- the plugin and the command line


def test_certify_passes_the_device_to_the_plugin(tmp_path):
    from attention_conformance.cli import build_parser, certify_argv
    args, rest = build_parser().parse_known_args(["certify", "torch", "--device", "cuda:1"])
    argv = certify_argv(args, rest)
    assert argv[argv.index("--device") + 1] == "cuda:1"
    args, rest = build_parser().parse_known_args(["certify", "torch"])
    assert "--device" not in certify_argv(args, rest)


def test_a_missing_device_stops_the_run_before_any_test(tmp_path):
    _no_cuda()
    cases = make_spec(tmp_path)
    ran = cli("--spec-dir", cases, "certify", "torch-cudnn")
    assert ran.returncode == 4, ran.stdout + ran.stderr          # pytest's usage error
    assert "torch-cudnn needs a CUDA device ('cuda'); torch.cuda.is_available() is False" \
        in ran.stdout + ran.stderr
    assert "passed" not in ran.stdout
    ran = cli("--spec-dir", cases, "certify", "torch-math", "--device", "cpu", "--dtype",
              "float64")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "backend 'torch-math'" in ran.stdout and " 0 fail" in ran.stdout


# ------------------------------------------- the torch adapters' default device, shortcut


@pytest.mark.parametrize("private", ["present", "absent"])
def test_torch_arrays_land_on_torchs_default_device_under_a_device_mode(monkeypatch, private):
    """The conversions skip torch.get_default_device() only while no mode is active, and
    take it whenever one is (or when torch lacks the private names the shortcut reads)."""
    torch = pytest.importorskip("torch")
    from attention_conformance.backends import _torch_arrays as arrays
    if private == "absent":
        monkeypatch.setattr(arrays, "_MODE_STACK_DEPTH", None)
    assert arrays._to_torch(np.zeros(2)).device == torch.device("cpu")
    with torch.device("meta"):
        assert arrays._default_device() == torch.device("meta")
        assert arrays._to_torch(np.zeros(2)).device.type == "meta"
        assert arrays._mask_to_torch(np.ones(2, dtype=bool)).device.type == "meta"
    assert arrays._default_device() == torch.get_default_device() == torch.device("cpu")
