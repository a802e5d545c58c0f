"""Fuzzing a backend against the float64 reference, beyond the cases of the spec.

Hypothesis draws cases: an op (those the op table marks `fuzzed`), shapes (heads, batch,
grouped-query heads, Lq != Lk), boolean masks of several broadcast shapes, biases,
scales (including the default), causal alignments, sliding windows, softcaps and dtypes.
Each drawn case is written exactly as a spec case (generators with seeds, never inline
floats), validated with the spec's own schema and checks, and judged by the suite's own
runner against the reference: golden comparison within the tolerance of
spec/tolerances.yaml, and, where a query row has no allowed key, under the backend's
declared ``fully_masked_rows`` policy.

On a failure, Hypothesis shrinks the case to a small one, and :func:`case_yaml` prints it
as a YAML case ready to paste into a spec file.

    from attention_conformance.fuzz import fuzz
    report = fuzz(backend, examples=200, seed=1)
    if report.failure:
        print(report.failure.yaml)
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from .model.dtypes import PLAIN_DTYPES
from .golden.compute import compute
from .golden.inputs import build_inputs
from .model.ops import OPS, ops_taking, takes_dtype
from .model.errors import CheckFailure, Unsupported
from .golden.reference import allowed_keys
from .backend.in_process import InProcess
from .checking.verdict import run_case
from .model.folder import default_folder
from .specs.loader import load_file
from .specs.validation import static_errors

#: the ops the fuzzer draws (those the op table marks `fuzzed`)
FUZZED_OPS = tuple(o.name for o in OPS.values() if o.fuzzed)
FULLY_MASKED = {"fully_masked_rows": {"zeros": {"golden": True}, "uniform": {"golden": True},
                                      "nan": {"golden": True}}}


class FuzzError(Exception):
    """The fuzzer made a case the spec rejects: a bug of the fuzzer, not of the backend."""


# --- drawing cases --------------------------------------------------------------------

def case_strategy(ops=FUZZED_OPS, dtypes=PLAIN_DTYPES):
    """A Hypothesis strategy of case documents (dicts shaped like a spec case)."""
    from hypothesis import strategies as st

    # each op with the dtypes it takes (an fp8 dtype only the ops with descale factors)
    taken = {op: tuple(d for d in dtypes if takes_dtype(op, d)) for op in ops}
    ops = tuple(op for op in ops if taken[op])
    seeds = st.integers(0, 2**16)

    @st.composite
    def cases(draw):
        op = draw(st.sampled_from(ops))
        dtype = draw(st.sampled_from(taken[op]))
        lq, lk = draw(st.integers(1, 6)), draw(st.integers(1, 6))
        d, dv = draw(st.integers(1, 8)), draw(st.integers(1, 8))
        layout = draw(st.sampled_from(("plain", "heads", "batch_heads", "gqa")))
        if layout == "plain":
            qb = kb = ()
        elif layout == "heads":
            qb = kb = (draw(st.integers(1, 3)),)
        elif layout == "batch_heads":
            b, h = draw(st.integers(1, 2)), draw(st.integers(1, 3))
            qb, kb = (b, h), (draw(st.sampled_from((b, 1))), h)
        else:
            hkv, groups = draw(st.integers(2, 3)), draw(st.integers(2, 3))
            qb, kb = (hkv * groups,), (hkv,)
        std = draw(st.sampled_from((1.0, 3.0, 0.3)))
        inputs = {
            "q": _normal(qb + (lq, d), draw(seeds), std),
            "k": _normal(kb + (lk, d), draw(seeds)),
            "v": _normal(kb + (lk, dv), draw(seeds)),
        }
        if op == "attention_weights":
            del inputs["v"]
        score = qb + (lq, lk)
        mask = draw(st.sampled_from(("none", "pairs", "keys", "scores")))
        if mask != "none":
            shape = {"pairs": (lq, lk), "keys": (lk,), "scores": score}[mask]
            inputs["mask"] = {"bernoulli": {"shape": list(shape), "seed": draw(seeds),
                                            "p": draw(st.sampled_from((0.5, 0.8, 0.2))),
                                            "keep_first": draw(st.booleans())}}
        bias = draw(st.sampled_from(("none", "none", "pairs", "scores")))
        if bias != "none":
            inputs["bias"] = _normal({"pairs": (lq, lk), "scores": score}[bias], draw(seeds),
                                     draw(st.sampled_from((1.0, 5.0))))
        if op == "sdpa_vjp":
            inputs["d_out"] = _normal(qb + (lq, dv), draw(seeds))
        params = {}
        scale = draw(st.one_of(st.none(), st.sampled_from((0.5, 1.0, 0.125, 2.0, 0.05, 4.0))))
        if scale is not None:
            params["scale"] = scale
        causal = draw(st.sampled_from((None, "top_left", "bottom_right")))
        if causal:
            params["causal"] = causal
        side = st.one_of(st.none(), st.integers(0, 6), st.just(-1))
        if draw(st.integers(0, 2)) == 2:
            params["window"] = [draw(side), draw(side)]
        softcap = draw(st.sampled_from((None, None, None, 5.0, 1.0, 20.0)))
        if softcap is not None:
            params["softcap"] = softcap
        return make_case(op, dtype, inputs, params)

    return cases()


def _normal(shape, seed, std=1.0) -> dict:
    spec = {"shape": list(shape), "seed": int(seed)}
    if std != 1.0:
        spec["std"] = std
    return {"normal": spec}


def has_empty_rows(inputs: dict, params: dict) -> bool:
    """Whether some query row has no allowed key (mask, causal and window together)."""
    arrays = build_inputs(inputs, {})
    lq, lk = arrays["q"].shape[-2], arrays["k"].shape[-2]
    keep = allowed_keys(lq, lk, causal=params.get("causal"), window=params.get("window"))
    if "mask" in arrays:
        keep = keep & arrays["mask"]
    return bool((~np.any(keep, axis=-1)).any())


def _features(op, inputs, params) -> str:
    words = [op]
    q = inputs["q"]["normal"]["shape"]
    k = inputs["k"]["normal"]["shape"]
    words.append(f"q {q} k {k}")
    if "mask" in inputs:
        words.append("mask")
    if "bias" in inputs:
        words.append("bias")
    words += [f"{name} {value}" for name, value in params.items()]
    return ", ".join(str(w) for w in words)


def make_case(op, dtype, inputs, params) -> dict:
    """A case document: id from a hash of its content, golden or policy expectations."""
    expect = {"policy": FULLY_MASKED} if has_empty_rows(inputs, params) else {"golden": True}
    body = {"op": op, "inputs": inputs, "params": params, "dtypes": [dtype], "expect": expect}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:10]
    description = f"fuzzed: {_features(op, inputs, params)}"
    if len(description) > 120:
        description = description[:117] + "..."
    doc = {"id": f"fuzz-{op.replace('_', '-')}-{digest}", "description": description,
           "source": "attention-conformance fuzz", **body}
    if not params:
        del doc["params"]
    return doc


# --- YAML -----------------------------------------------------------------------------

def _flow(value) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10**6)
    return text.removesuffix("\n...\n").strip()  # a plain scalar ends its document


def case_yaml(doc: dict, indent: int = 0) -> str:
    """The case as a YAML list item, in the style of the spec files."""
    pad = " " * indent
    lines = [f"- id: {doc['id']}"]
    for key in ("description", "source", "op"):
        lines.append(f"  {key}: {_flow(doc[key])}")
    lines.append("  inputs:")
    lines += [f"    {name}: {_flow(spec)}" for name, spec in doc["inputs"].items()]
    if doc.get("params"):
        lines.append(f"  params: {_flow(doc['params'])}")
    lines.append(f"  dtypes: {_flow(doc['dtypes'])}")
    expect = yaml.safe_dump(doc["expect"], default_flow_style=False, sort_keys=False)
    lines.append("  expect:")
    lines += ["    " + line for line in expect.rstrip().splitlines()]
    return "\n".join(pad + line for line in lines) + "\n"


def case_file_yaml(docs, topic: str = "fuzz_found") -> str:
    """A complete case file (topic must equal the file's name)."""
    head = (f"topic: {topic}\ndescription: Cases found by attention-conformance fuzz.\n"
            "cases:\n")
    return head + "".join(case_yaml(d, indent=2) for d in docs)


# --- running --------------------------------------------------------------------------

class LiveGolden:
    """Golden outputs computed on demand by the reference (fuzzed cases have no files)."""

    def __init__(self, tolerances=None):
        self.tolerances = tolerances or default_folder().tolerances

    def get(self, case, variant, dtype, policy=None, accumulation=None, convention=None):
        return compute(case, variant, dtype, self.tolerances, policy, accumulation, convention)


def load_document(doc: dict, directory: Path):
    """The Case of a document, validated as a spec file would be; FuzzError if invalid."""
    path = Path(directory) / "fuzz.yaml"
    path.write_text(case_file_yaml([doc], topic="fuzz"))
    cases, errors = load_file(path)
    if not errors and cases:
        errors = static_errors(cases[0], set(default_folder().tolerances.unit_roundoff))
    if errors or not cases:
        raise FuzzError("the fuzzer drew an invalid case:\n" + "\n".join(map(str, errors))
                        + "\n" + case_yaml(doc))
    return cases[0]


def run_document(backend: InProcess, doc: dict, directory: Path) -> str:
    """'pass' or 'unsupported'; CheckFailure (with the reason) when the backend fails."""
    case = load_document(doc, directory)
    try:
        run_case(backend, case, case.variants[0], case.dtypes[0], LiveGolden())
    except Unsupported:
        return "unsupported"
    except CheckFailure:
        raise
    except Exception as exc:
        raise CheckFailure(f"the backend raised {type(exc).__name__}: {exc}") from exc
    return "pass"


@dataclass
class Failure:
    doc: dict
    message: str

    @property
    def yaml(self) -> str:
        return case_yaml(self.doc)


@dataclass
class FuzzReport:
    backend: str
    examples: int
    seed: int
    tried: int = 0
    passed: int = 0
    unsupported: int = 0
    failure: Failure | None = None
    dtypes: list = field(default_factory=list)

    def text(self, command: str | None = None) -> str:
        """What the command line prints: a summary, or the failing case as YAML."""
        if not self.failure:
            return (f"fuzz: backend {self.backend!r}, seed {self.seed}: {self.tried} cases tried"
                    f" ({self.passed} passed, {self.unsupported} unsupported), no failure\n")
        reason = "\n".join("#   " + line for line in self.failure.message.splitlines())
        found_by = command or f"attention-conformance fuzz {self.backend} --seed {self.seed}"
        return (f"# fuzz: backend {self.backend!r} fails this case (found by: {found_by};\n"
                f"# shrunk by Hypothesis after {self.tried} calls):\n{reason}\n"
                "# Paste it under `cases:` in a file of spec/cases/, then run\n"
                "#   attention-conformance validate && attention-conformance golden regenerate\n"
                + self.failure.yaml)


def _refuse_ops_taking_no_dtype(ops, dtypes) -> None:
    """ValueError, in one line, where an op asked for takes none of the dtypes (an fp8
    dtype is only for the ops with descale factors)."""
    for op in ops:
        if not any(takes_dtype(op, d) for d in dtypes):
            raise ValueError(f"--op {op} cannot take --dtype {', '.join(dtypes)}: "
                             f"{_takers(dtypes[0])}")


def _refuse_dtypes_no_op_takes(ops, dtypes) -> None:
    """ValueError, in one line, where none of the ops drawn takes one of the dtypes."""
    for dtype in dtypes:
        if not ops_taking(dtype, ops):
            raise ValueError(f"--dtype {dtype}: none of the ops to draw ({', '.join(ops)}) "
                             f"takes it; {_takers(dtype)}")


def _takers(dtype) -> str:
    return (f"{dtype} is for the ops that take descale factors "
            f"({', '.join(ops_taking(dtype))}; the fuzzer draws "
            f"{', '.join(ops_taking(dtype, FUZZED_OPS))})")


def fuzz(backend, *, examples: int = 100, seed: int = 0, dtypes=None, ops=None,
         progress=None) -> FuzzReport:
    """Draw up to ``examples`` cases; return the first failure, shrunk, if any."""
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as hypothesis_seed

    declared = [d for d in PLAIN_DTYPES if d in set(getattr(backend, "dtypes", ()))]
    chosen = [d for d in (dtypes or declared)]
    if not chosen:
        raise ValueError("no dtype to fuzz: the backend declares none of the chosen dtypes")
    unknown = set(ops or ()) - set(FUZZED_OPS)
    if unknown:
        raise ValueError(f"cannot fuzz {sorted(unknown)}; ops: {', '.join(FUZZED_OPS)}")
    _refuse_ops_taking_no_dtype(ops or (), chosen)
    ops = [op for op in (ops or FUZZED_OPS) if hasattr(backend, op)]
    if not ops:
        raise ValueError(f"the backend has none of the ops the fuzzer draws ({', '.join(FUZZED_OPS)})")
    _refuse_dtypes_no_op_takes(ops, chosen)
    caller = InProcess(backend)
    report = FuzzReport(caller.declaration.name, examples, seed, dtypes=chosen)
    found: list[Failure] = []

    with tempfile.TemporaryDirectory(prefix="attention-fuzz-") as tmp:
        @settings(max_examples=examples, database=None, deadline=None, derandomize=False,
                  suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                  print_blob=False, verbosity=Verbosity.quiet,
                  phases=(Phase.generate, Phase.shrink))
        @hypothesis_seed(seed)
        @given(case_strategy(ops, chosen))
        def probe(doc):
            report.tried += 1
            if progress:
                progress(report.tried, examples)
            try:
                with warnings.catch_warnings():     # NaN rows warn in NumPy; the
                    warnings.simplefilter("ignore", RuntimeWarning)  # checks judge them
                    outcome = run_document(caller, doc, Path(tmp))
            except CheckFailure as exc:
                found.append(Failure(doc, str(exc)))
                raise
            if outcome == "pass":
                report.passed += 1
            else:
                report.unsupported += 1

        try:
            probe()
        except CheckFailure as exc:
            # Hypothesis re-raises the failure of the smallest case it found
            last = found[-1] if found else None
            message = str(exc)
            doc = dict(next((f.doc for f in reversed(found) if f.message == message), last.doc))
            doc["source"] = f"attention-conformance fuzz (backend {report.backend}, seed {seed})"
            report.failure = Failure(doc, message)
    return report
