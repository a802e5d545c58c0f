"""A case of the spec as the runner sees it: its data, and the variants of its dims."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from types import MappingProxyType

from .dtypes import input_dtype


@dataclass(frozen=True)
class Variant:
    """One binding of a case's named dims; label '' when the case has none."""

    label: str
    dims: dict


@dataclass(frozen=True)
class Case:
    id: str
    topic: str
    description: str
    source: str
    op: str
    inputs: dict
    params: dict
    dtypes: tuple
    expect: dict
    variants: tuple
    profile: str
    file: str
    line: int
    raw: dict = field(repr=False, compare=False, default_factory=dict)
    #: the memory a test of the case needs of the machine that runs it (GB): on one with
    #: less, the test is unsupported, by size (golden/inputs.py's too_large)
    min_memory_gb: float = 0.0
    #: input name -> how the backend receives it laid out in memory (model/layout.py)
    layout: dict = field(default_factory=dict)

    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def input_dtypes(self, dtype: str) -> MappingProxyType:
        """input name -> the dtype it is given in, in a test of dtype `dtype`
        (model/dtypes.py's input_dtype: passed_as, the descales, fp8's float32 ones);
        read-only, worked out once per case and dtype."""
        return memo(self, ("input_dtypes", dtype), lambda: MappingProxyType(
            {name: input_dtype(dtype, name, spec.get("passed_as"))
             for name, spec in self.inputs.items()}))


#: id(case) -> (a weak reference to the case, its memo): beside the case object, not in
#: it, so that its fields, repr and __dict__ stay its data alone; an entry goes with its
#: case. Nothing of it reaches the spec cache, which keeps the YAML's data and rebuilds
#: every case from them in each run: a case edited between runs is a new object.
_MEMOS: dict[int, tuple] = {}


def memo(case: Case, key, make):
    """make() once per case object and key: a value of the case's data alone (a loaded
    case is never changed), which each of its tests asks for."""
    entry = _MEMOS.get(id(case))
    if entry is None or entry[0]() is not case:
        try:
            entry = (weakref.ref(case, _forget(id(case))), {})
        except TypeError:           # a stand-in that takes no weak reference: no memo
            return make()
        _MEMOS[id(case)] = entry
    values = entry[1]
    if key not in values:
        values[key] = make()
    return values[key]


def _forget(case_id):
    def forget(reference):
        if _MEMOS.get(case_id, (None,))[0] is reference:
            del _MEMOS[case_id]
    return forget


#: the profiles a case may belong to: quick (the default run, golden data frozen), long
#: and scale (each opt-in, golden data computed live)
CASE_PROFILES = ("quick", "long", "scale")
#: a case of this profile gets this many times --case-timeout for its calls
TIMEOUT_FACTOR = {"scale": 10.0}


def in_profile(case: Case, profile: str) -> bool:
    """quick (the default run), long (only the long-sequence cases), scale (only the
    large ones) or all."""
    return profile == "all" or case.profile == profile


def frozen(case: Case) -> bool:
    """Are the case's golden data frozen in spec/golden (quick), or computed live?"""
    return case.profile == "quick"


def timeout_factor(case: Case) -> float:
    """How many times --case-timeout the calls of one test of this case may take."""
    return TIMEOUT_FACTOR.get(case.profile, 1.0)


def profile_counts(cases, profile: str = "quick") -> tuple[int, int]:
    """(cases, tests per backend) of a profile: what list, validate and certify print."""
    chosen = [c for c in cases if in_profile(c, profile)]
    return len(chosen), sum(len(c.variants) * len(c.dtypes) for c in chosen)


def test_name(case: Case, variant: Variant, dtype: str) -> str:
    """A test's name in its case file: ``case-id[variant-dtype]`` (``case-id[dtype]``
    for a case without variants); its id is ``topic/`` and that."""
    label = f"{variant.label}-{dtype}" if variant.label else dtype
    return f"{case.id}[{label}]"
