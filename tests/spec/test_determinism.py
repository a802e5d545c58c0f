"""Determinism: inputs are bit-identical everywhere, and statistical cases cannot flake.

Inputs come from NumPy's legacy RandomState(seed), whose streams NumPy keeps unchanged
across versions (NEP 19). The sha256 of the inputs of the fixed cases in
tests/determinism/ was computed once and is frozen here: the same digest must come out
in this process, in a fresh process, and in two pytest-xdist workers; on another NumPy,
a changed stream would change it. Statistical cases are fixed by their seeds, so they
pass or fail the same way every run; and their bands are honest: the float64 reference
lies inside them for many other seeds too.
"""

import dataclasses
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from attention_conformance.golden import reference
from attention_conformance.backend.calling import cast_inputs
from attention_conformance.checking.verdict import case_inputs
from attention_conformance.golden.compute import rounded_inputs
from attention_conformance.model.ops import OPS
from attention_conformance.checking.statistics import STATISTICS

from _real_spec import real_spec

ROOT = Path(__file__).resolve().parents[2]
DETERMINISM = ROOT / "tests" / "determinism"
sys.path.append(str(DETERMINISM))

from determinism_checksum import inputs_checksum  # noqa: E402

#: sha256 of the inputs of tests/determinism/determinism.yaml, computed once (numpy 2.4.6;
#: again when every NaN of a spec file became the one NaN, sign clear, 2.4.6 too)
FROZEN_SHA256 = "0fd5a301b3bcbc560250d2fc12f47830651fedaf6b4ad4d7c4e378cec24e2602"
OTHER_SEEDS = 40


def test_inputs_match_the_frozen_checksum():
    assert inputs_checksum() == FROZEN_SHA256


def _bits(arrays: dict) -> dict:
    return {name: (a.dtype, a.shape, a.tobytes()) for name, a in arrays.items()}


def test_a_test_gets_the_rounded_inputs_and_their_cast_bit_for_bit():
    """case_inputs casts each input once and widens that (not rounded_inputs and then a
    second cast of its result): the same bits, in every dtype, fp8 and mixed included."""
    tests = [(c, v, d) for c in real_spec().cases if c.profile == "quick"
             for v in c.variants for d in c.dtypes]
    assert {"float8_e4m3fn", "float8_e5m2", "bfloat16"} <= {d for _, _, d in tests}
    for case, variant, dtype in tests:
        exact, arrays = case_inputs(case, variant, dtype)
        rounded = rounded_inputs(case, variant, dtype)
        assert _bits(exact) == _bits(rounded), case.id
        assert _bits(arrays) == _bits(cast_inputs(rounded, dtype, case.input_dtypes(dtype)))
        assert all(exact[n] is arrays[n] for n, a in exact.items() if a.dtype == bool)
        assert not any(exact[n] is arrays[n] for n, a in exact.items() if a.dtype != bool)


def test_legacy_random_state_streams_are_the_documented_ones():
    """The first draws of RandomState(0), unchanged since NumPy 1.0."""
    assert np.random.RandomState(0).standard_normal(3).tolist() == \
        [1.764052345967664, 0.4001572083672233, 0.9787379841057392]
    assert np.random.RandomState(0).random_sample(2).tolist() == \
        [0.5488135039273248, 0.7151893663724195]


def test_inputs_ignore_the_global_random_state():
    np.random.seed(12345)
    np.random.standard_normal(1000)
    assert inputs_checksum() == FROZEN_SHA256


def test_inputs_match_in_a_fresh_process():
    done = subprocess.run([sys.executable, str(DETERMINISM / "determinism_checksum.py")],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONHASHSEED": "977"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == FROZEN_SHA256


def test_inputs_match_in_two_xdist_workers(pytester, monkeypatch):
    pytest.importorskip("xdist")
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")   # only xdist: a faster start
    out = pytester.mkdir("digests")
    pytester.makepyfile(test_digest=f"""
        import os, sys
        sys.path.append({str(DETERMINISM)!r})
        from determinism_checksum import inputs_checksum

        def test_digest():
            worker = os.environ["PYTEST_XDIST_WORKER"]
            with open(os.path.join({str(out)!r}, worker), "w") as f:
                f.write(inputs_checksum())
    """)
    result = pytester.runpytest_subprocess("-p", "xdist", "-n", "2", "--dist", "each",
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    digests = {path.name: path.read_text() for path in out.iterdir()}
    assert sorted(digests) == ["gw0", "gw1"]
    assert set(digests.values()) == {FROZEN_SHA256}


# --- statistical cases ----------------------------------------------------------------

def statistic_cases():
    return [c for c in real_spec().cases if "statistic" in c.expect]


def _statistics(case, arrays):
    """name -> value of each statistic of the case, on the float64 reference output."""
    outputs = dict(zip(OPS[case.op].outputs_for(case.inputs), reference.run(case.op, arrays, case.params)))
    ctx = types.SimpleNamespace(outputs=outputs)
    return [(s, STATISTICS[s["name"]](ctx, s.get("output"))) for s in case.expect["statistic"]]


def _reseeded(value, shift):
    """A copy of an inputs mapping with every seed moved by `shift` (shared seeds stay shared)."""
    if isinstance(value, dict):
        return {k: (v + shift) % 2**32 if k == "seed" else _reseeded(v, shift)
                for k, v in value.items()}
    return value


def test_the_spec_has_statistic_cases():
    assert statistic_cases(), "spec/cases has no case with a statistic"


@pytest.mark.parametrize("case", statistic_cases(), ids=lambda c: c.id)
def test_statistic_is_fixed_by_the_seeds(case):
    """Inputs, hence outputs and statistics, repeat bit for bit: the case cannot flake."""
    for variant in case.variants:
        for dtype in case.dtypes:
            first, again = (rounded_inputs(case, variant, dtype) for _ in range(2))
            assert all(np.array_equal(first[n], again[n], equal_nan=True) for n in first)
            assert _statistics(case, first) == _statistics(case, again)


@pytest.mark.parametrize("case", statistic_cases(), ids=lambda c: c.id)
def test_statistic_band_holds_over_many_other_seeds(case):
    """The band is wide enough: the reference lies inside it for OTHER_SEEDS other seeds."""
    worst = 0.0
    for trial in range(1, OTHER_SEEDS + 1):
        moved = dataclasses.replace(case, inputs=_reseeded(case.inputs, 7919 * trial))
        for variant in case.variants:
            dtype = case.dtypes[trial % len(case.dtypes)]
            for stat, value in _statistics(moved, rounded_inputs(moved, variant, dtype)):
                deviation = abs(value - stat["expected"]) / stat["band"]
                assert deviation <= 1, (f"{case.id}: {stat['name']} = {value:.6g} with seeds moved"
                                        f" by {7919 * trial}, outside {stat['expected']} +/- "
                                        f"{stat['band']} ({stat['why']})")
                worst = max(worst, deviation)
    print(f"{case.id}: worst |statistic - expected| = {worst:.2f} x band over {OTHER_SEEDS} seeds")
