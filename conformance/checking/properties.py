"""Named invariants, checked on a backend's own outputs (often by calling it again).

Each property takes the run's Context (and the keyword arguments the case gives it)
and raises CheckFailure with what it saw. Tolerances come from the spec folder's rule
(ctx.tolerances). A property that calls the backend again makes its calls before it
reads the outputs: an isolated run finds those calls before the test's own first call
is answered (checks.planned_calls), and sends them ahead with it.
"""

from __future__ import annotations

import math

import numpy as np

from ..backend.interface import policy_for
from ..golden import reference
from ..golden.compute import ACCUMULATION_DTYPES
from . import invariance
from .comparison import digits
from .context import Context
from ..model.ops import OPS
from ..model.errors import CheckFailure

PROPERTIES = {}
#: the properties that call the backend again (each makes its calls before it reads the
#: outputs): checks.planned_calls runs these alone
CALLS_BACKEND = set()
#: those whose last call takes the answers of their earlier calls: that call is made, not
#: planned (tests/meta/test_planned_calls.py)
FED_BY_ANSWERS = {"cascade_merge"}


def prop(func=None, *, calls_backend: bool = False):
    """Register a property (@prop, or @prop(calls_backend=True) for one that calls)."""
    def register(func):
        PROPERTIES[func.__name__] = func
        if calls_backend:
            CALLS_BACKEND.add(func.__name__)
        return func
    return register(func) if func is not None else register


def property_entry(entry) -> tuple[str, dict]:
    """(name, keyword arguments) of a case's property entry: a name, or {name: {args}}."""
    return (entry, {}) if isinstance(entry, str) else next(iter(entry.items()))


def _tol(ctx, magnitude=1.0):
    """The property tolerance of this run (Tolerances.prop): n the inputs' longest
    reduction, the sums in float32 for a half-precision backend of the float32 tier."""
    wide = ctx.dtype in ACCUMULATION_DTYPES and \
        ctx.declared_policy().get("accumulation") == "float32"
    return ctx.tolerances.prop(ctx.dtype, magnitude, ctx.longest_reduction(),
                               "float32" if wide else None)


def _first(ctx):
    return next(iter(ctx.outputs.values()))


def _close(actual, expected, tol, what):
    error = np.abs(actual - expected)
    if not np.all(np.isfinite(error)) or np.max(error, initial=0.0) > tol:
        flat = int(np.nanargmax(np.where(np.isfinite(error), error, np.inf)))
        worst = tuple(int(i) for i in np.unravel_index(flat, error.shape))
        n = digits("float64")           # float64 copies: enough digits for any dtype
        got, want = f"{float(actual[worst]):.{n}g}", f"{float(expected[worst]):.{n}g}"
        if not np.isfinite(error[worst]):      # a NaN or inf where a number belongs
            raise CheckFailure(f"{what}: got {got} at {list(worst)}, expected {want}")
        raise CheckFailure(f"{what}: differs by {float(error[worst]):.3g} at {list(worst)}"
                           f" (got {got}, expected {want}), tolerance {tol:.3g}")


def allowed(ctx) -> np.ndarray:
    """Boolean score-shaped array: key j allowed for query i (mask, causal, window)."""
    weights = _first(ctx)
    lq, lk = weights.shape[-2:]
    keep = reference.allowed_keys(lq, lk, causal=ctx.params.get("causal"),
                                  window=ctx.params.get("window"))
    if "mask" in ctx.arrays:
        keep = keep & ctx.arrays["mask"]
    return np.broadcast_to(keep, weights.shape)


@prop
def rows_sum_to_one(ctx: Context):
    """Every row with an allowed key sums to 1."""
    weights = _first(ctx)
    if ctx.case.op == "softmax":
        axis = ctx.params.get("axis", -1)
        live = np.any(np.isfinite(ctx.exact_inputs["x"]), axis=axis)
        sums = np.sum(weights, axis=axis)
    else:
        live = np.any(allowed(ctx), axis=-1)
        sums = np.sum(weights, axis=-1)
    _close(sums[live], np.ones(int(np.sum(live))), _tol(ctx), "row sums")


@prop
def masked_weights_zero(ctx: Context):
    """A disallowed key gets a weight of exactly 0 (in rows with an allowed key)."""
    weights, keep = _first(ctx), allowed(ctx)
    live = np.any(keep, axis=-1, keepdims=True)
    wrong = (~keep) & live & (weights != 0)
    if np.any(wrong):
        where = tuple(int(i) for i in np.argwhere(wrong)[0])
        raise CheckFailure(f"masked weight at {list(where)} is {float(weights[where])!r}, not 0")


# --- metamorphic relations ------------------------------------------------------------

def _query_side(ctx):
    return OPS[ctx.case.op].query_side


def _key_side(ctx):
    return OPS[ctx.case.op].key_side


def _permuted(ctx, perm_q, perm_k):
    arrays = dict(ctx.arrays)
    for name in _query_side(ctx):
        if name in arrays:                      # qv, the absorbed form's, is optional
            arrays[name] = np.take(arrays[name], perm_q, axis=-2)
    for name in _key_side(ctx):
        arrays[name] = np.take(ctx.arrays[name], perm_k, axis=-2)
    for name in ("mask", "bias"):
        if name in arrays:
            extra = arrays[name]
            if extra.ndim >= 2 and extra.shape[-2] > 1:
                extra = np.take(extra, perm_q, axis=-2)
            if extra.shape[-1] > 1:
                extra = np.take(extra, perm_k, axis=-1)
            arrays[name] = extra
    return arrays


#: the properties' own generator, reseeded for each draw: RandomState(seed)'s draws at a
#: fiftieth of the cost of making one; its own, since a property's backend calls may make
#: the next tests' inputs meanwhile (process/ahead.py), from golden/inputs' generator
_RNG = np.random.RandomState()


def _seeded(seed: int) -> np.random.RandomState:
    _RNG.seed(seed)
    return _RNG


@prop(calls_backend=True)
def permutation_equivariant(ctx: Context, seed: int = 0):
    """Permuting tokens permutes the output rows the same way (no causal, no window)."""
    rng = _seeded(seed)
    lq = ctx.arrays[_query_side(ctx)[0]].shape[-2]
    lk = ctx.arrays[_key_side(ctx)[0]].shape[-2]
    perm_q = rng.permutation(lq)
    perm_k = perm_q if ctx.case.op == "self_attention" else rng.permutation(lk)
    got = ctx.call(_permuted(ctx, perm_q, perm_k))[0]
    out = _first(ctx)
    expected = np.take(out, perm_q, axis=-2)
    if ctx.case.op == "attention_weights":
        expected = np.take(expected, perm_k, axis=-1)
    _close(got, expected, _tol(ctx, np.max(np.abs(out), initial=1.0)),
           "output of permuted tokens vs permuted output")


@prop
def identical_tokens_identical_outputs(ctx: Context):
    """Queries that are identical (and see the same keys) get identical outputs."""
    name = _query_side(ctx)[0]
    tokens, out = ctx.exact_inputs[name], _first(ctx)
    flat_tokens = tokens.reshape(-1, tokens.shape[-2], tokens.shape[-1])
    flat_out = np.broadcast_to(out, out.shape).reshape(-1, out.shape[-2], out.shape[-1])
    pairs = 0
    for b in range(flat_out.shape[0]):
        rows = flat_tokens[b % flat_tokens.shape[0]]
        for i in range(rows.shape[0]):
            for j in range(i + 1, rows.shape[0]):
                if np.array_equal(rows[i], rows[j]):
                    pairs += 1
                    _close(flat_out[b, j], flat_out[b, i], _tol(ctx, np.max(np.abs(out))),
                           f"outputs of identical tokens {i} and {j}")
    if not pairs:
        raise CheckFailure(f"the case has no identical tokens in {name!r} to compare")


@prop(calls_backend=True)
def causal_future_independent(ctx: Context, seed: int = 7):
    """Changing tokens after position t leaves the outputs of queries <= t unchanged."""
    lq = ctx.arrays[_query_side(ctx)[0]].shape[-2]
    lk = ctx.arrays[_key_side(ctx)[0]].shape[-2]
    t = lq // 2
    first_future_key = t + 1 + (lk - lq if ctx.params.get("causal") == "bottom_right" else 0)
    rng = _seeded(seed)
    arrays = dict(ctx.arrays)
    for name in dict.fromkeys(_key_side(ctx)):
        changed = np.array(ctx.exact_inputs[name], copy=True)
        future = changed[..., first_future_key:, :]
        changed[..., first_future_key:, :] = rng.standard_normal(future.shape) * 3.0
        arrays[name] = ctx.cast(changed, name)
    got = ctx.call(arrays)[0]
    out = _first(ctx)
    _close(got[..., : t + 1, :], out[..., : t + 1, :], _tol(ctx, np.max(np.abs(out))),
           f"outputs of queries 0..{t} after changing keys from {first_future_key}")


@prop(calls_backend=True)
def softmax_shift_invariant(ctx: Context, shift: float = 8.0):
    """softmax(x + c) equals softmax(x) for a constant c added to every entry."""
    shifted = ctx.cast(ctx.exact_inputs["x"] + shift)
    axis = ctx.params.get("axis", -1)
    got = ctx.call({"x": shifted})[0]
    out = _first(ctx)
    # rounding x + c to the dtype moves the inputs a little; allow what that moves exactly
    moved = np.abs(reference.softmax(np.asarray(shifted, dtype=np.float64), axis=axis)
                   - reference.softmax(ctx.exact_inputs["x"], axis=axis))
    _close(got, out, _tol(ctx) + float(np.nanmax(moved, initial=0.0)), "softmax of shifted input")


@prop(calls_backend=True)
def key_value_equals_plain(ctx: Context):
    """Key-value attention with V = K equals the weighted sum of the keys themselves."""
    if not np.array_equal(ctx.exact_inputs["k"], ctx.exact_inputs["v"]):
        raise CheckFailure("the case's k and v differ; this property needs v = k")
    arrays = {n: a for n, a in ctx.arrays.items() if n != "v"}
    weights = ctx.call(arrays, op="attention_weights", **ctx.params)[0]
    plain = np.matmul(weights, ctx.exact_inputs["k"])
    _close(_first(ctx), plain, _tol(ctx, np.max(np.abs(ctx.exact_inputs["k"]))),
           "sdpa(q, k, k) vs weights(q, k) @ k")


@prop
def column_form_equals_row_form(ctx: Context):
    """The row form equals the lecture's column form V softmax(Kᵀ Q / sqrt(d))."""
    x = {n: np.swapaxes(ctx.exact_inputs[n], -1, -2) for n in ("q", "k", "v")}
    columns = np.swapaxes(reference.sdpa_columns(x["q"], x["k"], x["v"]), -1, -2)
    gold, plain_error = ctx.golden.get(ctx.case, ctx.variant, ctx.dtype)["out"]
    tol = ctx.tolerances.output(ctx.dtype, plain_error, gold)
    _close(_first(ctx), columns, tol, "row-form output vs column-form reference")


@prop
def finite(ctx: Context):
    """No output holds NaN or inf."""
    for name, value in ctx.outputs.items():
        if not np.all(np.isfinite(value)):
            where = tuple(int(i) for i in np.argwhere(~np.isfinite(value))[0])
            raise CheckFailure(f"{name} holds {float(value[where])!r} at {list(where)}")


@prop
def output_in_value_hull(ctx: Context):
    """Each output is a convex combination of the values: within their min and max."""
    out, v = _first(ctx), ctx.exact_inputs["v"]
    v = reference._expand_kv(ctx.exact_inputs["q"], v)
    low = np.min(v, axis=-2, keepdims=True)
    high = np.max(v, axis=-2, keepdims=True)
    slack = _tol(ctx, np.max(np.abs(v)))
    outside = (out < low - slack) | (out > high + slack)
    if np.any(outside):
        where = tuple(int(i) for i in np.argwhere(outside)[0])
        raise CheckFailure(f"output {float(out[where])!r} at {list(where)} lies outside the"
                           " values' range")


# --- the log-sum-exp of sdpa_lse ------------------------------------------------------

def _key_half(ctx, arrays, keep, keys):
    """The inputs of a call on the keys `keys` (a slice over Lk): k, v and the bias cut,
    causal and window folded into the mask (a key's position changes in a half)."""
    half = {n: a for n, a in arrays.items() if n not in ("mask", "sink")}
    for name in _key_side(ctx):
        half[name] = arrays[name][..., keys, :]
    if "bias" in arrays and arrays["bias"].shape[-1] > 1:
        half["bias"] = arrays["bias"][..., keys]
    half["mask"] = np.ascontiguousarray(keep[..., keys])
    return half


def _merged(outs, lses):
    """(out, lse) of key halves merged: lse = log(sum exp(lse_i)), out = sum exp(lse_i -
    lse) out_i; a row no half sees stays (0, -inf)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        lse = np.logaddexp(*lses)
        finite = np.isfinite(lse)
        base = np.where(finite, lse, 0.0)
        out = sum(np.where(np.isfinite(lse_i) & finite, np.exp(lse_i - base), 0.0)[..., None]
                  * out_i for out_i, lse_i in zip(outs, lses))
    return out, lse


@prop(calls_backend=True)
def split_kv_merge(ctx: Context, split: int | None = None):
    """sdpa_lse on keys [0, m) and [m, Lk) (the sink with the first half), merged with
    weights exp(lse_i - lse), equals sdpa_lse on all keys: split-KV decoding and ring
    attention merge partial results this way."""
    lk = ctx.arrays["k"].shape[-2]
    m = lk // 2 if split is None else split
    if not 0 < m < lk:
        raise CheckFailure(f"split {m} does not cut {lk} keys into two non-empty halves")
    keep = reference.allowed_keys(ctx.arrays["q"].shape[-2], lk, causal=ctx.params.get("causal"),
                                  window=ctx.params.get("window"))
    if "mask" in ctx.arrays:
        keep = keep & ctx.arrays["mask"]
    first = _key_half(ctx, ctx.arrays, keep, slice(0, m))
    if "sink" in ctx.arrays:
        first["sink"] = ctx.arrays["sink"]
    params = {"causal": None, "window": None}       # folded into the halves' masks
    halves = [ctx.call(first, **params),
              ctx.call(_key_half(ctx, ctx.arrays, keep, slice(m, lk)), **params)]
    natural = natural_lse(ctx, ctx.case.op)         # the declared lse_base, as ln
    out, lse = ctx.outputs["out"], ctx.outputs["lse"] * natural
    got_out, got_lse = _merged([h[0] for h in halves], [h[1] * natural for h in halves])
    same = np.isfinite(got_lse) == np.isfinite(lse)
    if not np.all(same):
        where = tuple(int(i) for i in np.argwhere(~same)[0])
        raise CheckFailure(f"merged lse of keys [0, {m}) and [{m}, {lk}) is"
                           f" {float(got_lse[where])!r} at {list(where)}, the lse of all keys"
                           f" {float(lse[where])!r}")
    finite = np.isfinite(lse)
    size = float(np.max(np.abs(lse[finite]), initial=1.0))
    _close(np.where(finite, got_lse, 0.0), np.where(finite, lse, 0.0), _tol(ctx, size),
           f"lse of keys [0, {m}) and [{m}, {lk}) merged vs lse of all keys")
    # each half's lse is off by a rounding of |lse|, which scales its weight by as much
    magnitude = float(np.max(np.abs(out), initial=1.0)) * max(1.0, size)
    _close(got_out, out, _tol(ctx, magnitude),
           f"output of keys [0, {m}) and [{m}, {lk}) merged vs output of all keys")


def natural_lse(ctx, op) -> float:
    """What the backend's lse of op are multiplied by to be natural logs: ln 2 under a
    declared lse_base of 2, else 1."""
    return math.log(2.0) if policy_for(ctx.declaration, op).get("lse_base") == "2" else 1.0


@prop(calls_backend=True)
def cascade_merge(ctx: Context, prefix: int):
    """Cascade attention (a shared prefix, then each request's own keys): keys [0, prefix)
    of batch element 0 are the prefix every request shares. sdpa_lse over the shared
    prefix (one call, its batch of 1 broadcast) and over each request's own keys
    [prefix, Lk) (the case's causal), merged by the backend's merge_states (each lse
    converted between the ops' declared bases), equal sdpa_lse over the whole keys. Its
    last call takes the answers of the others: it is made, not planned."""
    q, k, v = (ctx.arrays[n] for n in ("q", "k", "v"))
    lq, lk = q.shape[-2], k.shape[-2]
    causal = ctx.params.get("causal")
    if not 0 < prefix < lk or set(ctx.arrays) != {"q", "k", "v"} or ctx.params.get("window") \
            or causal == "top_left" or (causal and lk - prefix < lq):
        raise CheckFailure(f"cascade_merge needs q, k, v alone, 0 < prefix {prefix} < Lk {lk},"
                           " no window, and under bottom_right causal Lq <= Lk - prefix")
    shared = {"q": q, "k": k[:1, ..., :prefix, :], "v": v[:1, ..., :prefix, :]}
    own = {"q": q, "k": k[..., prefix:, :], "v": v[..., prefix:, :]}
    whole = {"q": q, **{n: np.concatenate([np.broadcast_to(shared[n], own[n].shape[:-2] + (
        prefix, own[n].shape[-1])), own[n]], axis=-2) for n in ("k", "v")}}
    parts = [ctx.call(shared, causal=None), ctx.call(own), ctx.call(whole)]
    to_merge = natural_lse(ctx, ctx.case.op) / natural_lse(ctx, "merge_states")
    got_out, got_lse = ctx.call({"outs": ctx.cast(np.stack([parts[0][0], parts[1][0]]), "outs"),
                                 "lses": ctx.cast(np.stack([parts[0][1], parts[1][1]]) * to_merge,
                                                  "lses")},
                                op="merge_states")
    out, lse = parts[2]
    got_lse = got_lse * natural_lse(ctx, "merge_states")
    lse = lse * natural_lse(ctx, ctx.case.op)
    size = float(np.max(np.abs(lse), initial=1.0))
    _close(got_lse, lse, _tol(ctx, size), "lse of the shared prefix and own keys merged vs"
           " lse of the whole keys")
    _close(got_out, out, _tol(ctx, float(np.max(np.abs(out), initial=1.0)) * max(1.0, size)),
           "output of the shared prefix and own keys merged vs output of the whole keys")


# the declared bitwise invariants (checking/invariance.py): checked exactly, never demanded
for _check in (invariance.deterministic, invariance.batch_invariant, invariance.split_invariant):
    prop(calls_backend=True)(_check)
