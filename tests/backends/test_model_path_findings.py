"""What the transformers-flex backend and the keras backends' layer path (Keras 3's
MultiHeadAttention and GroupQueryAttention) find or route around, reproduced directly
with the library, not through the adapters, and compared with a float64 NumPy
computation (as tests/backends/test_model_findings.py does for the other paths of
transformers and Keras).

Every test asserts that the difference exists: when a library changes, its test fails
here, and the declaration it justifies is to be revisited. A test whose library is not
installed is skipped.
"""

from __future__ import annotations

import math
import types
import warnings

import numpy as np
import pytest

from test_model_findings import _job, _result, _run_jobs
from test_runtime_findings import _qkv, attend64, rel_err

# ===================================================================== transformers-flex


@pytest.fixture(scope="module")
def hf_flex():
    """transformers' flex_attention_forward with the library's compiled singleton given
    torch's eager flex_attention, as the transformers-flex adapter gives it (compiling
    costs ~25 s a shape on the CPU), or skip."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from transformers.integrations.flex_attention import (
        WrappedFlexAttention,
        flex_attention_forward,
    )

    WrappedFlexAttention(False)._compiled_flex_attention = flex_attention
    return types.SimpleNamespace(torch=torch, forward=flex_attention_forward,
                                 block_mask=create_block_mask)


def _flex(hf_flex, q, k, v, attention_mask, **kwargs):
    """flex_attention_forward on float64 (B, H, L, D) arrays, as a model's layer calls it:
    (its output as (B, H, Lq, Dv) NumPy, its lse)."""
    torch = hf_flex.torch
    module = types.SimpleNamespace(training=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # eager flex warns that it is not compiled
        out, lse = hf_flex.forward(module, *(torch.tensor(a) for a in (q, k, v)),
                                   attention_mask, **kwargs)
    return out.transpose(1, 2).numpy(), lse


def test_transformers_flex_float_mask_is_read_at_head_0_for_every_head(hf_flex):
    """A float (additive) attention_mask goes into the score_mod as
    score_mask[batch_idx][0][q_idx][kv_idx]: every head reads head 0's mask. The adapter
    gives a BlockMask, as a model's flex masks are, which is read per head."""
    q, k, v = _qkv(701, h=2, lq=3, lk=5)
    allowed = np.ones((1, 2, 3, 5), dtype=bool)
    allowed[:, 1, :, 3:] = False                          # head 1 may not see keys 3, 4
    fill = np.where(allowed, 0.0, np.finfo(np.float64).min)
    out, _ = _flex(hf_flex, q, k, v, hf_flex.torch.tensor(fill))
    want, _ = attend64(q, k, v, allowed=allowed)
    assert rel_err(out[:, 0], want[:, 0]) < 1e-12
    assert rel_err(out[:, 1], attend64(q, k, v)[0][:, 1]) < 1e-12      # head 0's mask
    assert rel_err(out[:, 1], want[:, 1]) > 0.05


def test_transformers_flex_refuses_sinks_and_returns_no_lse_on_the_cpu(hf_flex):
    """On the CPU the function asks flex for no lse ("a runtime issue"), so it has no lse
    to fold a sink (s_aux) into: it refuses sinks there; float64 NumPy has the sink's
    output (softmax with one more logit per row, its value 0)."""
    q, k, v = _qkv(702, h=2, lq=3, lk=4)
    _, lse = _flex(hf_flex, q, k, v, None)
    assert lse is None
    with pytest.raises(ValueError, match="Attention sinks cannot be run on CPU"):
        _flex(hf_flex, q, k, v, None, s_aux=hf_flex.torch.zeros(2, dtype=hf_flex.torch.float64))
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    top = s.max(axis=-1, keepdims=True)
    p = np.exp(s - top) / (np.exp(s - top).sum(axis=-1, keepdims=True) + np.exp(-top))
    assert np.isfinite(p @ v).all()


def test_transformers_flex_block_mask_row_without_keys_is_zero_and_hidden_nan_unread(hf_flex):
    """The adapter's declared choices (flex_attention's, as torch-flex declares them):
    with a BlockMask a row without keys is 0 (fully_masked_rows: zeros), and a NaN key
    at a masked position is never scored (masked_key_nan: ignored)."""
    q, k, v = _qkv(703, h=2, lq=3, lk=5)
    allowed = np.ones((3, 5), dtype=bool)
    allowed[0, :] = False                                   # query 0 sees no key
    allowed[:, 4] = False                                   # nobody sees key 4
    k[..., 4, :] = np.nan
    table = hf_flex.torch.tensor(allowed)
    blocks = hf_flex.block_mask(lambda b, h, i, j: table[i, j], None, None, 3, 5,
                                device="cpu")
    out, _ = _flex(hf_flex, q, k, v, blocks)
    want, _ = attend64(q, k, v, allowed=allowed)            # rows without keys: 0
    assert np.isfinite(out).all() and np.all(out[:, :, 0] == 0)
    assert rel_err(out, want) < 1e-12


# ======================================================== Keras 3's attention layers

_LAYER_JOBS: dict = {"tensorflow": {}}


@pytest.fixture(scope="module")
def keras_tf_layers(tmp_path_factory):
    return _run_jobs("tensorflow", tmp_path_factory, _LAYER_JOBS)


def _mha_inputs(seed, heads=2, dh=3, e=6, lq=4, lk=5):
    r = np.random.RandomState(seed)
    query, key = r.randn(1, lq, e), r.randn(1, lk, e)
    return dict(query=query, key=key, w_q=r.randn(e, heads * dh), w_k=r.randn(e, heads * dh),
                w_v=r.randn(e, heads * dh), w_o=r.randn(heads * dh, e))


def _mha64(query, key, w_q, w_k, w_v, w_o, *, heads, scale):
    """Multi-head attention in float64 NumPy: projections, heads, attend64, w_o."""
    def split(x):
        return np.swapaxes(x.reshape(x.shape[:-1] + (heads, -1)), 1, 2)
    out, _ = attend64(split(query @ w_q), split(key @ w_k), split(key @ w_v), scale=scale)
    return np.swapaxes(out, 1, 2).reshape(query.shape[:-1] + (-1,)) @ w_o


@_job("tensorflow", """
import math
import keras
layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=3, use_bias=False,
                                        dtype="float64")
layer.build(query.shape, key.shape, key.shape)
layer.set_weights([w_q.reshape(6, 2, 3), w_k.reshape(6, 2, 3), w_v.reshape(6, 2, 3),
                   w_o.reshape(2, 3, 6)])
q, k = (x.reshape(1, -1, 2, 3) for x in (query @ w_q, key @ w_k))
v = (key @ w_v).reshape(1, -1, 2, 3)
result = {"layer": ops.convert_to_numpy(layer(query, key)),
          "python_float": ops.convert_to_numpy(
              ops.dot_product_attention(q, k, v, scale=1 / math.sqrt(3))),
          "numpy_float64": ops.convert_to_numpy(
              ops.dot_product_attention(q, k, v, scale=np.float64(1 / math.sqrt(3))))}
""", _LAYER_JOBS)
def _tf_layer_scale():
    return _mha_inputs(711)


def test_keras_tensorflow_layers_round_their_scale_to_float32(keras_tf_layers):
    """MultiHeadAttention gives dot_product_attention its scale 1/sqrt(key_dim) as a
    Python float, which the TensorFlow backend casts with tf.cast(scale, float64):
    TensorFlow makes a Python float a float32 tensor first, so float64 results carry the
    scale's float32 rounding; the same scale as a NumPy float64 is exact."""
    got = _result(keras_tf_layers, _tf_layer_scale)
    inputs = _mha_inputs(711)
    exact = _mha64(**inputs, heads=2, scale=1 / math.sqrt(3))
    rounded = _mha64(**inputs, heads=2, scale=float(np.float32(1 / math.sqrt(3))))
    assert got["layer"].dtype == np.float64
    assert 1e-10 < rel_err(got["layer"], exact) < 1e-6
    assert rel_err(got["layer"], rounded) < 1e-13
    assert rel_err(got["python_float"], got["numpy_float64"]) > 1e-10
