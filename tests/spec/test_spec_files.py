"""The spec itself: every file valid, ids unique, the worked examples present, golden current."""

import re

import pytest

from _real_spec import real_spec
from attention_conformance.golden import freeze as golden_freeze, store as golden_store
from attention_conformance.model.folder import default_folder
from attention_conformance.model.ops import OPS
from attention_conformance.specs.exact import exact_problems

CASES_DIR = default_folder().cases_dir
GOLDEN_DIR = default_folder().golden_dir


@pytest.fixture(scope="module")
def spec():
    return real_spec()


def test_every_spec_file_is_valid(spec):
    assert not spec.errors, "\n".join(map(str, spec.errors))


def test_every_topic_matches_its_file_name(spec):
    for case in spec.cases:
        assert case.file.endswith(f"/{case.topic}.yaml"), case.where()


def test_spec_is_broad(spec):
    assert len(spec.cases) >= 60
    ops = {case.op for case in spec.cases}
    assert ops == set(OPS), set(OPS) - ops        # every op of the table has a case
    sinks = {case.op for case in spec.cases if "sink" in case.inputs}
    assert sinks == {op.name for op in OPS.values() if "sink" in op.inputs}


@pytest.mark.parametrize("example, pattern", [
    (1, r"I saw a saw"), (2, r"alpha"), (3, r"recipe|Q K\^T V"), (4, r"sqrt|std"),
    (5, r"SelfAttention"), (6, r"我是小狗"), (7, r"我爱中国"), (8, r"additive|bilinear"),
    (9, r"multi-head"),
])
def test_each_worked_example_has_cases(spec, example, pattern):
    sources = [c.source for c in spec.cases if c.topic == "worked_examples"]
    assert any(re.search(pattern, s) for s in sources), f"worked example {example} missing"


def test_case_descriptions_are_short_facts(spec):
    for case in spec.cases:
        assert len(case.description) <= 120 and not case.description.endswith("."), case.where()


def test_golden_manifest_lists_exactly_the_golden_files():
    listed = set(golden_store.read_manifest(GOLDEN_DIR))
    present = {p.name for p in GOLDEN_DIR.glob("*.npz")}
    assert listed == present
    for name, digest in golden_store.read_manifest(GOLDEN_DIR).items():
        assert golden_store.sha256(GOLDEN_DIR / name) == digest, name


def test_golden_data_match_the_reference(spec):
    problems = golden_freeze.check(spec.cases, GOLDEN_DIR)
    assert not problems, "\n".join(problems[:20])


def test_exact_values_are_the_references(spec):
    """Every quick case's exact values hold for the float64 reference, by the checker's
    rule (what golden regenerate and golden check require)."""
    problems = exact_problems(spec.cases, default_folder().tolerances)
    assert not problems, "\n".join(map(str, problems[:20]))


def test_coverage_table_names_only_existing_cases(spec):
    text = (CASES_DIR.parent / "README.md").read_text()
    ids = {f"{c.topic}/{c.id}" for c in spec.cases}
    for ref in re.findall(r"`([a-z_]+/[a-z0-9*.-]+)`", text):
        pattern = re.compile(re.escape(ref).replace(r"\*", ".*") + "$")
        assert any(pattern.match(i) for i in ids), f"spec/README.md names {ref}, which matches no case"
