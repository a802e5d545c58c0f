"""Checks of a case that the schema cannot express: names, shapes, dtypes, references.

Every expectation is resolved against the op table (ops.py): inputs and params the op
takes, `exact` targets and values that fit its outputs, statistics of outputs it
produces, properties and their arguments as the registry defines them.
"""

from __future__ import annotations

import inspect

import numpy as np

from .indexing import parse_index, split_target
from .inputs import build_inputs
from .ops import OPS, output_shapes
from .policies import POLICIES
from .properties import PROPERTIES
from .spec_yaml import SpecError
from .statistics import STATISTICS


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
    return problems


def _outcomes(case):
    return [case.expect] + [o for choices in case.expect.get("policy", {}).values()
                            for o in choices.values()]


def _check_exact(case, target, value, arrays) -> list[str]:
    """An `exact` key names an output and an index that fit it, and a value whose shape
    broadcasts to the selection."""
    op = OPS[case.op]
    output, index = split_target(target, op.outputs[0])
    if output not in op.outputs:
        return [f"exact {target!r}: {case.op} has no output {output!r}"]
    shape = output_shapes(case.op, {n: a.shape for n, a in arrays.items()}, case.params)
    try:
        selection = np.zeros(shape[op.outputs.index(output)])[index]
    except IndexError as exc:
        return [f"exact {target!r}: the index does not fit output {output} of shape "
                f"{shape[op.outputs.index(output)]}: {exc}"]
    if isinstance(value, dict):
        if value["input"] not in arrays:
            return [f"exact {target!r} refers to unknown input {value['input']!r}"]
        try:
            source = arrays[value["input"]][parse_index(value.get("at", "[...]"))]
        except IndexError as exc:
            return [f"exact {target!r}: 'at' does not fit input {value['input']!r}: {exc}"]
        value_shape = np.shape(source)
    else:
        value_shape = np.shape(value)
    try:
        np.broadcast_to(np.zeros(value_shape), np.shape(selection))
    except ValueError:
        return [f"exact {target!r}: a value of shape {value_shape} does not fit the "
                f"selection of shape {np.shape(selection)}"]
    return []


def _property_arguments(name, args) -> list[str]:
    accepted = [p for p in inspect.signature(PROPERTIES[name]).parameters if p != "ctx"]
    unknown = sorted(set(args) - set(accepted))
    if unknown:
        return [f"property {name} takes no argument {', '.join(map(repr, unknown))}"
                f" (it takes: {', '.join(accepted) or 'none'})"]
    return [f"property {name} argument {k!r} must be a number, not {v!r}"
            for k, v in args.items() if not isinstance(v, (int, float)) or isinstance(v, bool)]


def _check_expect(case, arrays) -> list[str]:
    problems = []
    for outcome in _outcomes(case):
        for target, value in outcome.get("exact", {}).items():
            try:
                problems += _check_exact(case, target, value, arrays)
            except ValueError as exc:
                problems.append(f"exact {target!r}: {exc}")
        for prop in outcome.get("properties", ()):
            name, args = (prop, {}) if isinstance(prop, str) else next(iter(prop.items()))
            if name not in PROPERTIES:
                problems.append(f"unknown property {name!r} (known: {', '.join(sorted(PROPERTIES))})")
            else:
                problems += _property_arguments(name, args or {})
    for stat in case.expect.get("statistic", ()):
        if stat["name"] not in STATISTICS:
            problems.append(f"unknown statistic {stat['name']!r} (known: {', '.join(sorted(STATISTICS))})")
        output = stat.get("output")
        if output is not None and output not in OPS[case.op].outputs:
            problems.append(f"statistic {stat['name']}: {case.op} has no output {output!r}"
                            f" (its outputs: {', '.join(OPS[case.op].outputs)})")
    return problems


def static_errors(case, known_dtypes, tolerance_file="spec/tolerances.yaml"):
    """Every problem of a case beyond the schema, as SpecErrors.

    known_dtypes: the dtypes that have a tolerance in the spec folder's tolerances file.
    """
    problems = _check_names(case)
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
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        problems.append(f"inconsistent shapes: {exc}")
    return problems
