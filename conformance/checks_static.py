"""Checks of a case that the schema cannot express: names, shapes, dtypes, references."""

from __future__ import annotations

import numpy as np

from .indexing import parse_index, split_target
from .inputs import build_inputs
from .interface import OPERATIONS, OUTPUTS, POLICIES

#: inputs each op accepts (positional ones first)
OP_INPUTS = {
    "softmax": {"x"},
    "scores": {"q", "k", "w", "u", "v"},
    "attention_weights": {"q", "k", "mask", "bias"},
    "sdpa": {"q", "k", "v", "mask", "bias"},
    "sdpa_vjp": {"q", "k", "v", "d_out", "mask", "bias"},
    "self_attention": {"x", "w_q", "w_k", "w_v", "mask"},
    "multi_head_attention": {"query", "key", "value", "w_q", "w_k", "w_v", "w_o", "mask"},
}
_PIPELINE = {"causal", "scale", "softcap", "window"}
OP_PARAMS = {
    "softmax": {"axis"},
    "scores": {"kind", "scale"},
    "attention_weights": _PIPELINE,
    "sdpa": _PIPELINE,
    "sdpa_vjp": _PIPELINE,
    "self_attention": {"causal"},
    "multi_head_attention": {"num_heads", "num_kv_heads", "causal"},
}
REQUIRED_PARAMS = {"scores": {"kind"}, "multi_head_attention": {"num_heads"}}


def _bcast(*shapes, what):
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        raise ValueError(f"{what}: shapes {' and '.join(map(str, shapes))} do not broadcast") from None


def _width(a, b, name_a, name_b, axis_a=-1, axis_b=-1):
    if a[axis_a] != b[axis_b]:
        raise ValueError(f"{name_a} has width {a[axis_a]} but {name_b} has {b[axis_b]}"
                         f" ({name_a} {a}, {name_b} {b})")


def _attention_shapes(q, k, v, mask, bias):
    """Score shape and output shape of attention over q, k (and v)."""
    if len(q) < 2 or len(k) < 2:
        raise ValueError("q and k need at least two dims (tokens, features)")
    _width(q, k, "q", "k")
    kb = list(k[:-2])
    if len(q) >= 3 and len(k) >= 3 and k[-3] not in (1, q[-3]):
        if q[-3] % k[-3]:
            raise ValueError(f"{q[-3]} query heads are not a multiple of {k[-3]} kv heads")
        kb[-1] = q[-3]
    batch = _bcast(q[:-2], tuple(kb), what="q and k batch dims")
    score = batch + (q[-2], k[-2])
    for name, shape in (("mask", mask), ("bias", bias)):
        if shape is not None:
            if len(_bcast(shape, score, what=f"{name} against scores {score}")) != len(score):
                raise ValueError(f"{name} {shape} has more dims than the scores {score}")
    if v is None:
        return score, score
    if v[-2] != k[-2]:
        raise ValueError(f"k has {k[-2]} tokens but v has {v[-2]}")
    return score, batch + (q[-2], v[-1])


def output_shapes(op: str, s: dict, params: dict) -> tuple[tuple, ...]:
    """Shapes of an op's outputs from its input shapes; ValueError if inconsistent."""
    g = s.get
    if op == "softmax":
        return (s["x"],)
    if op == "scores":
        return (_score_kind_shape(s, params["kind"]),)
    if op == "attention_weights":
        return (_attention_shapes(s["q"], s["k"], None, g("mask"), g("bias"))[0],)
    if op == "sdpa":
        return (_attention_shapes(s["q"], s["k"], s["v"], g("mask"), g("bias"))[1],)
    if op == "sdpa_vjp":
        out = _attention_shapes(s["q"], s["k"], s["v"], g("mask"), g("bias"))[1]
        if tuple(s["d_out"]) != tuple(out):
            raise ValueError(f"d_out {s['d_out']} is not the output shape {out}")
        return (s["q"], s["k"], s["v"])
    if op == "self_attention":
        x = s["x"]
        for w in ("w_q", "w_k", "w_v"):
            _width(x, s[w], "x", w, -1, 0)
        _width(s["w_q"], s["w_k"], "w_q", "w_k")
        q, v = x[:-1] + (s["w_q"][1],), x[:-1] + (s["w_v"][1],)
        return (_attention_shapes(q, q, v, g("mask"), None)[1],)
    if op == "multi_head_attention":
        return (_mha_shape(s, params),)
    raise ValueError(f"unknown op {op!r}")


def _score_kind_shape(s, kind):
    q, k = s["q"], s["k"]
    if kind in ("dot", "scaled_dot"):
        _width(q, k, "q", "k")
    elif kind == "bilinear":
        _width(q, s["w"], "q", "w", -1, 0)
        _width(k, s["w"], "k", "w", -1, 1)
    elif kind == "additive":
        _width(k, s["w"], "k", "w", -1, 0)
        _width(q, s["u"], "q", "u", -1, 0)
        _width(s["w"], s["u"], "w", "u")
        _width(s["w"], s["v"], "w", "v", -1, 0)
    return _bcast(q[:-2], k[:-2], what="q and k batch dims") + (q[-2], k[-2])


def _mha_shape(s, params):
    heads = params["num_heads"]
    kv_heads = params.get("num_kv_heads") or heads
    for w, x in (("w_q", "query"), ("w_k", "key"), ("w_v", "value")):
        _width(s[x], s[w], x, w, -1, 0)
    for w, h in (("w_q", heads), ("w_k", kv_heads), ("w_v", kv_heads)):
        if s[w][1] % h:
            raise ValueError(f"{w} width {s[w][1]} is not divisible by {h} heads")
    if s["w_q"][1] // heads != s["w_k"][1] // kv_heads:
        raise ValueError("w_q and w_k give different head widths")
    if heads % kv_heads:
        raise ValueError(f"{heads} heads are not a multiple of {kv_heads} kv heads")
    if s["w_o"][0] != heads * (s["w_v"][1] // kv_heads):
        raise ValueError(f"w_o has {s['w_o'][0]} rows, expected heads x value head width")
    batch = _bcast(s["query"][:-2], s["key"][:-2], s["value"][:-2], what="batch dims")
    if s["key"][-2] != s["value"][-2]:
        raise ValueError("key and value have different numbers of tokens")
    if s.get("mask") is not None:
        _bcast(s["mask"], batch + (heads, s["query"][-2], s["key"][-2]), what="mask")
    return batch + (s["query"][-2], s["w_o"][1])


def _check_names(case) -> list[str]:
    problems = []
    allowed = OP_INPUTS[case.op]
    for name in case.inputs:
        if name not in allowed:
            problems.append(f"input {name!r} is not an input of {case.op} "
                            f"(it takes {', '.join(sorted(allowed))})")
    for name in OPERATIONS[case.op]:
        if name not in case.inputs:
            problems.append(f"{case.op} needs input {name!r}")
    for name in case.params:
        if name not in OP_PARAMS[case.op]:
            problems.append(f"param {name!r} is not a param of {case.op}")
    for name in REQUIRED_PARAMS.get(case.op, ()):
        if name not in case.params:
            problems.append(f"{case.op} needs param {name!r}")
    return problems


def _check_expect(case, arrays) -> list[str]:
    from .properties import PROPERTIES
    from .statistics import STATISTICS

    problems = []
    outcomes = [case.expect] + [o for choices in case.expect.get("policy", {}).values()
                                for o in choices.values()]
    for outcome in outcomes:
        for target, value in outcome.get("exact", {}).items():
            try:
                output, _ = split_target(target)
                if output not in OUTPUTS[case.op]:
                    problems.append(f"exact {target!r}: {case.op} has no output {output!r}")
                if isinstance(value, dict):
                    if value["input"] not in arrays:
                        problems.append(f"exact {target!r} refers to unknown input {value['input']!r}")
                    parse_index(value.get("at", "[...]"))
            except ValueError as exc:
                problems.append(f"exact {target!r}: {exc}")
        for prop in outcome.get("properties", ()):
            name = prop if isinstance(prop, str) else next(iter(prop))
            if name not in PROPERTIES:
                problems.append(f"unknown property {name!r} (known: {', '.join(sorted(PROPERTIES))})")
    for stat in case.expect.get("statistic", ()):
        if stat["name"] not in STATISTICS:
            problems.append(f"unknown statistic {stat['name']!r} (known: {', '.join(sorted(STATISTICS))})")
    return problems


def static_errors(case, known_dtypes=None, tolerance_file="spec/tolerances.yaml"):
    """Every problem of a case beyond the schema, as SpecErrors.

    known_dtypes: the dtypes with a tolerance (default: those of spec/tolerances.yaml).
    """
    from .spec_loader import SpecError
    from .tolerances import load_tolerances

    problems = _check_names(case)
    if known_dtypes is None:
        known_dtypes = load_tolerances().unit_roundoff
    problems += [f"dtype {d!r} has no tolerance in {tolerance_file}"
                 for d in case.dtypes if d not in known_dtypes]
    problems += _check_policies(case)
    for variant in case.variants:
        label = f"dims {variant.label}: " if variant.label else ""
        try:
            arrays = build_inputs(case.inputs, variant.dims)
        except (ValueError, IndexError, TypeError) as exc:
            problems.append(f"{label}inputs: {exc}")
            continue
        problems += [label + p for p in _check_arrays(case, arrays)]
        if not problems:
            problems += _check_expect(case, arrays)
    return [SpecError(case.file, case.line, case.id, p) for p in dict.fromkeys(problems)]


def _check_policies(case) -> list[str]:
    """Each policy branch names a choice of that policy (the schema only knows all names)."""
    problems = []
    for name, choices in case.expect.get("policy", {}).items():
        allowed = POLICIES.get(name, ())
        problems += [f"policy {name} has no choice {choice!r} (its choices: {', '.join(allowed)})"
                     for choice in choices if choice not in allowed]
    return problems


def _check_arrays(case, arrays) -> list[str]:
    problems = []
    for name in ("mask",):
        if name in arrays and arrays[name].dtype != bool:
            problems.append("mask must be boolean (true = may attend); use bias for floats")
    for name, array in arrays.items():
        if name != "mask" and array.dtype == bool:
            problems.append(f"input {name!r} is boolean but only mask may be")
    if problems or _check_names(case):
        return problems
    try:
        output_shapes(case.op, {n: a.shape for n, a in arrays.items()}, case.params)
    except (ValueError, KeyError, IndexError) as exc:
        problems.append(f"inconsistent shapes: {exc}")
    return problems
