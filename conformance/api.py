"""Golden data for other projects' tests: a case's inputs, params and expected outputs.

    from attention_conformance.api import load_case

    case = load_case("wo-shi-xiao-gou-causal-first-row")
    args, kwargs = case.arguments("float32")          # positional inputs, keywords + params
    out = my_attention(*args, **kwargs)
    case.check({"out": out}, "float32")               # AssertionError beyond the tolerance

Inputs come as the backend receives them (NumPy arrays of the dtype, bfloat16 as
``ml_dtypes.bfloat16``, masks as bool); expected outputs are the float64 reference,
frozen in spec/golden and verified against its sha256 manifest; ``tolerance`` is the
largest absolute error the suite allows a backend in that dtype (spec/tolerances.yaml).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .backend.calling import cast_inputs
from .model.case import Case
from .checking.comparison import compare
from .golden.compute import golden_entries, rounded_inputs
from .golden.store import GoldenStore
from .model.ops import OPS
from .model.folder import SpecFolder
from .specs.loader import load_spec


class CaseNotFound(LookupError):
    """No valid case has this id."""


@functools.lru_cache(maxsize=8)
def _spec(folder: SpecFolder):
    spec = load_spec(folder, cache=True)
    return spec, spec.by_id()


def list_cases(topic: str | None = None, *, spec_dir=None) -> list[str]:
    """Ids of every valid case (of one topic if given), in spec order."""
    spec, _ = _spec(SpecFolder.from_option(spec_dir))
    return [c.id for c in spec.cases if topic is None or c.topic == topic]


def load_case(case_id: str, *, spec_dir=None) -> "GoldenCase":
    """The case with this id (spec_dir: a spec folder or its cases folder; default: the
    spec the package carries)."""
    folder = SpecFolder.from_option(spec_dir)
    spec, by_id = _spec(folder)
    if case_id not in by_id:
        invalid = [str(e) for e in spec.errors if e.case_id == case_id]
        hint = f" (it is invalid: {invalid[0]})" if invalid else ""
        raise CaseNotFound(f"no case {case_id!r} in {folder.cases_dir}{hint}")
    return GoldenCase(by_id[case_id], GoldenStore.of(folder))


def _policy_key(policy, known: list):
    """The golden entry a policy picks among a case's known ones: None (the plain golden)
    or ('name', 'choice'). policy: None, 'name=choice', ('name', 'choice'), or a dict of
    declared choices, such as a backend's whole `policy` (its choice of each policy that
    the case depends on picks the branch)."""
    if isinstance(policy, dict):
        chosen = [p for p in known if p and policy.get(p[0]) == p[1]]
        return chosen[0] if chosen else None
    if policy is None or isinstance(policy, tuple):
        return policy
    name, sep, choice = str(policy).partition("=")
    if not sep:
        raise ValueError(f"policy {policy!r}: write it as NAME=CHOICE, e.g. fully_masked_rows=zeros,"
                         " or as a dict, e.g. {'fully_masked_rows': 'zeros'}")
    return (name, choice)


def _no_branch(case_id, policy, known) -> str:
    """Why a case has no golden output for this policy, and what to pass instead."""
    names = sorted({p[0] for p in known if p})
    choices = ", ".join(f"{p[0]}={p[1]}" if p else "None" for p in known)
    unnamed = policy is None or isinstance(policy, dict) and not set(names) & set(policy)
    if names and unnamed:
        example = ", ".join(f"{n!r}: CHOICE" for n in names)
        return (f"case {case_id!r} depends on the declared policy {' and '.join(names)}: pass "
                f"policy={{{example}}} (or 'NAME=CHOICE'); its golden outputs are for {choices}")
    return f"case {case_id!r} has no golden output for policy {policy!r}; it has: {choices}"


@dataclass(frozen=True)
class GoldenCase:
    """One case of the spec with its golden data."""

    case: Case
    store: GoldenStore

    # --- what the case is --------------------------------------------------------------
    @property
    def id(self) -> str:
        return self.case.id

    @property
    def topic(self) -> str:
        return self.case.topic

    @property
    def op(self) -> str:
        return self.case.op

    @property
    def description(self) -> str:
        return self.case.description

    @property
    def source(self) -> str:
        return self.case.source

    @property
    def params(self) -> dict:
        """The op's keyword parameters (causal, scale, window, ...), a fresh dict."""
        return {k: (list(v) if isinstance(v, (list, tuple)) else v)
                for k, v in self.case.params.items()}

    @property
    def dtypes(self) -> tuple:
        return tuple(self.case.dtypes)

    @property
    def variants(self) -> tuple:
        """Labels of the shape variants ('' for a case without dims)."""
        return tuple(v.label for v in self.case.variants)

    @property
    def expect(self) -> dict:
        """The case's expectations as written in the spec (golden, exact, properties...)."""
        return self.case.expect

    @property
    def positional(self) -> tuple:
        """Names of the op's positional inputs, in order."""
        return OPS[self.case.op].positional

    @property
    def outputs(self) -> tuple:
        """Names of the op's outputs ('out'; out, lse for sdpa_lse; dq, dk, dv for
        sdpa_vjp, and d_sink when the case has a sink)."""
        return OPS[self.case.op].outputs_for(self.case.inputs)

    @property
    def policies(self) -> tuple:
        """'NAME=CHOICE' of every policy branch that has its own golden output."""
        return tuple(f"{p[0]}={p[1]}" for p in golden_entries(self.case) if p)

    @property
    def has_golden(self) -> bool:
        return any(True for _ in golden_entries(self.case))

    def __repr__(self):
        return f"<GoldenCase {self.topic}/{self.id}: {self.op}, variants {list(self.variants)}>"

    # --- data ---------------------------------------------------------------------------
    def _variant(self, variant):
        variants = self.case.variants
        if variant is None:
            if len(variants) == 1:
                return variants[0]
            raise ValueError(f"case {self.id!r} has {len(variants)} variants; pass "
                             f"variant= one of {[v.label for v in variants]}")
        for v in variants:
            if v.label == variant or v.dims == variant:
                return v
        raise ValueError(f"case {self.id!r} has no variant {variant!r}; "
                         f"it has {[v.label for v in variants]}")

    def _dtype(self, dtype):
        if dtype not in self.case.dtypes:
            raise ValueError(f"case {self.id!r} is not specified for {dtype}; "
                             f"its dtypes are {list(self.case.dtypes)}")
        return dtype

    def inputs(self, dtype: str = "float64", variant=None) -> dict[str, np.ndarray]:
        """Every input, as a backend receives it: the dtype's NumPy array (bool masks)."""
        exact = rounded_inputs(self.case, self._variant(variant), self._dtype(dtype))
        return cast_inputs(exact, dtype, self.case.input_dtypes(dtype))

    def arguments(self, dtype: str = "float64", variant=None) -> tuple[list, dict]:
        """(positional inputs, keyword inputs + params), ready for ``op(*args, **kwargs)``."""
        arrays = self.inputs(dtype, variant)
        args = [arrays.pop(name) for name in self.positional]
        return args, {**arrays, **self.params}

    def _golden(self, dtype, variant, policy, accumulation="input"):
        known = list(golden_entries(self.case))
        if not known:
            raise LookupError(f"case {self.id!r} has no golden output; its expectations are "
                              f"{sorted(self.case.expect)}")
        key = _policy_key(policy, known)
        if key not in known:
            raise LookupError(_no_branch(self.id, policy, known))
        return self.store.get(self.case, self._variant(variant), self._dtype(dtype), key,
                              accumulation)

    def expected(self, dtype: str = "float64", variant=None, policy=None) -> dict[str, np.ndarray]:
        """output name -> the float64 reference output for the inputs of this dtype.

        policy: for a case whose outcome is a declared choice, that choice: a dict such as
        {"fully_masked_rows": "zeros"} (a backend's whole `policy` will do) or
        "fully_masked_rows=zeros"."""
        return {n: np.array(g) for n, (g, _) in self._golden(dtype, variant, policy).items()}

    def tolerance(self, dtype: str = "float64", variant=None, policy=None,
                  accumulation: str = "input") -> dict[str, float]:
        """output name -> the largest absolute error allowed at a finite position;
        accumulation="float32": the float32 tier (float16, bfloat16; spec/tolerances.yaml)."""
        rule = self.store.tolerances
        return {n: rule.output(dtype, err, g)
                for n, (g, err) in self._golden(dtype, variant, policy, accumulation).items()}

    def check(self, outputs, dtype: str = "float64", variant=None, policy=None,
              accumulation: str = "input") -> dict:
        """Compare outputs (a dict by output name, a tuple, or one array) with the golden
        ones; return output -> error / tolerance, raise AssertionError beyond 1.

        NaN and inf must sit where the golden output has them; `accumulation` picks the
        tolerance tier, as a backend's policy of that name does."""
        if not isinstance(outputs, dict):
            outputs = dict(zip(self.outputs, outputs if isinstance(outputs, (tuple, list))
                               else (outputs,)))
        expected = self.expected(dtype, variant, policy)
        tolerance = self.tolerance(dtype, variant, policy, accumulation)
        ratios, problems = {}, []
        for name, gold in expected.items():
            actual = np.asarray(outputs[name]).astype(np.float64)
            if actual.shape != gold.shape:
                problems.append(f"{name}: shape {actual.shape}, expected {gold.shape}")
                continue
            result = compare(actual, gold, tolerance[name])
            ratios[name] = result.ratio
            if not result.ok:
                problems.append(f"{name}: {result.describe(dtype)} exceeds the tolerance"
                                f" {result.tolerance:.3g}")
        if problems:
            raise AssertionError(f"case {self.id} ({dtype}): " + "; ".join(problems))
        return ratios
