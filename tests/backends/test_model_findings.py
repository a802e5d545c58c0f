"""Each finding listed for Hugging Face transformers' attention functions and Keras 3's
dot_product_attention in backends/expected_failures/ (and each call-path behaviour their
adapters declare with policy_when or dtype_notes) reproduced directly with the library,
not through the adapters, and compared with a float64 NumPy computation.

Every test asserts that the difference exists: when a library changes, its test fails
here, and the declaration it justifies is to be revisited. A test whose library is not
installed is skipped.
"""

from __future__ import annotations

import math
import types

import numpy as np
import pytest

from test_runtime_findings import _qkv, attend64, rel_err


def _tril(lq, lk):
    """Top-left causal: query i sees keys j <= i."""
    return np.arange(lk)[None, :] <= np.arange(lq)[:, None]


# ===================================================================== transformers


@pytest.fixture(scope="module")
def hf():
    """(torch, the attention functions of transformers) or skip."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.models.llama.modeling_llama import eager_attention_forward

    return types.SimpleNamespace(torch=torch, sdpa=sdpa_attention_forward,
                                 eager=eager_attention_forward)


def _module(**extra):
    return types.SimpleNamespace(num_key_value_groups=1, is_causal=True, training=False,
                                 **extra)


def _t(hf, a, dtype=None):
    return hf.torch.tensor(np.asarray(a), dtype=dtype or hf.torch.float64)


def _eager_mask(hf, allowed, dtype):
    """masking_utils.eager_mask's form: 0 where allowed, finfo(dtype).min elsewhere."""
    torch = hf.torch
    return torch.where(torch.tensor(allowed), torch.zeros((), dtype=dtype),
                       torch.finfo(dtype).min)


def _out(y):
    """The functions' (B, Lq, H, Dv) output as float64 NumPy (B, H, Lq, Dv)."""
    return y.detach().transpose(1, 2).double().numpy()


def test_sdpa_is_causal_with_one_query_is_full_attention(hf):
    """is_causal is SDPA's top-left flag for Lq > 1 and dropped for Lq = 1 (decode), where
    the query then sees every key: bottom-right, not top-left."""
    q, k, v = _qkv(301, lq=1, lk=5)
    out, _ = hf.sdpa(_module(), _t(hf, q), _t(hf, k), _t(hf, v), None, is_causal=True)
    assert rel_err(_out(out), attend64(q, k, v)[0]) < 1e-12
    assert rel_err(_out(out), attend64(q, k, v, allowed=_tril(1, 5))[0]) > 0.1


def test_sdpa_is_causal_crops_keys_past_lq_so_a_hidden_nan_is_never_read(hf):
    """With is_causal, no mask and Lk > Lq > 1 the function keeps the first Lq keys and
    values: a NaN past them is never read, while the same NaN behind an explicit boolean
    mask of the same causal pattern reaches the output (SDPA reads every key)."""
    q, k, v = _qkv(302, lq=3, lk=5)
    k[..., 4, :] = np.nan
    v[..., 4, :] = np.nan
    want, _ = attend64(q, k[..., :3, :], v[..., :3, :], allowed=_tril(3, 3))
    flagged, _ = hf.sdpa(_module(), _t(hf, q), _t(hf, k), _t(hf, v), None, is_causal=True)
    assert np.isfinite(_out(flagged)).all() and rel_err(_out(flagged), want) < 1e-12
    masked, _ = hf.sdpa(_module(), _t(hf, q), _t(hf, k), _t(hf, v),
                        hf.torch.tensor(_tril(3, 5))[None, None], is_causal=True)
    assert np.isnan(_out(masked)).all()


def test_sdpa_position_bias_fills_masked_logits_with_finfo_min(hf):
    """With a position_bias the boolean mask becomes a float mask with finfo(dtype).min at
    masked keys: a query without keys attends uniformly (the mean of V) instead of getting
    SDPA's zero row, and a -inf bias on every allowed key lets the masked keys win."""
    q, k, v = _qkv(303, lq=3, lk=4)
    allowed = np.ones((3, 4), dtype=bool)
    allowed[1] = False                                   # query 1: no key
    bias = np.zeros((1, 1, 3, 4))
    args = (_module(), _t(hf, q), _t(hf, k), _t(hf, v), hf.torch.tensor(allowed)[None, None])
    out = _out(hf.sdpa(*args, position_bias=_t(hf, bias))[0])
    assert np.allclose(out[:, :, 1], v.mean(axis=-2), rtol=1e-12, atol=0)
    assert (_out(hf.sdpa(*args)[0])[:, :, 1] == 0).all()          # a plain mask: zeros
    bias[..., 0, :2] = -np.inf                           # query 0: -inf on keys 0 and 1 ...
    allowed[0, 2:] = False                               # ... its only allowed keys
    args = args[:4] + (hf.torch.tensor(allowed)[None, None],)
    out = _out(hf.sdpa(*args, position_bias=_t(hf, bias))[0])
    assert np.allclose(out[:, :, 0], v[..., 2:, :].mean(axis=-2), rtol=1e-12, atol=0)


def test_sdpa_flash_backward_of_a_single_key_row_is_rounding_not_zero(hf):
    """On 4-D inputs with a mask torch's CPU flash kernel runs the backward: the dq of a
    query that sees one key (exactly 0) is rounding."""
    torch = hf.torch
    r = np.random.RandomState(10741)
    q, k, v, d_out = (r.randn(1, 2, 6, 5) * 2 for _ in range(4))
    allowed = _tril(6, 6)
    leaves = [_t(hf, a).requires_grad_() for a in (q, k, v)]
    out, _ = hf.sdpa(_module(), *leaves, torch.tensor(allowed)[None, None], scaling=0.25)
    dq = torch.autograd.grad(out, leaves[0], _t(hf, d_out).transpose(1, 2))[0].numpy()
    assert np.abs(dq[:, :, 0]).max() > 0                 # 0 in exact arithmetic


def test_eager_softmax_runs_in_float32(hf):
    """float64 left out of transformers-eager: its softmax is computed in float32."""
    q, k, v = _qkv(304, lq=4, lk=6)
    out, _ = hf.eager(_module(), _t(hf, q), _t(hf, k), _t(hf, v), None,
                      scaling=1 / math.sqrt(8))
    assert 1e-9 < rel_err(_out(out), attend64(q, k, v)[0]) < 1e-6


def test_eager_float64_row_without_keys_is_nan_and_float32_one_is_uniform(hf):
    """finfo(float64).min overflows to -inf in the float32 softmax (a NaN row); in float32
    every masked logit is the same finite fill (a uniform row)."""
    torch = hf.torch
    q, k, v = _qkv(305, lq=2, lk=3)
    allowed = np.ones((2, 3), dtype=bool)
    allowed[0] = False
    for dtype, check in ((torch.float64, np.isnan),
                         (torch.float32, lambda o: np.isclose(o, v.mean(axis=-2), atol=1e-6))):
        out, _ = hf.eager(_module(), *(_t(hf, a, dtype) for a in (q, k, v)),
                          _eager_mask(hf, allowed, dtype), scaling=1 / math.sqrt(8))
        assert check(_out(out)[:, :, 0]).all()


def test_eager_uniform_row_has_a_score_gradient(hf):
    """The uniform row comes from equal finite logits, so autograd gives it a score
    gradient: its dq row is not 0 (constant weights 1/Lk would give 0)."""
    torch = hf.torch
    q, k, v = _qkv(306, lq=2, lk=3, d=4, dv=4)
    allowed = np.ones((2, 3), dtype=bool)
    allowed[0] = False
    leaves = [_t(hf, a, torch.float32).requires_grad_() for a in (q, k, v)]
    out, _ = hf.eager(_module(), *leaves, _eager_mask(hf, allowed, torch.float32), scaling=1.0)
    d_out = np.random.RandomState(1).randn(*out.shape)
    dq = torch.autograd.grad(out, leaves[0], _t(hf, d_out, torch.float32))[0].numpy()
    # float64 NumPy: s = the fill + q k^T (the fill absorbs it), P = 1/3, and the score
    # gradient of the row is P * (dP - sum(dP * P)), with dP = dO V^T
    d_o = np.swapaxes(d_out, 1, 2)[:, :, 0]                        # (B, H, Dv)
    dp = d_o[..., None, :] @ np.swapaxes(v, -1, -2)               # (B, H, 1, Lk)
    ds = (dp - dp.mean(axis=-1, keepdims=True)) / 3
    assert rel_err(dq[:, :, 0], (ds @ k)[:, :, 0]) < 1e-5
    assert np.abs(dq[:, :, 0]).max() > 0.1


def test_eager_neg_inf_bias_on_every_allowed_key_lets_masked_keys_win(hf):
    torch = hf.torch
    q, k, v = _qkv(307, lq=2, lk=4)
    allowed = np.ones((2, 4), dtype=bool)
    allowed[0, 2:] = False
    mask = _eager_mask(hf, allowed, torch.float32)
    mask[..., 0, :2] = -math.inf                         # the bias of query 0's allowed keys
    out, _ = hf.eager(_module(), *(_t(hf, a, torch.float32) for a in (q, k, v)), mask[None, None],
                      scaling=1.0)
    assert np.allclose(_out(out)[:, :, 0], v[..., 2:, :].mean(axis=-2), atol=1e-6)


def test_eager_float16_overflowing_masked_score_is_nan(hf):
    """The mask is added: a float16 score that overflows to +inf at a masked key stays
    +inf (inf + finfo(float16).min), and the row is NaN; float64 NumPy ignores the key."""
    torch = hf.torch
    q, k, v = _qkv(308, lq=1, lk=3, d=4, dv=4)
    q[:] = 1.0
    k[..., 2, :] = 3.0e4                                 # q . k = 1.2e5: past 65504
    allowed = np.array([[True, True, False]])
    out, _ = hf.eager(_module(), *(_t(hf, a, torch.float16) for a in (q, k, v)),
                      _eager_mask(hf, allowed, torch.float16), scaling=1.0)
    assert np.isnan(_out(out)).all()
    assert np.isfinite(attend64(q, k, v, allowed=allowed, scale=1.0)[0]).all()


def test_eager_float16_product_past_float16_max_is_nan_before_the_scale(hf):
    """The scale comes after the product (matmul, then * scaling): a float16 q . k of 8e4
    is inf although its logit, 4e4, is a float16 number, and the row is NaN; float64
    NumPy gives that key every weight."""
    torch = hf.torch
    q, k, v = _qkv(309, lq=1, lk=3, d=4, dv=4)
    q[:] = 2.0
    k[..., 1, :] = 1.0e4                                 # q . k = 8e4, logit 4e4
    out, _ = hf.eager(_module(), *(_t(hf, a, torch.float16) for a in (q, k, v)), None,
                      scaling=0.5)
    assert np.isnan(_out(out)).all()
    assert np.allclose(attend64(q, k, v, scale=0.5)[0], v[..., 1:2, :], rtol=0, atol=1e-12)


# ===================================================================== Keras 3 on torch


@pytest.fixture(scope="module")
def keras_torch():
    """keras.ops on the torch backend, or skip (Keras's backend is chosen once a process:
    a process whose Keras runs on another one skips too)."""
    import os
    import sys

    pytest.importorskip("torch")
    if "keras" not in sys.modules:
        os.environ["KERAS_BACKEND"] = "torch"
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "torch":
        pytest.skip(f"Keras runs on {keras.backend.backend()} in this process")
    return keras.ops


def _bthd(*arrays, dtype):
    """(B, H, L, D) float64 arrays as Keras's (B, L, H, D) of dtype."""
    return [np.ascontiguousarray(np.swapaxes(a, 1, 2)).astype(dtype) for a in arrays]


def test_keras_torch_computes_float64_in_float32(keras_torch):
    q, k, v = _qkv(401, lq=3, lk=5)
    out = keras_torch.convert_to_numpy(keras_torch.dot_product_attention(
        *_bthd(q, k, v, dtype=np.float64)))
    assert out.dtype == np.float32
    assert 1e-9 < rel_err(np.swapaxes(out, 1, 2), attend64(q, k, v)[0]) < 1e-5


def test_keras_torch_float16_row_without_keys_attends_as_if_unmasked(keras_torch):
    """The mask's fill, -0.7 * 65500, is added to the scores in float32 inside torch's
    SDPA: a row whose every key is masked keeps its scores' differences."""
    q, k, v = _qkv(402, lq=2, lk=4, d=4, dv=4)
    allowed = np.ones((1, 1, 2, 4), dtype=bool)
    allowed[..., 0, :] = False
    out = keras_torch.convert_to_numpy(keras_torch.dot_product_attention(
        *_bthd(q, k, v, dtype=np.float16), mask=allowed))
    unmasked, _ = attend64(q, k, v)
    assert np.allclose(np.swapaxes(out, 1, 2)[:, :, 0], unmasked[:, :, 0], atol=5e-3)
    assert not np.allclose(unmasked[:, :, 0], v.mean(axis=-2), atol=0.05)    # not uniform


def test_keras_torch_uniform_row_has_a_score_gradient(keras_torch):
    """The uniform row comes from equal finite logits, so its dq is not 0; torch's CPU
    flash kernel (4-D, Dk == Dv) even recomputes its weights as exp(s - lse) = 1, since
    lse = fill + log(Lk) rounds to the fill: dS = dP - rowsum(dO * O), Lk times the
    softmax's own gradient."""
    import torch

    q, k, v = _qkv(403, lq=2, lk=3, d=4, dv=4)
    allowed = np.ones((1, 1, 2, 3), dtype=bool)
    allowed[..., 0, :] = False
    leaves = [torch.tensor(a).requires_grad_() for a in _bthd(q, k, v, dtype=np.float32)]
    out = keras_torch.dot_product_attention(*leaves, mask=allowed, scale=1.0)
    assert np.allclose(out[:, 0].detach().numpy(), v.mean(axis=-2), atol=1e-6)  # uniform
    d_out = np.random.RandomState(2).randn(*out.shape).astype(np.float32)
    dq = torch.autograd.grad(out, leaves[0], torch.tensor(d_out))[0].numpy()
    dp = d_out[:, 0][..., None, :] @ np.swapaxes(v, -1, -2)          # dO V^T: (B, H, 1, Lk)
    assert rel_err(dq[:, 0], ((dp - dp.mean(axis=-1, keepdims=True)) @ k)[:, :, 0]) < 1e-5
    assert np.abs(dq[:, 0]).max() > 0.1                               # 0 is due


def test_keras_torch_bias_with_is_causal_is_refused(keras_torch):
    q, k, v = _qkv(404, lq=3, lk=3, dv=4)             # Dv != Dk: not the flash kernel
    bias = np.zeros((1, 1, 3, 3), dtype=np.float32)
    with pytest.raises(RuntimeError, match="Explicit attn_mask should not be set when "
                                           "is_causal=True"):
        keras_torch.dot_product_attention(*_bthd(q, k, v, dtype=np.float32), bias=bias,
                                          is_causal=True)
    assert np.isfinite(attend64(q, k, v, allowed=_tril(3, 3), bias=bias)[0]).all()


# ===================================================== Keras 3 on TensorFlow and on JAX
#
# Keras picks its backend once a process: the reproductions on TensorFlow and on JAX are
# jobs run together in one process of that backend's own (one TensorFlow start, one JAX
# start), each job a piece of code with the NumPy inputs a function below registers.

_JOBS: dict = {"tensorflow": {}, "jax": {}}

_RUNNER = """
import pickle, sys, traceback
import numpy as np
from keras import ops
results = {}
for name, (code, arrays) in pickle.loads(sys.stdin.buffer.read()).items():
    scope = dict(arrays, np=np, ops=ops)
    try:
        exec(code, scope)
        results[name] = scope["result"]
    except Exception:
        results[name] = {"job failed": traceback.format_exc()}
with open(sys.argv[1], "wb") as f:
    pickle.dump(results, f)
"""


def _job(backend: str, code: str, jobs: dict = _JOBS):
    """Register the decorated function's arrays (a dict of NumPy arrays) as the inputs of
    `code`, run with Keras on `backend`: the arrays and `ops` (keras.ops) are its globals,
    and it sets `result` (a dict of arrays or strings). `jobs`: another module's own."""
    def register(inputs):
        jobs[backend][inputs.__name__] = (code, inputs)
        return inputs
    return register


def _run_jobs(backend: str, tmp_path_factory, registry: dict = _JOBS) -> dict:
    """Every job of `backend` in one process with Keras on it: {job name: result}."""
    import importlib.util
    import os
    import pickle
    import subprocess
    import sys

    for module in ("keras", backend):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    jobs = {name: (code, inputs()) for name, (code, inputs) in registry[backend].items()}
    out = tmp_path_factory.mktemp(f"keras-{backend}") / "results.pickle"
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", _RUNNER, str(out)], input=pickle.dumps(jobs),
                          env=env, capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return pickle.loads(out.read_bytes())


def _result(results: dict, inputs) -> dict:
    """The result of the job registered by `inputs`; its traceback if it raised."""
    got = results[inputs.__name__]
    assert "job failed" not in got, got.get("job failed")
    return got


@pytest.fixture(scope="module")
def keras_tf(tmp_path_factory):
    return _run_jobs("tensorflow", tmp_path_factory)


def _keras(*arrays, dtype):
    """(B, H, L, D) float64 arrays as a dict q, k, v, ... of Keras's (B, L, H, D) in dtype."""
    return dict(zip("qkv", _bthd(*arrays, dtype=dtype)))


@_job("tensorflow", """
result = {s: ops.convert_to_numpy(ops.dot_product_attention(q, k, v, scale=scale))
          for s, scale in (("default", None), ("given", 1 / np.sqrt(6)))}
""")
def _tf_default_scale():
    return _keras(*_qkv(501, lq=3, lk=5, d=6, dv=6), dtype=np.float64)   # sqrt(6): not exact


def test_keras_tensorflow_default_scale_is_computed_in_float32(keras_tf):
    got = _result(keras_tf, _tf_default_scale)
    q, k, v = _qkv(501, lq=3, lk=5, d=6, dv=6)
    want, _ = attend64(q, k, v)
    assert got["default"].dtype == np.float64
    assert rel_err(np.swapaxes(got["given"], 1, 2), want) < 1e-13
    assert 1e-9 < rel_err(np.swapaxes(got["default"], 1, 2), want) < 1e-6
    root = np.float64(1 / np.sqrt(np.float32(6)))                   # the float32 scale
    assert rel_err(np.swapaxes(got["default"], 1, 2), attend64(q, k, v, scale=root)[0]) < 1e-13


def _mqa_inputs():
    r = np.random.RandomState(502)
    return r.randn(1, 2, 3, 4), r.randn(1, 1, 5, 4), r.randn(1, 1, 5, 4)


@_job("tensorflow", """
try:
    ops.dot_product_attention(q, k, v)
    result = {"error": ""}
except Exception as e:
    result = {"error": str(e)}
""")
def _tf_multi_query():
    return _keras(*_mqa_inputs(), dtype=np.float32)


def test_keras_tensorflow_multi_query_attention_fails(keras_tf):
    """One key/value head for two query heads: documented (MQA, K == 1), refused by the
    einsum; float64 NumPy gives every query head the same key head."""
    assert "Expected dimension" in _result(keras_tf, _tf_multi_query)["error"]
    assert np.isfinite(attend64(*_mqa_inputs())[0]).all()


def _neg_inf_bias_inputs():
    q, k, v = _qkv(503, lq=2, lk=4)
    allowed = np.ones((1, 1, 2, 4), dtype=bool)
    allowed[..., 0, 2:] = False
    bias = np.zeros((1, 1, 2, 4))
    bias[..., 0, :2] = -np.inf                                     # query 0's allowed keys
    return q, k, v, allowed, bias


def _neg_inf_bias_arrays():
    q, k, v, allowed, bias = _neg_inf_bias_inputs()
    return dict(_keras(q, k, v, dtype=np.float32), bias=bias.astype(np.float32), mask=allowed)


_job("tensorflow", """
result = {"out": ops.convert_to_numpy(ops.dot_product_attention(q, k, v, bias=bias,
                                                                mask=mask))}
""")(_neg_inf_bias_arrays)


def _assert_masked_keys_win(results):
    """Query 0's allowed keys (0, 1) have a -inf bias: its masked keys 2, 3 share it."""
    _, _, v, _, _ = _neg_inf_bias_inputs()
    out = np.swapaxes(_result(results, _neg_inf_bias_arrays)["out"], 1, 2)
    assert np.allclose(out[:, :, 0], v[..., 2:, :].mean(axis=-2), atol=1e-6)


def test_keras_tensorflow_neg_inf_bias_on_every_allowed_key_lets_masked_keys_win(keras_tf):
    _assert_masked_keys_win(keras_tf)


def _head_dim_1024_inputs():
    """precision-qk-sum-over-head-dim-1024's inputs: q . k over 1024 columns of 1.0, 0.75
    and k rows of 0.25 ... 1.25, every partial sum a multiple of 1/16 (exact in float16 up
    to 512, then rounded to 0.5, 1, ...), and its scale 1/512."""
    q = np.ones((1, 1, 2, 1024))
    q[..., 1, :] = 0.75
    k = np.ones((1, 1, 6, 1024)) * np.array([0.25, 0.5, 0.625, 0.875, 1.0, 1.25])[:, None]
    v = np.random.RandomState(40911).randn(1, 1, 6, 8)
    return q, k, v


@_job("tensorflow", """
import tensorflow as tf
result = {
    # the scores exactly as keras.ops.dot_product_attention forms them on TensorFlow
    "einsum": tf.einsum("BTNH,BSNH->BNTS", q, k, optimize="optimal").numpy(),
    "matmul": tf.matmul(q[0, :, 0], k[0, :, 0], transpose_b=True).numpy(),
    "out": ops.convert_to_numpy(ops.dot_product_attention(q, k, v, scale=1 / 512)),
}
""")
def _tf_head_dim_1024():
    return _keras(*_head_dim_1024_inputs(), dtype=np.float16)


def test_keras_tensorflow_float16_scores_are_summed_in_float16(keras_tf):
    """tf.einsum, which dot_product_attention forms the scores with, keeps its float16
    partial sums in float16 on a CPU whose oneDNN takes no float16 (Eigen's kernel; "oneDNN
    supports DT_HALF only on platforms with AVX-512", it logs): over a head dim of 1024
    the scores drift (615 where 640 is exact, 1.201 after the scale where 1.25 is), while
    tf.matmul of the same float16 operands is exact; the output follows the drifted
    scores, far from float64."""
    got = _result(keras_tf, _tf_head_dim_1024)
    q, k, v = _head_dim_1024_inputs()
    exact = q @ np.swapaxes(k, -1, -2)                              # exact in float16 too
    if np.array_equal(got["einsum"].astype(np.float64), exact):
        pytest.skip("this CPU sums tf.einsum's float16 products in float32 (the expected "
                    "failure is not strict)")
    assert np.array_equal(got["matmul"].astype(np.float64), exact[0, 0])
    assert rel_err(got["einsum"], exact) > 0.01
    drifted, _ = attend64(q, k, v, scale=1 / 512, bias=got["einsum"] / 512 - exact / 512)
    out = np.swapaxes(got["out"], 1, 2)
    assert rel_err(out, drifted) < 5e-3                             # float16 rounding
    assert rel_err(out, attend64(q, k, v, scale=1 / 512)[0]) > 0.02


def _overflow_inputs():
    """q . k of 8e4 at key 1 (past float16's largest, 65504) and a logit of 4e4 after the
    default scale 1/2, which float16 holds: key 1 takes every weight."""
    q = np.full((1, 2, 3, 4), 2.0)
    k = np.random.RandomState(40921).randn(1, 2, 5, 4)
    k[..., 1, :] = 1.0e4
    v = np.random.RandomState(40922).randn(1, 2, 5, 4)
    return q, k, v


@_job("tensorflow", """
import tensorflow as tf
result = {"einsum": tf.einsum("BTNH,BSNH->BNTS", q, k, optimize="optimal").numpy(),
          "out": ops.convert_to_numpy(ops.dot_product_attention(q, k, v))}
""")
def _tf_overflow():
    return _keras(*_overflow_inputs(), dtype=np.float16)


def test_keras_tensorflow_float16_q_k_overflows_before_the_scale(keras_tf):
    """dot_product_attention forms q . kᵀ in float16 (tf.einsum) and scales it after: a
    product past 65504 is inf even though its logit (4e4) is a float16 number, and the
    row's softmax is NaN (inf - inf); float64 NumPy gives key 1's value."""
    got = _result(keras_tf, _tf_overflow)
    q, k, v = _overflow_inputs()
    assert np.isposinf(got["einsum"][..., 1]).all()
    assert np.isnan(got["out"]).all()
    want, _ = attend64(q, k, v)
    assert abs(float(np.float16(4.0e4)) - 4.0e4) < 32                # the logit fits
    assert np.allclose(want, v[..., 1:2, :], rtol=0, atol=1e-12)


@pytest.fixture(scope="module")
def keras_jax(tmp_path_factory):
    return _run_jobs("jax", tmp_path_factory)


_CATCH = """
def attempt(f, *args):
    try:
        return ops.convert_to_numpy(f(*args))
    except Exception as e:
        return type(e).__name__ + ": " + str(e)
"""


@_job("jax", _CATCH + """
import jax
from jax import lax
attend = lambda q, k, v: ops.dot_product_attention(q, k, v)
# the product jax.nn.dot_product_attention asks for in float16, alone
dot = lambda a, b: lax.dot_general(a, b, (((1,), (1,)), ((), ())),
                                   precision=lax.DotAlgorithmPreset.F16_F16_F32,
                                   preferred_element_type=np.float32)
result = {"jitted": attempt(jax.jit(attend), q, k, v), "eager": attempt(attend, q, k, v),
          "dot_jitted": attempt(jax.jit(dot), q[0, :, 0], k[0, :, 0]),
          "dot_eager": attempt(dot, q[0, :, 0], k[0, :, 0])}
""")
def _jax_float16():
    return _keras(*_qkv(601, lq=3, lk=5, d=4, dv=4), dtype=np.float16)


def test_keras_jax_jitted_float16_fails_to_compile_on_the_cpu(keras_jax):
    """jax.nn.dot_product_attention, which Keras calls, asks dot_general for precision
    F16_F16_F32; XLA's CPU backend refuses it when the jitted program is lowered, after
    tracing, where neither jax's try/except (back to the default precision) nor Keras's
    (back to its own implementation) can catch it. Eagerly the product runs at once, the
    error is caught, and the same call is right."""
    got = _result(keras_jax, _jax_float16)
    refused = "The precision 'F16_F16_F32' is not supported by dot_general on CPU"
    assert refused in got["jitted"] and refused in got["dot_jitted"]
    assert refused in got["dot_eager"]
    q, k, v = _qkv(601, lq=3, lk=5, d=4, dv=4)
    want, _ = attend64(*(a.astype(np.float16) for a in (q, k, v)))
    assert rel_err(np.swapaxes(got["eager"], 1, 2), want) < 1e-2


@_job("jax", _CATCH + """
import jax
attend = lambda q, k, v: ops.dot_product_attention(q, k, v)
result = {"jitted": attempt(jax.jit(attend), q, k, v), "eager": attempt(attend, q, k, v)}
""")
def _jax_narrow_values():
    return _keras(*_qkv(602, lq=3, lk=5, d=4, dv=6), dtype=np.float32)


def test_keras_jax_values_wider_than_keys_fail(keras_jax):
    """Dv != Dk: jax.nn.dot_product_attention refuses it, Keras falls back to its own
    implementation, which reshapes the output to the query's shape (B, T, N, Dk): a
    TypeError, eager or jitted. float64 NumPy computes it (keras-jax zero-pads to one
    width, exact)."""
    got = _result(keras_jax, _jax_narrow_values)
    for form in ("jitted", "eager"):
        assert got[form].startswith("TypeError: cannot reshape array"), got[form]
    assert np.isfinite(attend64(*_qkv(602, lq=3, lk=5, d=4, dv=6))[0]).all()


@_job("jax", _CATCH + """
import jax
attend = lambda q, k, v: ops.dot_product_attention(q, k, v)
result = {"jitted": attempt(jax.jit(attend), q, k, v), "eager": attempt(attend, q, k, v)}
""")
def _jax_bfloat16_one_query_and_key():
    import ml_dtypes

    return _keras(*_qkv(603, h=1, lq=1, lk=1, d=4, dv=4), dtype=ml_dtypes.bfloat16)


def test_keras_jax_jitted_bfloat16_with_one_query_and_key_fails_on_the_cpu(keras_jax):
    """bfloat16 asks dot_general for BF16_BF16_F32, which XLA's CPU emitter refuses where
    its products degenerate (one batch element, one head, one query, one key): jitted,
    the call fails; eagerly it runs (and is right)."""
    got = _result(keras_jax, _jax_bfloat16_one_query_and_key)
    assert "ALG_DOT_BF16_BF16_F32" in got["jitted"]
    q, k, v = _qkv(603, h=1, lq=1, lk=1, d=4, dv=4)
    assert rel_err(np.swapaxes(got["eager"].astype(np.float64), 1, 2),
                   attend64(q, k, v)[0]) < 3e-2


_job("jax", """
import jax
attend = jax.jit(lambda q, k, v, bias, mask: ops.dot_product_attention(q, k, v, bias=bias,
                                                                       mask=mask))
result = {"out": ops.convert_to_numpy(attend(q, k, v, bias, mask))}
""")(_neg_inf_bias_arrays)


def test_keras_jax_neg_inf_bias_on_every_allowed_key_lets_masked_keys_win(keras_jax):
    _assert_masked_keys_win(keras_jax)
