"""Faulty adapters (tests/faulty/): every fault is a failing case with a precise message.

Each run certifies one faulty adapter through the pytest plugin on two worked examples:
the sdpa cases, where the adapter misbehaves, fail with the exact reason, and the
attention_weights cases after them still run and pass, so a bad case never stops the
run. An adapter that cannot even be imported is one usage error, not one per case.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAULTY = ROOT / "tests" / "faulty"
SDPA = "worked_examples/wo-ai-zhong-guo-cross-attention"
SELECT = "wo-ai-zhong-guo-cross-attention or wo-ai-zhong-guo-weights"
BOTH_DTYPES = ("--dtype", "float32", "--dtype", "float64")

#: adapter -> (failed, passed, text every failure report shows, run options)
FAULTS = {
    "raises.py:Raises": (4, 2, "the backend raised RuntimeError: CUDA error: an illegal "
                               "memory access was encountered", BOTH_DTYPES),
    "wrong_shape.py:WrongShape": (4, 2, "output out has shape (2, ", BOTH_DTYPES),
    "wrong_dtype.py:WrongDtype": (2, 4, "output out has dtype float64, expected float32",
                                  BOTH_DTYPES),
    "nan_output.py:NanOutput": (4, 2, "golden out: NaN pattern differs at [0, 0]",
                                BOTH_DTYPES),
    "inf_output.py:InfOutput": (4, 2, "golden out: inf pattern differs at [2, ", BOTH_DTYPES),
    "framework_tensor.py:FrameworkTensor": (
        4, 2, "output out is a torch.Tensor, not a NumPy array (convert it back in the adapter)",
        BOTH_DTYPES),
    "plain_list.py:PlainList": (4, 2, "output out is a builtins.list, not a NumPy array",
                                BOTH_DTYPES),
    "writes_input.py:WritesInput": (4, 2, "the backend wrote into its input array 'q' "
                                          "(first change at [0, 0]: ", BOTH_DTYPES),
    "hangs.py:Hangs": (2, 1, "the backend did not finish this test's calls within 0.5 s (--case-timeout",
                       ("--dtype", "float64", "--case-timeout", "0.5")),
}


@pytest.fixture
def certify(pytester, worked_examples_spec):
    """Certify an adapter in-process on the worked examples (a spec of them alone)."""
    def run(adapter, *options):
        return pytester.runpytest_inprocess(
            str(worked_examples_spec), "--spec-dir", str(worked_examples_spec),
            "--backend", str(FAULTY / adapter), "-k", SELECT,
            "-p", "no:cacheprovider", "-p", "no:hypothesispytest", *options)
    return run


@pytest.mark.parametrize("adapter", FAULTS)
def test_fault_fails_its_cases_precisely_and_the_run_goes_on(certify, adapter):
    failed, passed, reason, options = FAULTS[adapter]
    result = certify(adapter, *options)
    result.assert_outcomes(failed=failed, passed=passed)
    output = result.stdout.str()
    name = f"faulty-{adapter.split('.')[0].replace('_', '-')}"
    dtype = options[1]
    assert f"{SDPA}[Lq3-Lk4-D64-{dtype}] on backend {name!r}, dtype {dtype}" in output
    assert "op:     sdpa; inputs: q (3, 64), k (4, 64), v (4, 64)" in output
    # once in each failure's report, once in the run's one line per failing test
    assert output.count(reason) == 2 * failed, output[-4000:]
    summary = output[output.index("attention-conformance: backend"):]
    assert len(re.findall(rf"^  (FAIL|TIMEOUT|CRASH) {re.escape(SDPA)}\[", summary, re.M)) == failed


def test_wrong_shape_names_both_shapes(certify):
    output = certify("wrong_shape.py:WrongShape", "--dtype", "float32").stdout.str()
    assert "output out has shape (2, 64), expected (3, 64)" in output
    assert "output out has shape (2, 8), expected (3, 8)" in output


def test_adapter_that_fails_to_import_is_one_usage_error(certify):
    result = certify("import_fails.py:ImportFails")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = result.stderr.str()
    assert errors.count("ERROR") == 1, errors
    assert (f"ERROR: backend '{FAULTY / 'import_fails.py'}:ImportFails' failed to load: "
            "ModuleNotFoundError: No module named 'attention_framework_that_is_not_installed'"
            " (is its framework installed?)") in errors
    assert "Traceback" not in errors + result.stdout.str()
    assert "passed" not in result.stdout.str() and "failed" not in result.stdout.str()
