"""A case of the spec as the runner sees it: its data, and the variants of its dims."""

from __future__ import annotations

from dataclasses import dataclass, field


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

    def where(self) -> str:
        return f"{self.file}:{self.line}"


def in_profile(case: Case, profile: str) -> bool:
    """quick (the default run), long (only the long-sequence cases) or all."""
    return profile == "all" or case.profile == profile


def profile_counts(cases, profile: str = "quick") -> tuple[int, int]:
    """(cases, tests per backend) of a profile: what list, validate and certify print."""
    chosen = [c for c in cases if in_profile(c, profile)]
    return len(chosen), sum(len(c.variants) * len(c.dtypes) for c in chosen)


def test_name(case: Case, variant: Variant, dtype: str) -> str:
    """A test's name in its case file: ``case-id[variant-dtype]`` (``case-id[dtype]``
    for a case without variants); its id is ``topic/`` and that."""
    label = f"{variant.label}-{dtype}" if variant.label else dtype
    return f"{case.id}[{label}]"
