"""Checks of a case that the schema cannot express: names, shapes, dtypes, references.

Every expectation is resolved against the op table (ops.py): inputs and params the op
takes, `exact` targets and values that fit its outputs, statistics of outputs it
produces, properties and their arguments as the registry defines them. Numbers are
finite except where a value may be NaN or infinite (input values, `set` values, `exact`
values); variants have distinct labels; no axis has length 0; and the elements of each
generated array and of each case (inputs, outputs and score matrices of every variant)
stay within MAX_ARRAY_ELEMENTS and MAX_CASE_ELEMENTS (score matrices within theirs, and
a file's cases within MAX_FILE_ELEMENTS), checked before anything is allocated
(docs/writing-cases.md, "Plain YAML, and limits").
"""

from __future__ import annotations

import inspect
import math

import numpy as np

from ..model.dtypes import FP8_DTYPES, UNIT_ROUNDOFF
from ..model.indexing import parse_index, split_target
from ..golden.inputs import build_inputs, planned_shapes
from ..golden.blocks import UNBLOCKED_PARAMS
from ..golden.sampled import OPS as SAMPLED_OPS
from ..model.ops import OPS, ops_taking, output_shapes, takes_dtype
from ..model.shapes import score_shape
from ..model.policies import CONVENTION_POLICIES, POLICIES, TOLERANCE_POLICIES
from ..model.sharding import case_problems as sharding_problems
from ..model.layout import problems as layout_problems
from ..checking.properties import PROPERTIES, property_entry
from .yaml_reader import SpecError
from ..checking.statistics import STATISTICS

#: the schema's patterns of a topic and a case id, matched to the string's end
TOPIC_PATTERN = r"[a-z0-9][a-z0-9_-]*"
ID_PATTERN = r"[a-z0-9][a-z0-9._-]*"
#: elements of one generated array or output, and of one case (every variant's inputs
#: and outputs together); the score matrices an op computes on the way have their own,
#: larger limits (the long profile's 8192 x 8192 scores are 2**26)
MAX_ARRAY_ELEMENTS = 1 << 24
MAX_CASE_ELEMENTS = 1 << 24
MAX_SCORE_ELEMENTS = 1 << 26
MAX_CASE_SCORE_ELEMENTS = 1 << 27
#: and of one file's cases together, so that no file makes validation or a run hang
MAX_FILE_ELEMENTS = 1 << 26
MAX_FILE_SCORE_ELEMENTS = 1 << 29
#: a case of the scale profile is validated from its shapes alone (its inputs are made
#: only when one of its tests runs, and a machine too small for it reports the test
#: unsupported: min_memory_gb), within these limits of one array, of one case's arrays
#: and of one score matrix; the file limits do not count it
MAX_SCALE_ARRAY_ELEMENTS = 1 << 34
MAX_SCALE_CASE_ELEMENTS = 1 << 36
MAX_SCALE_SCORE_ELEMENTS = 1 << 42
#: the generators that make a boolean array (and `full` with a boolean value)
BOOL_GENERATORS = ("bernoulli", "key_padding", "triangle")

#: where a number may be NaN or infinite: paths in a case (* is any key or index,
#: ** any rest)
_NONFINITE_ALLOWED = (("inputs", "*", "values", "**"), ("inputs", "*", "set", "*", "value"),
                      ("expect", "exact", "*", "**"),
                      ("expect", "policy", "*", "*", "exact", "*", "**"))


def _check_names(case) -> list[str]:
    problems = []
    op = OPS[case.op]
    allowed = set(op.inputs)
    for name in case.inputs:
        if name not in allowed:
            problems.append(f"input {name!r} is not an input of {case.op} "
                            f"(it takes {', '.join(sorted(allowed))})")
    for name in op.positional:
        if name not in case.inputs:
            problems.append(f"{case.op} needs input {name!r}")
    for name in case.params:
        if name not in op.params:
            problems.append(f"param {name!r} is not a param of {case.op}")
    for name in op.required_params:
        if name not in case.params:
            problems.append(f"{case.op} needs param {name!r}")
    refused = [d for d in case.dtypes if not takes_dtype(case.op, d)]
    if refused:
        problems.append(f"dtype {refused[0]} is for the ops that take descale factors "
                        f"({', '.join(ops_taking(refused[0]))}), not {case.op}")
    wide = [d for d in case.dtypes if d not in FP8_DTYPES]
    if "o_scale" in case.params and wide:
        problems.append(f"param o_scale writes the output in the case's fp8 format: dtype "
                        f"{wide[0]} has none (o_scale cases are float8_e4m3fn, float8_e5m2)")
    return problems


def _outcomes(case):
    return [case.expect] + [o for choices in case.expect.get("policy", {}).values()
                            for o in choices.values()]


def _check_exact(case, target, value, arrays, kind="exact") -> list[str]:
    """An `exact` (or `close`) key names an output and an index that fit it, and a value
    whose shape broadcasts to the selection."""
    op = OPS[case.op]
    outputs = op.outputs_for(case.inputs)
    output, index = split_target(target, op.outputs[0])
    if output not in outputs:
        if output in op.all_outputs:
            given = dict(op.optional_outputs)[output]
            return [f"{kind} {target!r}: {case.op} returns {output!r} only with input {given!r}"]
        return [f"{kind} {target!r}: {case.op} has no output {output!r}"]
    shape = output_shapes(case.op, {n: a.shape for n, a in arrays.items()}, case.params)
    try:
        selection = np.zeros(shape[outputs.index(output)])[index]
    except IndexError as exc:
        return [f"{kind} {target!r}: the index does not fit output {output} of shape "
                f"{shape[outputs.index(output)]}: {exc}"]
    if isinstance(value, dict):
        if value["input"] not in arrays:
            return [f"{kind} {target!r} refers to unknown input {value['input']!r}"]
        try:
            source = arrays[value["input"]][parse_index(value.get("at", "[...]"))]
        except IndexError as exc:
            return [f"{kind} {target!r}: 'at' does not fit input {value['input']!r}: {exc}"]
        value_shape = np.shape(source)
    else:
        try:
            value_shape = np.shape(np.array(value, dtype=np.float64))
        except (ValueError, TypeError):
            hint = " (write .nan, .inf or -.inf unquoted)" if isinstance(value, str) else ""
            return [f"{kind} {target!r}: the value {value!r} is not a number or a list of "
                    f"numbers of one shape{hint}"]
    try:
        np.broadcast_to(np.zeros(value_shape), np.shape(selection))
    except ValueError:
        return [f"{kind} {target!r}: a value of shape {value_shape} does not fit the "
                f"selection of shape {np.shape(selection)}"]
    return []


#: a `close` entry's `atol` is at least this many unit roundoffs of its largest |value|
#: in each dtype of the case: a tighter one no implementation in that dtype can meet
MIN_CLOSE_ROUNDINGS = 4


def _check_close_tolerance(case, target, entry) -> list[str]:
    """A `close` entry's stated tolerance is one every dtype of the case can meet."""
    if "atol" not in entry:
        return []           # digits: the dtype's rounding is added to the written digits
    try:
        largest = float(np.max(np.abs(np.array(entry["value"], dtype=np.float64)), initial=0.0))
    except (ValueError, TypeError):
        return []           # reported by _check_exact
    problems = []
    for dtype in case.dtypes:
        floor = MIN_CLOSE_ROUNDINGS * UNIT_ROUNDOFF.get(dtype, 0.0) * largest
        if entry["atol"] < floor:
            problems.append(f"close {target!r}: atol {entry['atol']:g} is tighter than "
                            f"{dtype} can meet ({MIN_CLOSE_ROUNDINGS} x unit roundoff x "
                            f"max|value| = {floor:.3g})")
    return problems


def _property_arguments(name, args) -> list[str]:
    accepted = [p for p in inspect.signature(PROPERTIES[name]).parameters if p != "ctx"]
    unknown = sorted(set(args) - set(accepted))
    if unknown:
        return [f"property {name} takes no argument {', '.join(map(repr, unknown))}"
                f" (it takes: {', '.join(accepted) or 'none'})"]
    defaults = {p.name: p.default for p in inspect.signature(PROPERTIES[name]).parameters.values()}
    problems = []
    for key, value in args.items():
        default = defaults[key]
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            problems.append(f"property {name} argument {key!r} must be a number, not {value!r}")
        elif isinstance(default, int) and not isinstance(value, int):
            problems.append(f"property {name} argument {key!r} must be an integer, not {value!r}")
        elif key == "seed" and not 0 <= value <= 2 ** 32 - 1:
            problems.append(f"property {name} argument 'seed' must be in 0 .. 2**32 - 1, "
                            f"not {value!r}")
        elif not math.isfinite(value):
            problems.append(f"property {name} argument {key!r} must be a finite number, "
                            f"not {value!r}")
    return problems


def _check_expect(case, arrays) -> list[str]:
    problems = []
    for outcome in _outcomes(case):
        for target, value in outcome.get("exact", {}).items():
            try:
                problems += _check_exact(case, target, value, arrays)
            except ValueError as exc:
                problems.append(f"exact {target!r}: {exc}")
        for target, entry in outcome.get("close", {}).items():
            try:
                problems += _check_exact(case, target, entry["value"], arrays,
                                         kind="close")
            except ValueError as exc:
                problems.append(f"close {target!r}: {exc}")
            problems += _check_close_tolerance(case, target, entry)
        for prop in outcome.get("properties", ()):
            name, args = property_entry(prop)
            if name not in PROPERTIES:
                problems.append(f"unknown property {name!r} (known: {', '.join(sorted(PROPERTIES))})")
            else:
                problems += _property_arguments(name, args or {})
    for stat in case.expect.get("statistic", ()):
        if stat["name"] not in STATISTICS:
            problems.append(f"unknown statistic {stat['name']!r} (known: {', '.join(sorted(STATISTICS))})")
        output = stat.get("output")
        outputs = OPS[case.op].outputs_for(case.inputs)
        if output is not None and output not in outputs:
            problems.append(f"statistic {stat['name']}: {case.op} has no output {output!r}"
                            f" (its outputs: {', '.join(outputs)})")
    return problems


def _over_file_budget(elements, budget) -> str | None:
    if budget is None:
        return None
    if budget[0] + elements[0] > MAX_FILE_ELEMENTS:
        return (f"with this case, the inputs and outputs of the file's cases pass "
                f"{MAX_FILE_ELEMENTS:,} elements (at most that per file: split the file)")
    if budget[1] + elements[1] > MAX_FILE_SCORE_ELEMENTS:
        return (f"with this case, the score matrices of the file's cases pass "
                f"{MAX_FILE_SCORE_ELEMENTS:,} elements (at most that per file: split the file)")
    return None


def static_errors(case, known_dtypes, tolerance_file="spec/tolerances.yaml", budget=None):
    """Every problem of a case beyond the schema, as SpecErrors.

    known_dtypes: the dtypes that have a tolerance in the spec folder's tolerances file.
    budget: [elements of inputs and outputs, of score matrices] of the valid cases of
    the file so far (checked against the per-file limits, and added to when the case
    is valid), or None.
    """
    located = _check_numbers(case.raw) + _check_variants(case)      # (message, path)
    problems = _check_names(case)
    problems += [f"dtype {d!r} has no tolerance in {tolerance_file}"
                 for d in case.dtypes if d not in known_dtypes]
    problems += _check_policies(case)
    if case.profile == "scale":
        return _scale_errors(case, located, problems)
    elements = [0, 0]            # inputs and outputs; score matrices
    for variant in case.variants:
        label = f"dims {variant.label}: " if variant.label else ""
        planned, limit, path = _planned_elements(case, variant, elements)
        if limit:
            located.append((label + limit, path))
            break
        elements[0] += planned
        limit = _over_file_budget(elements, budget)
        if limit:
            located.append((limit, ()))
            break
        arrays = _arrays_of(lambda c, v: build_inputs(c.inputs, v.dims), case, variant,
                            label, problems, located)
        if arrays is None:
            continue
        found = _check_arrays(case, arrays)
        problems += [label + p for p in found]
        if not found and not located:
            computed, limit = _computed_elements(case, arrays, elements)
            if limit:
                located.append((label + limit, ("inputs",)))
                break
            elements = [elements[0] + computed[0], elements[1] + computed[1]]
            limit = _over_file_budget(elements, budget)
            if limit:
                located.append((limit, ()))
                break
        if not problems and not located:
            problems += _check_expect(case, arrays)
    errors = {(p, case.line): None for p in problems}
    errors.update({(p, _line_at(case.raw, path, case.line)): None for p, path in located})
    if budget is not None and not errors:
        budget[0], budget[1] = budget[0] + elements[0], budget[1] + elements[1]
    return [SpecError(case.file, line, case.id, p) for p, line in errors]


def _arrays_of(make, case, variant, label, problems, located):
    """A variant's arrays, make(case, variant) (its inputs, or their stand-ins), or None
    once the problem is noted: they cannot be made, or an axis has length 0."""
    try:
        arrays = make(case, variant)
    except (ValueError, IndexError, TypeError, KeyError) as exc:
        problems.append(f"{label}inputs: {exc}")
        return None
    empty = _empty_axes(arrays)
    if empty:
        located.append((label + empty[0], ("inputs", empty[1])))
        return None
    return arrays


def stand_ins(case, variant) -> dict:
    """The inputs of a variant as arrays of their planned shapes and dtypes that take no
    memory (a broadcast zero): what validation reads of a scale case."""
    arrays = {}
    for name, shape in planned_shapes(case.inputs, variant.dims).items():
        if shape is None:
            raise ValueError(f"the shape of input {name!r} cannot be known before it is made")
        spec = case.inputs[name]
        source = case.inputs.get(spec.get("same_as"), spec)
        boolean = any(g in source for g in BOOL_GENERATORS) or source.get("dtype") == "bool" \
            or isinstance(source.get("full", {}).get("value"), bool)
        arrays[name] = np.broadcast_to(np.zeros((), dtype=bool if boolean else np.float64), shape)
    return arrays


def _scale_errors(case, located, problems):
    """static_errors of a case of the scale profile: from its shapes alone, within the
    scale limits."""
    for variant in case.variants:
        label = f"dims {variant.label}: " if variant.label else ""
        arrays = _arrays_of(stand_ins, case, variant, label, problems, located)
        if arrays is None:
            continue
        found = _check_arrays(case, arrays) or _scale_limit(case, arrays)
        problems += [label + p for p in found]
        if not found:
            problems += _check_expect(case, arrays)
    errors = {(p, case.line): None for p in problems}
    errors.update({(p, _line_at(case.raw, path, case.line)): None for p, path in located})
    return [SpecError(case.file, line, case.id, p) for p, line in errors]


def _scale_limit(case, arrays) -> list[str]:
    """The scale limits a variant passes (MAX_SCALE_*)."""
    shapes = {n: a.shape for n, a in arrays.items()}
    sizes = [a.size for a in arrays.values()]
    sizes += [math.prod(s) for s in output_shapes(case.op, shapes, case.params)]
    scores = score_shape(case.op, shapes, case.params)
    if max(sizes) > MAX_SCALE_ARRAY_ELEMENTS or sum(sizes) > MAX_SCALE_CASE_ELEMENTS:
        return [f"an input or output has {max(sizes):,} elements, {sum(sizes):,} in all (at "
                f"most {MAX_SCALE_ARRAY_ELEMENTS:,} in one array, {MAX_SCALE_CASE_ELEMENTS:,}"
                " in a scale case)"]
    if scores is not None and math.prod(scores) > MAX_SCALE_SCORE_ELEMENTS:
        return [f"the score matrix of shape {tuple(scores)} has more than "
                f"{MAX_SCALE_SCORE_ELEMENTS:,} elements"]
    return []


def _line_at(raw, path, line) -> int:
    """The line of the key or item at `path` in a case's YAML (else `line`, its own)."""
    node = raw
    for key in path:
        try:
            child = node[key]
        except (KeyError, IndexError, TypeError):
            break
        line = getattr(node, "key_lines", {}).get(key) or getattr(child, "line", None) or line
        node = child
    return line


def _walk(value, path=()):
    """(path, value) of every scalar in nested dicts and lists."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _walk(child, path + (key,))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _walk(child, path + (index,))
    else:
        yield path, value


def _matches(path, pattern) -> bool:
    for position, part in enumerate(pattern):
        if part == "**":
            return True
        if position >= len(path) or part not in ("*", path[position]):
            return False
    return len(path) == len(pattern)


def number_errors(raw, file, case_id) -> list[SpecError]:
    """_check_numbers of a case's YAML mapping, as SpecErrors: it needs no valid case, so
    the loader adds it to the schema's problems of a case the schema refuses."""
    return [SpecError(file, _line_at(raw, path, getattr(raw, "line", 0)), case_id, message)
            for message, path in _check_numbers(raw)]


def _check_numbers(raw) -> list[tuple[str, tuple]]:
    """A number is finite, except where a value may be NaN or infinite."""
    problems = []
    for path, value in _walk(raw):
        if isinstance(value, float) and not math.isfinite(value) \
                and not any(_matches(path, p) for p in _NONFINITE_ALLOWED):
            where = "/".join(map(str, path))
            problems.append((f"{where} must be a finite number, not {value!r} (NaN and "
                             "infinities are for input values, set values and exact values)",
                             path))
    return problems


def _check_variants(case) -> list[tuple[str, tuple]]:
    """Each variant has its own label: the labels make the test ids."""
    seen, problems = {}, []
    for index, variant in enumerate(case.variants):
        if variant.label in seen:
            problems.append((f"dims {variant.label} is given twice (entries {seen[variant.label]} "
                             f"and {index} of dims): each variant needs its own label, "
                             "which its test ids carry", ("dims", index)))
        seen.setdefault(variant.label, index)
    return problems


def _planned_elements(case, variant, before) -> tuple[int, str | None, tuple]:
    """(elements of a variant's inputs, the limit they pass or None, where), before
    anything is allocated."""
    total = before[0]
    for name, shape in planned_shapes(case.inputs, variant.dims).items():
        if shape is None:
            continue
        size = math.prod(shape)
        if size > MAX_ARRAY_ELEMENTS:
            return 0, (f"input {name!r} of shape {tuple(shape)} has {size:,} elements "
                       f"(at most {MAX_ARRAY_ELEMENTS:,} in one array)"), ("inputs", name)
        total += size
        if total > MAX_CASE_ELEMENTS:
            return 0, (f"the inputs and outputs of the case's variants have more than "
                       f"{MAX_CASE_ELEMENTS:,} elements in all (at most that per case)"), \
                ("inputs", name)
    return total - before[0], None, ()


def planned_limit(case) -> str | None:
    """The first limit the inputs of a case's variants pass, found without allocating
    anything, or None: the cheap part of the limits, which a case read from the spec
    cache meets again (a case past a limit must never reach generation). A scale case
    is held to its own limits, by static_errors."""
    if case.profile == "scale":
        return None
    elements = [0, 0]
    for variant in case.variants:
        planned, limit, _ = _planned_elements(case, variant, elements)
        if limit:
            return limit
        elements[0] += planned
    return None


def _computed_elements(case, arrays, before) -> tuple[tuple[int, int], str | None]:
    """((elements of a variant's outputs, of its score matrix), or the limit they pass)."""
    shapes = {n: a.shape for n, a in arrays.items()}
    outputs = [math.prod(s) for s in output_shapes(case.op, shapes, case.params)]
    if max(outputs) > MAX_ARRAY_ELEMENTS:
        return (0, 0), (f"an output has {max(outputs):,} elements (at most "
                        f"{MAX_ARRAY_ELEMENTS:,} in one array)")
    scores = score_shape(case.op, shapes, case.params)
    score_size = math.prod(scores) if scores is not None else 0
    if score_size > MAX_SCORE_ELEMENTS:
        return (0, 0), (f"the score matrix of shape {tuple(scores)} has {score_size:,} "
                        f"elements (at most {MAX_SCORE_ELEMENTS:,})")
    if before[0] + sum(outputs) > MAX_CASE_ELEMENTS:
        return (0, 0), (f"the inputs and outputs of the case's variants have more than "
                        f"{MAX_CASE_ELEMENTS:,} elements in all (at most that per case)")
    if before[1] + score_size > MAX_CASE_SCORE_ELEMENTS:
        return (0, 0), (f"the score matrices of the case's variants have more than "
                        f"{MAX_CASE_SCORE_ELEMENTS:,} elements in all (at most that per case)")
    return (sum(outputs), score_size), None


def _empty_axes(arrays) -> tuple[str, str] | tuple[()]:
    """(message, first input) when an input has an axis of length 0, else ()."""
    empty = {name: array.shape for name, array in arrays.items() if 0 in array.shape}
    if not empty:
        return ()
    names = ", ".join(map(repr, empty))
    shapes = ", ".join(map(str, empty.values()))
    return (f"input{'s' if len(empty) > 1 else ''} {names} {'have' if len(empty) > 1 else 'has'}"
            f" an axis of length 0 (shape{'s' if len(empty) > 1 else ''} {shapes}): every "
            "axis needs a length of at least 1", next(iter(empty)))


def _check_policies(case) -> list[str]:
    """Each policy branch names a choice of that policy (the schema only knows all names)."""
    problems = []
    for name, choices in case.expect.get("policy", {}).items():
        if name in TOLERANCE_POLICIES:
            problems.append(f"policy {name} sets the tolerance tier of golden comparisons "
                            "(spec/tolerances.yaml); a case gives no outcome for it")
            continue
        if name in CONVENTION_POLICIES:
            problems.append(f"policy {name} is a convention the golden data are kept in for"
                            " each choice; a case gives no outcome for it")
            continue
        allowed = POLICIES.get(name, ())
        problems += [f"policy {name} has no choice {choice!r} (its choices: {', '.join(allowed)})"
                     for choice in choices if choice not in allowed]
    if case.expect.get("golden") == "sampled":
        problems += _check_sampled(case)
    if case.params.get("q_lengths") is not None and (
            case.expect.get("golden") or case.expect.get("exact")):
        problems.append("q_lengths makes padded query rows, a policy: give golden and exact"
                        " under expect.policy.padded_query_rows, not at the top of expect")
    return problems


def _check_sampled(case) -> list[str]:
    """`golden: sampled` is for the forward ops and sdpa_vjp, live golden data and no
    lengths; sdpa_vjp's (golden/sampled_vjp.py) with no bias, sink or policy outcome."""
    if case.op not in SAMPLED_OPS:
        return [f"golden: sampled checks the sampled rows of {', '.join(SAMPLED_OPS)}, "
                f"not of {case.op} (give golden: true)"]
    if case.profile == "quick":
        return ["golden: sampled is for the long and scale profiles, whose golden data are "
                "computed live (a quick case's are frozen whole: give golden: true)"]
    if any(case.params.get(name) is not None for name in UNBLOCKED_PARAMS):
        return [f"golden: sampled takes none of {', '.join(UNBLOCKED_PARAMS)}"]
    if case.op == "sdpa_vjp" and ({"bias", "sink"} & set(case.inputs)
                                  or case.expect.get("policy")):
        return ["golden: sampled of sdpa_vjp takes no bias or sink and no expect.policy "
                "(golden/sampled_vjp.py)"]
    return []


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
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        problems.append(f"inconsistent shapes: {exc}")
    shapes = {n: a.shape for n, a in arrays.items()}
    return problems + sharding_problems(case.op, shapes, case.params) \
        + layout_problems(case.layout, shapes, case.params)
