"""Fuzzing: drawn cases are valid spec cases; a known-bad adapter is caught, and the
failure it prints is a case that validates, fails that adapter and passes NumPy."""

from __future__ import annotations

import collections

import numpy as np
import pytest

pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402

from _cli_support import ROOT, adapter, cli, run  # noqa: E402
from attention_conformance.backends.numpy import NumpyBackend  # noqa: E402
from attention_conformance.cli import build_parser  # noqa: E402
from attention_conformance.fuzz import (FUZZED_OPS, case_strategy, fuzz, has_empty_rows,  # noqa: E402
                                        load_document)
from attention_conformance.model.dtypes import FP8_DTYPES, PLAIN_DTYPES  # noqa: E402
from attention_conformance.model.ops import takes_dtype  # noqa: E402
from attention_conformance.backend.resolve import load_backend  # noqa: E402
from attention_conformance.specs.loader import load_spec  # noqa: E402


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(doc=case_strategy())
def test_every_drawn_case_is_a_valid_spec_case(doc, tmp_path):
    case = load_document(doc, tmp_path)          # schema + static checks, or FuzzError
    assert case.id.startswith("fuzz-") and len(case.dtypes) == 1
    empty = has_empty_rows(doc["inputs"], doc.get("params", {}))
    assert ("policy" in case.expect) == empty


@settings(max_examples=25, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(doc=case_strategy(FUZZED_OPS, FP8_DTYPES + PLAIN_DTYPES[:1]))
def test_an_fp8_dtype_is_drawn_only_with_an_op_that_takes_it(doc, tmp_path):
    """The op table says which ops take an fp8 dtype (those with descale factors): the
    fuzzer pairs such a dtype with those only, and every op with the plain dtype."""
    case = load_document(doc, tmp_path)
    assert takes_dtype(case.op, case.dtypes[0]), (case.op, case.dtypes)


def test_an_fp8_dtype_fuzzes_the_ops_that_take_it_and_refuses_the_others(capsys):
    """`--dtype float8_e5m2` without --op draws sdpa only (it drew attention_weights and
    stopped on FuzzError); an --op that cannot take the dtype is a usage error in one line."""
    seen = collections.Counter()

    class Ops(NumpyBackend):
        def sdpa(self, q, k, v, **kw):
            seen[f"sdpa {q.dtype}"] += 1
            return super().sdpa(q, k, v, **kw)

    report = fuzz(Ops(), examples=8, dtypes=["float8_e5m2"])
    assert report.failure is None and report.passed == 8 and seen == {"sdpa float8_e5m2": 8}
    assert run(capsys, "fuzz", "numpy", "--dtype", "float8_e5m2", "--examples", "3",
               "-q").returncode == 0
    for dtypes in (["float8_e5m2"], ["float8_e5m2", "float32"]):
        refused = run(capsys, "fuzz", "numpy", "--op", "attention_weights",
                      *[w for d in dtypes for w in ("--dtype", d)])
        assert refused.returncode == 2 and refused.stdout == "", refused.stdout
        line, = refused.stderr.splitlines()
        assert "attention_weights" in line and "float8_e5m2" in line and "sdpa" in line, line


def test_the_op_help_and_the_docs_name_every_fuzzed_op():
    """--op's help lists its choices, not a count of them; so does docs/cli.md."""
    fuzz_parser = build_parser()._subparsers._group_actions[0].choices["fuzz"]
    op = next(a for a in fuzz_parser._actions if "--op" in a.option_strings)
    assert list(op.choices) == list(FUZZED_OPS)
    assert all(name in op.help for name in FUZZED_OPS) and "three" not in op.help
    page = (ROOT / "docs" / "cli.md").read_text()
    synopsis = page.split("attention-conformance fuzz BACKEND")[1].split("```")[0]
    assert "[--op " + "|".join(FUZZED_OPS) + "]..." in synopsis, synopsis
    fuzzing = page.split("## Fuzzing")[1].split("shapes")[0]
    assert all(f"`{name}`" in fuzzing for name in FUZZED_OPS), fuzzing


class Recorder(NumpyBackend):
    """The NumPy backend, noting what the fuzzer asks of it."""

    def __init__(self):
        super().__init__()
        self.seen = collections.Counter()

    def _note(self, op, q, k, kw):
        self.seen[op] += 1
        self.seen[f"dtype {q.dtype}"] += 1
        for name in ("mask", "bias", "softcap", "window"):
            if kw.get(name) is not None:
                self.seen[name] += 1
        self.seen[f"causal {kw.get('causal')}"] += 1
        self.seen["default scale" if kw.get("scale") is None else "scale"] += 1
        if q.ndim >= 3 and k.ndim >= 3 and k.shape[-3] not in (1, q.shape[-3]):
            self.seen["grouped-query"] += 1
        if q.shape[-2] != k.shape[-2]:
            self.seen["Lq != Lk"] += 1

    def sdpa(self, q, k, v, **kw):
        self._note("sdpa", q, k, kw)
        return super().sdpa(q, k, v, **kw)

    def attention_weights(self, q, k, **kw):
        self._note("attention_weights", q, k, kw)
        return super().attention_weights(q, k, **kw)

    def sdpa_vjp(self, q, k, v, d_out, **kw):
        self._note("sdpa_vjp", q, k, kw)
        return super().sdpa_vjp(q, k, v, d_out, **kw)


def test_numpy_passes_and_the_fuzzer_reaches_every_feature():
    backend = Recorder()
    report = fuzz(backend, examples=120, seed=3)
    assert report.failure is None, report.text()
    assert report.passed == report.tried == 120
    for feature in ("sdpa", "attention_weights", "sdpa_vjp", "mask", "bias", "softcap",
                    "window", "causal top_left", "causal bottom_right", "causal None",
                    "default scale", "scale", "grouped-query", "Lq != Lk",
                    "dtype float64", "dtype float32", "dtype float16", "dtype bfloat16"):
        assert backend.seen[feature], f"the fuzzer never drew {feature}: {backend.seen}"
    assert "no failure" in report.text()


def test_a_wrong_policy_is_found_with_a_policy_case():
    from cli_adapters import WrongEmptyRowPolicy

    report = fuzz(WrongEmptyRowPolicy(), examples=150, seed=0)
    assert report.failure, "the fuzzer missed rows with no allowed key"
    assert "fully_masked_rows=uniform" in report.failure.message
    assert "policy:\n      fully_masked_rows:" in report.failure.yaml


def test_fuzz_command_catches_a_wrong_default_scale_and_prints_a_pasteable_case(tmp_path):
    """The printed YAML validates as a spec case; with its golden data frozen, the bad
    adapter fails it under certify and the NumPy backend passes it."""
    bad = adapter("WrongDefaultScale")
    result = cli("fuzz", bad, "--examples", "100", "--seed", "0",
                 "--save", tmp_path / "saved" / "found.yaml")
    assert result.returncode == 1, result.stdout + result.stderr
    printed = result.stdout
    assert "fails this case" in printed and "golden out:" in printed
    assert "normal: {shape:" in printed and "values:" not in printed     # generators, seeds
    assert "fuzz: 10 cases tried" in result.stderr                        # progress

    cases = tmp_path / "spec" / "cases"
    cases.mkdir(parents=True)
    (cases / "pasted.yaml").write_text("topic: pasted\ncases:\n" + printed)   # as pasted
    spec = load_spec(cases)
    assert not spec.errors and len(spec.cases) == 1, spec.errors
    assert spec.cases[0].source.startswith("attention-conformance fuzz (backend bad-scale")
    assert cli("--spec-dir", cases, "validate").returncode == 0
    assert cli("--spec-dir", cases, "golden", "regenerate").returncode == 0
    failing = cli("--spec-dir", cases, "certify", bad, "-q")
    assert failing.returncode == 1 and "1 failed" in failing.stdout, failing.stdout
    passing = cli("--spec-dir", cases, "certify", "numpy", "-q")
    assert passing.returncode == 0 and "1 passed" in passing.stdout, passing.stdout

    saved = load_spec(tmp_path / "saved")                    # --save: a whole case file
    assert not saved.errors and saved.cases[0].topic == "found"


def test_command_options(capsys):
    result = run(capsys, "fuzz", "numpy", "--examples", "10", "--op", "attention_weights",
                 "--dtype", "float16", "-q")
    assert result.returncode == 0 and "10 cases tried (10 passed" in result.stdout
    assert result.stderr == ""
    assert run(capsys, "fuzz", "nope-backend").returncode == 2
    for examples, why in (("-5", "must be 1 or more, not -5"), ("0", "must be 1 or more, not 0"),
                          ("many", "not a whole number: 'many'")):
        refused = run(capsys, "fuzz", "numpy", "--examples", examples)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert refused.stderr.splitlines()[-1] == \
            f"attention-conformance fuzz: error: argument --examples: {why}"
    with pytest.raises(ValueError, match="declares none"):
        fuzz(_NoDtypes(), examples=1)
    with pytest.raises(ValueError, match="cannot fuzz"):
        fuzz(load_backend("numpy"), ops=["softmax"], examples=1)


class _NoDtypes(NumpyBackend):
    dtypes = frozenset()


def test_draws_are_deterministic():
    seen = []

    class Log(NumpyBackend):
        def sdpa(self, q, k, v, **kw):
            seen.append(float(np.sum(q)))
            return super().sdpa(q, k, v, **kw)

    fuzz(Log(), examples=10, seed=11, ops=["sdpa"])
    first, seen[:] = list(seen), []
    fuzz(Log(), examples=10, seed=11, ops=["sdpa"])
    assert first == seen
