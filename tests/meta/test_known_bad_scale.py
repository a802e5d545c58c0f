"""Known-bad adapters of the scale profile (tests/known_bad/scale/): each is the NumPy
backend, exact but for one bug that only sizes past 65,535 reach (a 16-bit query
position, keys past 65,535 never read, batch x head slices past 65,535 never written,
dk and dv of keys past 65,535 never written),
so it passes the quick profile and fails `--profile scale`.

The fast part runs each bug on the scale case that reaches it, and the correct NumPy
backend on the same cases, in seconds. The slow part (marked `scale`, skipped unless
asked for: `pytest -m scale tests/meta/test_known_bad_scale.py`, or `tox -e scale`)
runs each bug on the whole quick profile, which it must pass, and on the whole scale
profile, which must catch it."""

import sys
from pathlib import Path

import pytest

from attention_conformance.backends.numpy import NumpyBackend
from attention_conformance.golden.store import GoldenStore
from attention_conformance.model.folder import default_folder
from attention_conformance.specs.loader import load_file

ROOT = Path(__file__).resolve().parents[2]
SCALE_BAD = ROOT / "tests" / "known_bad" / "scale"
sys.path.append(str(ROOT / "tests" / "known_bad"))

from _harness import first_catch, load_bug, outcome, quick_items  # noqa: E402
from _real_spec import real_spec  # noqa: E402

#: bug -> the scale case that reaches it (its one test)
CATCHING = {
    "query_position_16bit": "scale-query-past-65536-causal",
    "keys_past_65535_unread": "scale-keys-past-65536-late-weight",
    "batch_heads_past_65535_unwritten": "scale-batch-heads-65544",
    "vjp_keys_past_65535_unwritten": "scale-vjp-keys-past-65536",
}


def scale_bug_files() -> list[Path]:
    return sorted(SCALE_BAD.glob("[!_]*.py"))


@pytest.fixture(scope="module")
def scale_cases() -> dict:
    cases, errors = load_file(default_folder().cases_dir / "scale.yaml")
    assert not errors, errors
    return {case.id: case for case in cases}


@pytest.fixture(scope="module")
def golden():
    return GoldenStore()


def _only_test(case):
    [variant], [dtype] = case.variants, case.dtypes
    return case, variant, dtype


def test_every_scale_bug_has_the_case_that_reaches_it():
    assert sorted(p.stem for p in scale_bug_files()) == sorted(CATCHING)


@pytest.mark.parametrize("path", scale_bug_files(), ids=lambda p: p.stem)
def test_a_scale_bug_fails_the_case_that_reaches_it(path, scale_cases, golden):
    message = outcome(load_bug(path), *_only_test(scale_cases[CATCHING[path.stem]]), golden)
    assert message, f"{path.stem} passes {CATCHING[path.stem]}"
    assert "golden " in message and "the backend raised" not in message, message
    if path.stem == "query_position_16bit":       # a row past 65,535, named in the rows
        assert "sampled query rows of 65,664" in message, message
    if path.stem == "vjp_keys_past_65535_unwritten":   # a key past 65,535, named too
        assert "golden dk" in message and "sampled key columns of 69,632" in message, message


def test_the_correct_numpy_backend_passes_the_cases_that_catch_them(scale_cases, golden):
    for case_id in CATCHING.values():
        assert outcome(NumpyBackend(), *_only_test(scale_cases[case_id]), golden) is None, case_id


@pytest.mark.scale
@pytest.mark.parametrize("path", scale_bug_files(), ids=lambda p: p.stem)
def test_a_scale_bug_passes_the_quick_profile(path, golden):
    found = first_catch(load_bug(path), quick_items(real_spec()), golden)
    assert found is None, f"{path.stem} fails the quick case {found}"


@pytest.mark.scale
@pytest.mark.parametrize("path", scale_bug_files(), ids=lambda p: p.stem)
def test_a_scale_bug_fails_the_scale_profile(path, scale_cases, golden):
    items = [(c, v, d) for c in scale_cases.values() for v in c.variants for d in c.dtypes]
    assert first_catch(load_bug(path), items, golden) is not None, path.stem


@pytest.mark.scale
def test_16bit_block_ids_fail_the_paged_decode_at_scale(scale_cases, golden):
    """block_table_16bit_ids (tests/known_bad/, caught in the quick profile by
    paged-block-ids-above-65535) fails the scale profile's decode over 262,144 paged keys,
    block ids up to 81,916, which the correct NumPy backend passes."""
    case = _only_test(scale_cases["scale-paged-decode-262144"])
    assert outcome(NumpyBackend(), *case, golden) is None
    message = outcome(load_bug(ROOT / "tests" / "known_bad" / "block_table_16bit_ids.py"),
                      *case, golden)
    assert message and "golden out" in message, message
