"""Each finding listed for Flax NNX's dot_product_attention in
backends/expected_failures/flax-nnx.yaml (and what the flax-nnx adapter routes around or
leaves out with dtype_notes) reproduced directly with Flax, not through the adapter, and
compared with a float64 NumPy computation.

Every test asserts that the difference exists: when Flax changes, its test fails here,
and the declaration it justifies is to be revisited. Skipped where flax is not installed
(the flax-nnx tox environment runs it after the spec).
"""

from __future__ import annotations

import inspect

import ml_dtypes
import numpy as np
import pytest

from test_runtime_findings import _qkv, attend64, rel_err

pytest.importorskip("flax")
jax = pytest.importorskip("jax")
from flax import nnx  # noqa: E402


class _Sown(nnx.Module):
    """Where Flax's own path sows its attention weights."""


def _own(q, k, v, **keywords):
    """(output, weights) of Flax's own path: nnx.dot_product_attention given a module."""
    call = nnx.capture(lambda module, q, k, v: nnx.dot_product_attention(
        q, k, v, module=module, **keywords), nnx.Intermediate)
    out, sown = call(_Sown(), q, k, v)
    return out, sown["attention_weights"].get_value()[0]


def _tokens(a, dtype=np.float32):
    """(B, H, L, D) NumPy as Flax's (B, L, H, D) array of `dtype`."""
    return jax.numpy.asarray(np.swapaxes(np.asarray(a), 1, 2).astype(dtype))


def _heads(y):
    """Flax's (B, L, H, D) result as float64 NumPy (B, H, L, D)."""
    return np.swapaxes(np.asarray(y).astype(np.float64), 1, 2)


def test_default_path_refuses_values_wider_than_keys_and_the_own_path_takes_them():
    """Dv != Dk: the default path (jax.nn.dot_product_attention) raises, while the own path
    (module=) computes it, as float64 NumPy does (flax-nnx zero-pads to one width)."""
    q, k, v = _qkv(701, lq=3, lk=5, d=4, dv=6)
    with pytest.raises(ValueError, match="value shape should be"):
        nnx.dot_product_attention(_tokens(q), _tokens(k), _tokens(v))
    out, _ = _own(_tokens(q), _tokens(k), _tokens(v))
    assert rel_err(_heads(out), attend64(q, k, v)[0]) < 1e-6


def test_there_is_no_scale_argument():
    """Neither path takes a scale (both apply 1/sqrt(Dk)): the adapter pre-scales q."""
    for f in (nnx.dot_product_attention, nnx.MultiHeadAttention.__call__):
        assert "scale" not in inspect.signature(f).parameters


def test_jitted_default_path_cannot_lower_float16_on_the_cpu():
    """The default path asks dot_general for precision F16_F16_F32, which XLA's CPU backend
    refuses when a jitted program is lowered (jax's fallback catches it only eagerly,
    where the same call is right), and nnx.MultiHeadAttention takes it; the own path,
    jitted, runs float16."""
    q, k, v = _qkv(702, lq=3, lk=5, d=4, dv=4)
    half = [_tokens(a, np.float16) for a in (q, k, v)]
    with pytest.raises(ValueError, match="'F16_F16_F32' is not supported by dot_general"):
        jax.jit(nnx.dot_product_attention)(*half)
    want, _ = attend64(q, k, v)
    assert rel_err(_heads(nnx.dot_product_attention(*half)), want) < 2e-3
    own = jax.jit(lambda *qkv: _own(*qkv)[0])(*half)
    assert rel_err(_heads(own), want) < 2e-3
    layer = nnx.MultiHeadAttention(2, 8, dtype=np.float16, param_dtype=np.float16,
                                   decode=False, rngs=nnx.Rngs(0))   # calls that path too
    with pytest.raises(ValueError, match="'F16_F16_F32' is not supported by dot_general"):
        jax.jit(lambda x: layer(x))(jax.numpy.ones((1, 3, 8), np.float16))


def test_jitted_bfloat16_with_one_query_and_one_key_fails_on_the_cpu():
    """bfloat16 asks dot_general for BF16_BF16_F32, which XLA's CPU emitter refuses where
    the products degenerate (one batch element, head, query and key); eagerly it runs."""
    q, k, v = _qkv(703, h=1, lq=1, lk=1, d=4, dv=4)
    half = [_tokens(a, ml_dtypes.bfloat16) for a in (q, k, v)]
    with pytest.raises(Exception, match="ALG_DOT_BF16_BF16_F32"):
        np.asarray(jax.jit(nnx.dot_product_attention)(*half))
    assert rel_err(_heads(nnx.dot_product_attention(*half)), attend64(q, k, v)[0]) < 3e-2


def test_float64_is_float32_then_float32_accurate_on_the_default_path():
    """Without jax_enable_x64 float64 inputs come back float32; with it the default path
    still computes its softmax in float32 (~1e-7 from float64 NumPy), while the own path
    is float64-accurate: flax-nnx leaves float64 out (dtype_notes)."""
    q, k, v = _qkv(704)
    want, _ = attend64(q, k, v)
    wide = [np.float64] * 3
    with jax.enable_x64(False):
        assert nnx.dot_product_attention(*map(_tokens, (q, k, v), wide)).dtype == np.float32
    with jax.enable_x64(True):
        out = nnx.dot_product_attention(*map(_tokens, (q, k, v), wide))
        own, _ = _own(*map(_tokens, (q, k, v), wide))
    assert out.dtype == np.float64 and 1e-9 < rel_err(_heads(out), want) < 1e-6
    assert rel_err(_heads(own), want) < 1e-14


def test_neg_inf_bias_on_every_allowed_key_lets_masked_keys_win_on_both_paths():
    """Query 0 may see keys 0 and 1, whose bias is -inf: float64 NumPy gives that row
    zero weight everywhere (no allowed key survives), while both paths fill masked logits
    with a finite number that beats -inf: the masked keys 2 and 3 get weight 1/2 each."""
    q, k, v = _qkv(705, lq=2, lk=4)
    allowed = np.array([[True, True, False, False], [True] * 4])
    bias = np.zeros((2, 4), np.float32)
    bias[0, :2] = -np.inf
    mask, bias = (jax.numpy.asarray(x)[None, None] for x in (allowed, bias))
    _, p = attend64(q, k, v, allowed=allowed, bias=np.asarray(bias[0, 0], np.float64))
    assert not p[..., 0, :].any()
    out = nnx.dot_product_attention(*map(_tokens, (q, k, v)), bias=bias, mask=mask)
    assert np.allclose(_heads(out)[..., 0, :], v[..., 2:, :].mean(axis=-2), atol=1e-6)
    _, weights = _own(*map(_tokens, (q, k, v)), bias=bias, mask=mask)
    assert np.allclose(np.asarray(weights)[..., 0, :], [0, 0, 0.5, 0.5])
