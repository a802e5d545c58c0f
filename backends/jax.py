"""JAX backend: certifies ``jax.nn.dot_product_attention`` against the specification.

The adapter is thin: NumPy in, the framework's own public op, NumPy out. Paths per op:

- ``sdpa``: native ``jax.nn.dot_product_attention(implementation="xla")`` with
  ``mask=``, ``bias=``, ``scale=``, ``is_causal=`` (top-left; also bottom-right when
  Lq == Lk) and ``local_window_size=`` (when the window's offset is 0). Bottom-right
  causal with Lq != Lk and its windows go in as an explicit boolean ``mask=``.
  Grouped-query is native (N_q a multiple of N_kv). The native op wants value and
  key of one head width, so Dv != Dk is zero-padded to a common width (exact: the
  padding adds 0·0 terms to q·k and zero columns to the output, which are dropped).
  With ``softcap`` (no native parameter) it is composed from jax.numpy.
- ``sdpa_vjp``: ``jax.vjp`` of exactly the ``sdpa`` path.
- ``sdpa_lse``: native, the same call with ``return_residual=True`` (its logsumexp, in
  float32); with ``softcap``, ``jax.nn.logsumexp`` of the composed scores.
- ``sink`` (attention_weights, sdpa, sdpa_lse, sdpa_vjp): JAX has none; composed around
  the native lse, ``lse' = logaddexp(lse, sink)``, ``out' = out exp(lse - lse')``. For
  ``sdpa_vjp`` with a sink the whole forward is composed (jax.numpy scores,
  ``jax.nn.logsumexp``) and ``jax.vjp`` runs through it: the native op's residual
  carries no gradient (``jax.grad`` of its logsumexp is 0, a finding), so ``d_sink``
  and the sink's share of dq, dk cannot come through it.
- ``attention_weights``: composed (JAX exposes no probability matrix), masking the
  way the native op does (a large negative fill, not -inf), so that its policies are
  the native op's.
- ``softmax``: native ``jax.nn.softmax``.
- ``scores``: composed from jax.numpy (JAX has no score-function API).
- ``self_attention``: ``x @ w`` projections, then the ``sdpa`` path.
- ``multi_head_attention``: JAX itself has no MHA layer (it lives in flax), so
  projections, head split and ``w_o`` are composed around the native
  ``dot_product_attention`` (which takes (B, T, N, H) heads directly and does GQA).

Layout: the interface is ``(*batch, heads, L, D)``; the native op is ``(B, T, N, H)``
(tokens before heads). Leading dims are broadcast and flattened into B, dim -3 is N.

Constructing the backend turns on ``jax_enable_x64`` (a process-wide JAX setting),
without which JAX silently computes float64 inputs in float32.

Composed ops compute float16/bfloat16 in float32 (as the native op does for its
logits) and round once to the input dtype. Jitted functions are module-level with
static parameters, so repeated calls with the same shapes and dtypes do not retrace.

Known differences of the native op from the specification (jax 0.10.2, CPU):
- its softmax always runs in float32, so float64 sdpa/sdpa_vjp/self_attention/MHA
  are only float32-accurate (relative error ~1e-7);
- it masks with a finite -0.7*max, not -inf: when a row's allowed keys all carry a
  -inf bias, the masked-out keys get the weight (1/number masked), not 0;
- under jax.jit it fails for float16 on CPU (see the comment above the jitted entries,
  backends/_jax_cores.py);
- it rejects Dv != Dk (worked around here by exact zero-padding).
"""

from __future__ import annotations

import contextlib
import math

import jax
import numpy as np

from . import _jax_cores as cores
from . import rules
from ._signature import signed

DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})


# -------------------------------------------------------------------- validation


def _arrays(*xs):
    """NumPy views of the inputs (never copies, never modified); None passes."""
    return tuple(None if x is None else np.asarray(x) for x in xs)


def _check_dtype(x):
    if x.dtype.name not in DTYPES:
        raise NotImplementedError(f"jax backend: dtype {x.dtype} is not supported")


def _window(window):
    if window is None:
        return None
    left, right = window
    return tuple(None if w is None else int(w) for w in (left, right))


def _mask(mask):
    return None if mask is None else np.asarray(mask, dtype=bool)


def _result(x):
    """A fresh NumPy array (never a JAX array, never a view of a buffer)."""
    return np.array(x, copy=True)


def _sdpa_params(q, causal, scale, softcap, window, implementation):
    _check_dtype(q)
    rules.check_causal(causal)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    softcap = None if softcap is None else float(softcap)
    return dict(causal=causal, scale=scale, softcap=softcap, window=_window(window),
                implementation=implementation)


def _native_lengths(q, k, mask, causal, window, q_lengths, kv_lengths, softcap):
    """(mask, causal, window, q_len, kv_len) for jax.nn.dot_product_attention's
    query_seq_lengths / key_value_seq_lengths (int32 per element of the flattened batch).

    Its is_causal and local_window_size count from the top left of the padded T x S, as
    top_left does; a bottom_right offset differs per batch element (kv_lengths[b] -
    q_lengths[b]), so that causal and window go into the boolean mask instead."""
    if q_lengths is None and kv_lengths is None:
        return mask, causal, window, None, None
    if softcap is not None:
        raise NotImplementedError("jax backend: softcap with q_lengths/kv_lengths is not "
                                  "composed")
    if causal == "bottom_right":
        mask, _ = rules.compose_lengths(q.shape, k.shape, mask, causal, window, q_lengths,
                                        kv_lengths)
        causal, window = None, None
    per = math.prod(q.shape[1:-3])       # batch dims after dim 0, flattened by rules.Layout
    lengths = [None if n is None else np.repeat(np.asarray(n, dtype=np.int32), per)
               for n in (q_lengths, kv_lengths)]
    return (mask, causal, window, *lengths)


def _no_sink_with_lengths(q_lengths, kv_lengths):
    if q_lengths is not None or kv_lengths is not None:
        raise NotImplementedError("jax backend: a sink with q_lengths/kv_lengths is not "
                                  "composed")


def _with_heads(method):
    """Run sdpa or sdpa_vjp with lengths on (B, L, D) inputs as (B, 1, L, D): the native
    op's lengths index B, and rules.Layout reads a rank-3 input's dim 0 as heads."""
    def wrapper(self, q, k, v, *rest, mask=None, bias=None, **params):
        lengths = params.get("q_lengths") is not None or params.get("kv_lengths") is not None
        if not lengths or np.ndim(q) != 3:
            return method(self, q, k, v, *rest, mask=mask, bias=bias, **params)
        lift = [None if x is None else (np.expand_dims(x, -3) if np.ndim(x) == 3 else x)
                for x in (q, k, v, *rest, mask, bias)]
        *arrays, mask, bias = lift
        result = method(self, *arrays, mask=mask, bias=bias, **params)
        if isinstance(result, tuple):
            return tuple(np.squeeze(r, axis=-3) for r in result)
        return np.squeeze(result, axis=-3)
    wrapper.__name__, wrapper.__doc__ = method.__name__, method.__doc__
    return signed(wrapper, method)


# ----------------------------------------------------------------------- backend


def _device(name, device, gpu_only=False):
    """The JAX device a backend runs on; a device this machine lacks is refused here,
    at construction (so at load), never silently replaced by the CPU."""
    if device is None:
        device = "gpu" if gpu_only else "cpu"
    platform, _, index = str(device).partition(":")
    if platform not in ("cpu", "gpu") or (index and not index.isdigit()):
        raise ValueError(f"{name}: unknown device {device!r}; jax backends take cpu, gpu "
                         "or gpu:N")
    if gpu_only and platform == "cpu":
        raise RuntimeError(f"{name} is cuDNN's attention, a GPU kernel: it cannot run on "
                           f"device {device!r}")
    try:
        devices = jax.devices(platform)
    except RuntimeError as exc:
        raise RuntimeError(f"{name} needs a GPU ({device!r}); jax.devices('gpu') finds "
                           f"none: {exc}") from None
    if int(index or 0) >= len(devices):
        raise RuntimeError(f"{name}: no device {device!r}; JAX sees {len(devices)} "
                           f"{platform} device(s)")
    return devices[int(index or 0)]


class JaxBackend:
    """The attention interface on JAX (see the module docstring for each op's path).

    ``device``: ``"cpu"`` (the default), ``"gpu"`` or ``"gpu:N"``; every op runs under
    ``jax.default_device`` of it. ``implementation`` is what the native op is asked for.
    """

    name = "jax"
    dtypes = DTYPES
    # docs/interface.md, "fp8 inputs and descale factors"
    dtype_notes = {"float8_e4m3fn": "no descales, and fp8 raises TypePromotionError",
                   "float8_e5m2": "no descales, and fp8 raises TypePromotionError"}
    # Determined empirically on jax 0.10.2 (XLA implementation): the native op masks
    # with a large finite negative, so a fully masked row gets equal logits (uniform
    # weights, the mean of V) and a NaN key at a masked position is overwritten; an
    # all -inf bias row is softmax(-inf, ..., -inf) = NaN; a masked NaN value still
    # meets a weight of 0 in P @ V, and 0 * NaN = NaN.
    policy = {
        "fully_masked_rows": "uniform",
        "neg_inf_bias_rows": "nan",
        "masked_key_nan": "ignored",
        "masked_value_nan": "propagates",
        "accumulation": "float32",
        # a padded query (past q_lengths) gets output, weight and dq rows of 0
        "padded_query_rows": "zeros",
        # every lse it returns or takes is a natural log
        "lse_base": "e",
    }
    paths = {
        "softmax": "native: jax.nn.softmax",
        "scores": "composed: jax.numpy matmul/tanh (no score-function API in JAX)",
        "attention_weights": "composed: jax.numpy pipeline with the native op's "
                             "masking (JAX exposes no attention weights)",
        "sdpa": "native: jax.nn.dot_product_attention(implementation='xla'); "
                "composed from jax.numpy only with softcap (no such parameter); "
                "q_lengths/kv_lengths as its query_seq_lengths/key_value_seq_lengths, "
                "a bottom_right causal or window with them as a mask (no native "
                "per-batch offset)",
        "self_attention": "native: x @ w projections, then "
                          "jax.nn.dot_product_attention",
        "multi_head_attention": "native: composed projections/heads/w_o around "
                                "jax.nn.dot_product_attention (MHA layers live in "
                                "flax, not jax)",
        "sdpa_vjp": "native: jax.vjp of the sdpa path (lengths as in sdpa); composed "
                    "(jax.numpy, jax.vjp) with a sink, since the native residual carries no "
                    "gradient",
        "sdpa_lse": "native: jax.nn.dot_product_attention(return_residual=True); composed "
                    "with softcap; a sink composed around the native lse (JAX has none)",
    }

    implementation = "xla"
    gpu_only = False

    def __init__(self, device=None):
        # Without x64, JAX silently demotes float64 inputs to float32.
        jax.config.update("jax_enable_x64", True)
        import jaxlib
        self.device = _device(self.name, device, self.gpu_only)
        self.versions = {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
                         "device": f"{self.device.platform}:{self.device.id} "
                                   f"({self.device.device_kind})"}
        # checked bit for bit on the CPU by the invariance cases (docs/interface.md)
        self.invariants = ("deterministic",) if self.device.platform == "cpu" else ()

    def _running(self):
        """The context every op runs in: JAX's arrays and programs on the device."""
        return jax.default_device(self.device)

    def softmax(self, x, axis=-1):
        with self._running():
            (x,) = _arrays(x)
            _check_dtype(x)
            return _result(cores.softmax(x, axis=int(axis)))

    def scores(self, q, k, *, kind, scale=None, w=None, u=None, v=None):
        with self._running():
            q, k, w, u, v = _arrays(q, k, w, u, v)
            _check_dtype(q)
            needed = {"dot": (), "scaled_dot": (), "bilinear": ("w",),
                      "additive": ("w", "u", "v")}
            if kind not in needed:
                raise ValueError(f"unknown score kind {kind!r}")
            given = {"w": w, "u": u, "v": v}
            missing = [n for n in needed[kind] if given[n] is None]
            if missing:
                raise ValueError(f"score kind {kind!r} needs {', '.join(missing)}")
            scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
            return _result(cores.scores(q, k, w, u, v, kind=kind, scale=scale))

    @rules.sized()
    @rules.lengths_as_mask
    def attention_weights(self, q, k, *, mask=None, bias=None, sink=None, causal=None,
                          scale=None, softcap=None, window=None):
        with self._running():
            q, k, bias, sink = _arrays(q, k, bias, sink)
            params = _sdpa_params(q, causal, scale, softcap, window, self.implementation)
            if sink is not None:
                return _result(cores.sink_weights(q, k, _mask(mask), bias, sink, **params))
            return _result(cores.weights(q, k, _mask(mask), bias, **params))

    @rules.sized()
    @rules.structure_as_mask
    @_with_heads
    def sdpa(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
             softcap=None, window=None, q_lengths=None, kv_lengths=None):
        if sink is not None:
            _no_sink_with_lengths(q_lengths, kv_lengths)
            return self.sdpa_lse(q, k, v, mask=mask, bias=bias, sink=sink, causal=causal,
                                 scale=scale, softcap=softcap, window=window)[0]
        with self._running():
            q, k, v, bias = _arrays(q, k, v, bias)
            mask, causal, window, *lengths = _native_lengths(
                q, k, mask, causal, window, q_lengths, kv_lengths, softcap)
            params = _sdpa_params(q, causal, scale, softcap, window, self.implementation)
            return _result(cores.sdpa(q, k, v, _mask(mask), bias, *lengths, **params))

    @rules.sized()
    def sdpa_lse(self, q, k, v, *, mask=None, bias=None, sink=None, causal=None, scale=None,
                 softcap=None, window=None):
        with self._running():
            q, k, v, bias, sink = _arrays(q, k, v, bias, sink)
            params = _sdpa_params(q, causal, scale, softcap, window, self.implementation)
            out, lse = cores.sdpa_lse(q, k, v, _mask(mask), bias, sink, **params)
            return _result(out), np.asarray(lse).astype(rules.lse_dtype(q.dtype))

    @rules.sized()
    @rules.structure_as_mask
    @_with_heads
    def sdpa_vjp(self, q, k, v, d_out, *, mask=None, bias=None, sink=None, causal=None,
                 scale=None, softcap=None, window=None, q_lengths=None, kv_lengths=None):
        if sink is not None:
            _no_sink_with_lengths(q_lengths, kv_lengths)
        with self._running():
            q, k, v, d_out, bias, sink = _arrays(q, k, v, d_out, bias, sink)
            mask, causal, window, *lengths = _native_lengths(
                q, k, mask, causal, window, q_lengths, kv_lengths, softcap)
            params = _sdpa_params(q, causal, scale, softcap, window, self.implementation)
            if sink is not None:
                grads = cores.sdpa_sink_vjp(q, k, v, d_out, _mask(mask), bias, sink,
                                            **params)
            else:
                grads = cores.sdpa_vjp(q, k, v, d_out, _mask(mask), bias, *lengths,
                                       **params)
            return tuple(_result(g) for g in grads)

    def self_attention(self, x, w_q, w_k, w_v, *, mask=None, causal=None):
        with self._running():
            x, w_q, w_k, w_v = _arrays(x, w_q, w_k, w_v)
            _check_dtype(x)
            rules.check_causal(causal)
            return _result(cores.self_attention(x, w_q, w_k, w_v, _mask(mask), causal=causal,
                                                implementation=self.implementation))

    def multi_head_attention(self, query, key, value, *, w_q, w_k, w_v, w_o, num_heads,
                             num_kv_heads=None, mask=None, causal=None):
        with self._running():
            query, key, value, w_q, w_k, w_v, w_o = _arrays(
                query, key, value, w_q, w_k, w_v, w_o)
            _check_dtype(query)
            rules.check_causal(causal)
            num_heads = int(num_heads)
            num_kv_heads = num_heads if num_kv_heads is None else int(num_kv_heads)
            if num_heads % num_kv_heads:
                raise ValueError(f"{num_heads} heads cannot share {num_kv_heads} kv heads")
            for w, n, what in ((w_q, num_heads, "w_q"), (w_k, num_kv_heads, "w_k"),
                               (w_v, num_kv_heads, "w_v")):
                if w.shape[1] % n:
                    raise ValueError(f"{what} width {w.shape[1]} is not a multiple of {n}")
            return _result(cores.mha(query, key, value, w_q, w_k, w_v, w_o, _mask(mask),
                                     num_heads=num_heads, num_kv_heads=num_kv_heads,
                                     causal=causal, implementation=self.implementation))


# ------------------------------------------------------------------- jax-cudnn


def _from_cudnn(exc) -> bool:
    """Was exc raised by the cuDNN implementation's own checks (jax/_src/cudnn/...)?"""
    tb = exc.__traceback__
    while tb is not None:
        if "cudnn" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return "cuDNN" in str(exc)


class JaxCudnnBackend(JaxBackend):
    """``jax.nn.dot_product_attention(implementation="cudnn")``: cuDNN's fused attention,
    on a GPU only (the default device is ``gpu``; there is no CPU cuDNN).

    The ops that reach the native op (sdpa, sdpa_vjp, self_attention,
    multi_head_attention) ask it for ``implementation="cudnn"``; what cuDNN refuses
    (dtypes other than float16/bfloat16, head sizes, masks, windows...) raises
    ``NotImplementedError`` with cuDNN's reason, so those tests are unsupported, never
    run by XLA instead. The composed ops (softmax, scores, attention_weights, softcap)
    call no cuDNN and are the jax backend's to certify: unsupported here too.
    """

    name = "jax-cudnn"
    implementation = "cudnn"
    gpu_only = True
    paths = {
        "softmax": "not run: calls no cuDNN kernel (the jax backend certifies it)",
        "scores": "not run: calls no cuDNN kernel (the jax backend certifies it)",
        "attention_weights": "not run: composed in JAX, calls no cuDNN kernel",
        "sdpa": "native: jax.nn.dot_product_attention(implementation='cudnn'); "
                "softcap not run (no such parameter)",
        "self_attention": "native: x @ w projections, then "
                          "jax.nn.dot_product_attention(implementation='cudnn')",
        "multi_head_attention": "native: composed projections/heads/w_o around "
                                "jax.nn.dot_product_attention(implementation='cudnn')",
        "sdpa_vjp": "native: jax.vjp of the sdpa path (cuDNN's backward)",
    }

    @contextlib.contextmanager
    def _running(self):
        try:
            with super()._running():
                yield
        except (ValueError, NotImplementedError, RuntimeError) as exc:
            if not _from_cudnn(exc):
                raise
            raise NotImplementedError(f"jax-cudnn: cuDNN refused this input: "
                                      f"{type(exc).__name__}: {exc}") from None

    def _composed(self, op):
        raise NotImplementedError(f"jax-cudnn: {op} calls no cuDNN kernel (composed in JAX; "
                                  "certified by the jax backend)")

    def softmax(self, x, axis=-1):
        self._composed("softmax")

    def scores(self, q, k, **params):
        self._composed("scores")

    def attention_weights(self, q, k, **params):
        self._composed("attention_weights")

    def sdpa(self, q, k, v, *, softcap=None, **params):
        if softcap is not None:
            self._composed("softcap")
        return super().sdpa(q, k, v, **params)

    def sdpa_vjp(self, q, k, v, d_out, *, softcap=None, **params):
        if softcap is not None:
            self._composed("softcap")
        return super().sdpa_vjp(q, k, v, d_out, **params)
