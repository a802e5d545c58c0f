"""The GPU-only adapters (flashinfer, vllm-flash, torch-context-parallel) and their device
script, on a machine without CUDA (this project's): each loads, imports neither torch
when its module is imported nor its library when it is loaded, and every call is
*unsupported* with the reason; scripts/gpu_certify.sh --check plans the GPU run without
running it. Where torch sees a CUDA device these tests are skipped: the script certifies
the adapters there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from attention_conformance.backend.in_process import InProcess  # noqa: E402
from attention_conformance.backends import BUILTIN  # noqa: E402
from attention_conformance.model.errors import Unsupported  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GPU_ONLY = {"flashinfer": "flashinfer", "vllm-flash": "vllm_flash",
            "torch-context-parallel": "torch_context_parallel"}
#: what loading one must not import: the libraries the adapters wrap
LIBRARIES = ("flashinfer", "vllm", "flash_attn", "vllm_flash_attn")

pytestmark = pytest.mark.skipif(torch.cuda.device_count() > 0,
                                reason="CUDA is here: scripts/gpu_certify.sh certifies them")

_PROBE = """
import json, sys
modules = [f"attention_conformance.backends.{m}" for m in sys.argv[1:]]
for m in modules:
    __import__(m)
imported_torch = "torch" in sys.modules
from attention_conformance.backend.resolve import load_backend
from attention_conformance.backends import BUILTIN
reasons = {n: load_backend(n).unavailable for n in BUILTIN if BUILTIN[n].split(":")[0] in modules}
print(json.dumps({"torch_on_import": imported_torch, "reasons": reasons,
                  "libraries": [m for m in %r if m in sys.modules]}))
""" % (LIBRARIES,)


def test_gpu_adapters_load_without_cuda_and_import_nothing_heavy():
    """One fresh interpreter: importing the three modules imports no torch (collection,
    --help and the findings pages read them), loading them imports no library of theirs,
    and each says why it cannot run."""
    probe = subprocess.run([sys.executable, "-c", _PROBE, *GPU_ONLY.values()],
                           capture_output=True, text=True, timeout=120, cwd=ROOT,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    assert seen["torch_on_import"] is False
    assert seen["libraries"] == []
    assert set(seen["reasons"]) == set(GPU_ONLY)
    for name, reason in seen["reasons"].items():
        assert reason.startswith(f"{name}: unsupported: needs CUDA ("), reason
    assert "no DTensor sharding strategy" in seen["reasons"]["torch-context-parallel"]


def _arrays(dtype=np.float16):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 3, 8)).astype(dtype)
    return q, q.copy(), q.copy()


@pytest.mark.parametrize("name", ["flashinfer", "vllm-flash"])
@pytest.mark.parametrize("op", ["sdpa", "sdpa_lse", "paged_sdpa", "merge_states"])
def test_every_op_of_a_gpu_adapter_is_unsupported_with_the_reason(name, op):
    """Through the suite's own call path: the test is unsupported, never failed, and the
    reason says what is missing, before anything the call gives is looked at (a param
    the library lacks included)."""
    from attention_conformance.backend.resolve import load_backend

    q, k, v = _arrays()
    calls = {
        "sdpa": ({"q": q, "k": k, "v": v}, {"causal": "top_left", "window": [2, 0]}),
        "sdpa_lse": ({"q": q, "k": k, "v": v}, {"bias": None}),
        "paged_sdpa": ({"q": q, "k_pages": k.reshape(3, 2, 1, 8), "v_pages": v.reshape(3, 2, 1, 8)},
                       {"block_table": [[0, 1, 2]], "kv_lengths": [5]}),
        "merge_states": ({"outs": q, "lses": q[..., 0]}, {}),
    }
    arrays, params = calls[op]
    with pytest.raises(Unsupported, match=rf"^{name}: unsupported: needs CUDA \("):
        InProcess(load_backend(name)).call(op, arrays, params)


def test_context_parallel_adapter_is_unsupported_without_cuda():
    from attention_conformance.backend.resolve import load_backend

    backend = load_backend("torch-context-parallel")
    assert backend.distributed == "torch.distributed"
    q, k, v = _arrays(np.float32)
    for op in ("sdpa", "sdpa_lse"):
        with pytest.raises(NotImplementedError, match=r"needs CUDA .*no DTensor sharding"):
            getattr(backend, op)(q, k, v, causal="top_left",
                                 shard={"rank": 0, "world_size": 2})


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1"])
def test_an_explicit_device_they_cannot_use_is_a_load_error(device):
    """As for every torch backend (tests/backends/test_devices.py): a device named with
    --device that is no CUDA device here stops the run with one clear error."""
    from attention_conformance.backend.resolve import BackendLoadError, load_backend

    with pytest.raises(BackendLoadError, match="flashinfer"):
        load_backend("flashinfer", device=device)


def test_gpu_certify_check_plans_every_gpu_backend_and_runs_nothing(tmp_path):
    """--check validates the plan (built-in names, a pinned wheel list) and prints each
    step's command; it installs, starts and writes nothing."""
    out = tmp_path / "reports"
    run = subprocess.run(["bash", "scripts/gpu_certify.sh", "--check", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHON": sys.executable})
    assert run.returncode == 0, run.stdout + run.stderr
    commands = [line for line in run.stdout.splitlines() if " -m pytest spec/cases " in line]
    planned = {line.split("--backend ")[1].split()[0] for line in commands}
    assert set(GPU_ONLY) <= planned <= set(BUILTIN)
    assert {"torch-efficient", "torch-cudnn", "jax-cudnn"} <= planned
    assert all(f"--report {out}" in line for line in commands)
    assert not out.exists() and not (ROOT / ".gpu-site").exists()


def test_gpu_certify_check_refuses_a_backend_that_does_not_exist(tmp_path):
    script = (ROOT / "scripts" / "gpu_certify.sh").read_text()
    broken = tmp_path / "scripts"
    broken.mkdir()
    (broken / "gpu_certify.sh").write_text(script.replace("vllm-flash - -n 2",
                                                          "vllm-flahs - -n 2"))
    (broken / "gpu_wheels.txt").write_text("flashinfer-python\n")
    run = subprocess.run(["bash", str(broken / "gpu_certify.sh"), "--check"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHON": sys.executable})
    assert run.returncode == 1
    assert "unknown backends ['vllm-flahs'], unpinned wheels ['flashinfer-python']" in \
        run.stdout + run.stderr


# --------------------------------------------------------------- over CPU stand-ins

STAND_INS = "ATTENTION_CONFORMANCE_GPU_STAND_INS"
#: the topics whose conversions the adapters do themselves (layouts, block tables, CSR,
#: packing, lse shapes and bases, masks; a rank's shards gathered and its rows returned),
#: and those that must have passing tests
_TOPICS = {"FlashinferOnCpu": ("paged or merge or mla or block_sparse or varlen or documents "
                               "or causal or lse or sinks or fp8",
                               {"paged", "merge", "mla", "varlen", "sinks", "fp8"}),
           "VllmFlashOnCpu": ("paged or merge or varlen or causal or lse or softcap or sinks "
                              "or fp8 or mla", {"paged", "merge", "varlen", "sinks", "fp8", "mla"}),
           "ContextParallelOnCpu": ("context_parallel", {"context_parallel"})}


@pytest.mark.skipif(not os.environ.get(STAND_INS),
                    reason=f"slow: tox -e torch-math runs it ({STAND_INS}=1)")
@pytest.mark.parametrize("stand_in", sorted(_TOPICS))
def test_gpu_adapter_conversions_certify_over_cpu_stand_ins(stand_in, tmp_path):
    """The adapter over tests/backends/_gpu_stand_ins.py (each library function it calls,
    in float64 torch, as the library documents it; for context parallelism, plain SDPA
    over the gathered sequence): every selected test passes or is unsupported with a
    reason, none fails, and the forms the adapter converts pass."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
         str(ROOT), str(ROOT / "spec" / "cases"), "-p", "no:cacheprovider", "-q",
         "--backend", f"{ROOT}/tests/backends/_gpu_stand_ins.py:{stand_in}",
         "-k", _TOPICS[stand_in][0], "--report", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    report = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert run.returncode == 0, run.stdout[-3000:]
    passed = {r["topic"] for r in report["results"] if r["status"] == "pass"}
    assert _TOPICS[stand_in][1] <= passed, passed


def test_gpu_certify_only_runs_the_steps_it_names():
    run = subprocess.run(["bash", "scripts/gpu_certify.sh", "--check"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHON": sys.executable,
                              "ONLY": "flashinfer,torch-context-parallel"})
    assert run.returncode == 0, run.stdout + run.stderr
    commands = [line for line in run.stdout.splitlines() if " -m pytest spec/cases " in line]
    assert [line.split("--backend ")[1].split()[0] for line in commands] == \
        ["flashinfer", "torch-context-parallel"]
    assert "--case-timeout 600" in commands[0]


@pytest.mark.parametrize("form", ["sink", "qv", "fp8"])
def test_vllm_flash_refuses_the_flash_attention_3_forms_on_flash_attention_2(form):
    """s_aux, q_v and the descales exist in vLLM's FA3 alone (its FA2 raises on s_aux and
    takes no q_v or descales): on FA2 each is unsupported with that reason, before any
    library call."""
    from attention_conformance.backend.resolve import load_backend

    backend = load_backend(f"{ROOT}/tests/backends/_gpu_stand_ins.py:VllmFlashOnCpu")
    backend.fa_version = 2
    q, k, v = _arrays()
    given = {"sink": dict(sink=np.zeros(2, np.float16)),
             "qv": dict(qv=np.zeros((1, 2, 3, 256), np.float16)),
             "fp8": dict(k_descale=np.ones(1, np.float32))}[form]
    with pytest.raises(NotImplementedError, match="need FlashAttention 3 .* runs FA2"):
        backend.sdpa(q, k, v, **given)
