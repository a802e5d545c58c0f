"""The spec cache: clean files come back identical, problems are never cached.

The spec cache is really used: a second load reads every file back from it, without
parsing or validating anything, and what it reads equals a fresh validation field by field.

The first tests prove that the cache never serves a stale or a bad file; the later ones
that it serves at all (with spec_cache.read returning None, they fail), and that the
commands the README says read it do, and `validate` does not.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

from _cli_support import cli as cli_process
from attention_conformance import api, cli
from attention_conformance.golden.inputs import build_inputs
from attention_conformance.model.case import Case
from attention_conformance.model.folder import default_folder
from attention_conformance.specs import cache as spec_cache, loader as spec_loader
from attention_conformance.specs.loader import load_spec

CASES_DIR = default_folder().cases_dir

GOOD = """\
topic: tiny
cases:
  - id: tiny-softmax
    description: a softmax row sums to one
    source: tests/spec/test_spec_cache.py
    op: softmax
    inputs:
      x: {normal: {shape: [2, 5], seed: 3}, set: [{at: "[0, 1]", value: .nan}]}
    dtypes: [float32]
    expect: {golden: true, properties: [finite]}
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("ATTENTION_CONFORMANCE_CACHE", str(folder))
    return folder


def cases_dir(tmp_path, text):
    folder = tmp_path / "spec" / "cases"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny.yaml").write_text(text)
    return folder


def test_a_cached_spec_equals_the_validated_one(cache):
    fresh = load_spec(CASES_DIR, cache=True)      # validates and fills the cache
    cached = load_spec(CASES_DIR, cache=True)     # reads every file back
    assert not fresh.errors and len(list(cache.glob("*.json"))) == len(list(CASES_DIR.glob("*.yaml")))
    assert [repr(c) for c in cached.cases] == [repr(c) for c in fresh.cases]   # NaN-safe


def test_nan_survives_the_cache(cache, tmp_path):
    folder = cases_dir(tmp_path, GOOD)
    first = load_spec(folder, cache=True).cases
    again = load_spec(folder, cache=True).cases
    assert len(list(cache.glob("*.json"))) == 1
    value = again[0].inputs["x"]["set"][0]["value"]
    assert value != value and first[0].id == again[0].id


def test_a_file_with_a_problem_is_never_cached(cache, tmp_path):
    folder = cases_dir(tmp_path, GOOD.replace("op: softmax", "op: softmaxx"))
    for _ in range(2):
        [error] = load_spec(folder, cache=True).errors
        assert "tiny.yaml" in error.file and error.case_id == "tiny-softmax"
    assert not list(cache.glob("*.json"))


def test_an_edited_file_is_validated_again(cache, tmp_path):
    folder = cases_dir(tmp_path, GOOD)
    load_spec(folder, cache=True)
    cases_dir(tmp_path, GOOD.replace("seed: 3}", "seed: 3}, colour: red"))
    [error] = load_spec(folder, cache=True).errors
    assert "colour" in error.message


def test_a_tampered_entry_is_a_miss_not_code(cache, tmp_path):
    folder = cases_dir(tmp_path, GOOD)
    load_spec(folder, cache=True)
    [entry] = cache.glob("*.json")
    entry.write_text(json.dumps({"format": "something else"}))
    assert [c.id for c in load_spec(folder, cache=True).cases] == ["tiny-softmax"]


def test_a_value_json_cannot_keep_bit_for_bit_is_never_cached(cache):
    signed_nan = -np.float64(np.nan).item()          # what PyYAML's .nan is on x86
    spec_cache.write("k" * 64, "tiny", [(3, {"id": "x", "value": signed_nan})])
    assert not list(cache.glob("*.json"))
    spec_cache.write("k" * 64, "tiny", [(3, {"id": "x", "value": float("nan")})])
    assert list(cache.glob("*.json"))


def test_off_disables_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTENTION_CONFORMANCE_CACHE", "off")
    assert spec_cache.cache_dir() is None
    assert load_spec(cases_dir(tmp_path, GOOD), cache=True).cases


SPEC_CASES = default_folder().cases_dir
#: topics of the real spec copied for these tests: inline values, NaN and inf, policies
TOPICS = ("worked_examples", "policies", "score_functions")

#: every field of a Case that a run reads (raw is kept for the cache itself)
FIELDS = [f.name for f in dataclasses.fields(Case) if f.name != "raw"]


@pytest.fixture
def spec_cases(tmp_path):
    """A folder of a few of the spec's own case files (the whole spec takes seconds)."""
    folder = tmp_path / "copy" / "cases"
    folder.mkdir(parents=True)
    for topic in TOPICS:
        shutil.copy(SPEC_CASES / f"{topic}.yaml", folder)
    return folder


@pytest.fixture
def counted(monkeypatch):
    """Counts of the loader's steps: files parsed, cases validated, cache reads and hits."""
    counts = {"load_file": 0, "static_errors": 0, "read": 0, "hits": 0}
    real = {name: getattr(spec_loader, name) for name in ("load_file", "static_errors")}
    real_read = spec_cache.read

    def counting(name):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return real[name](*args, **kwargs)
        return wrapper

    def read(key):
        counts["read"] += 1
        found = real_read(key)
        counts["hits"] += found is not None
        return found

    for name in real:
        monkeypatch.setattr(spec_loader, name, counting(name))
    monkeypatch.setattr(spec_cache, "read", read)
    return counts


def same_case(a: Case, b: Case) -> list[str]:
    """The fields in which two cases differ (repr compares NaN with NaN)."""
    return [name for name in FIELDS if repr(getattr(a, name)) != repr(getattr(b, name))]


def test_a_second_load_validates_nothing(cache, counted, spec_cases):
    files = len(TOPICS)
    first = load_spec(spec_cases, cache=True)
    assert not first.errors
    assert counted["load_file"] == files and counted["static_errors"] == len(first.cases)
    assert counted["hits"] == 0, "an empty cache cannot hit"
    assert len(list(cache.glob("*.json"))) == files, "every clean file is stored"
    for key in counted:
        counted[key] = 0
    again = load_spec(spec_cases, cache=True)
    assert counted["read"] == files and counted["hits"] == files, counted
    assert counted["load_file"] == 0 and counted["static_errors"] == 0, \
        f"a cached spec was parsed or validated again: {counted}"
    assert len(again.cases) == len(first.cases) and not again.errors


def test_the_cached_spec_equals_a_fresh_validation(cache, counted, spec_cases):
    load_spec(spec_cases, cache=True)                 # fills the cache
    cached = load_spec(spec_cases, cache=True)        # served by it
    assert counted["hits"] == len(TOPICS)
    fresh = load_spec(spec_cases)                     # no cache at all: validates in full
    assert fresh.cases and [c.id for c in cached.cases] == [c.id for c in fresh.cases]
    differing = {c.id: same_case(c, f) for c, f in zip(cached.cases, fresh.cases)
                 if same_case(c, f)}
    assert not differing, f"cached cases differ from validated ones in: {differing}"


def test_a_hit_keeps_nan_lines_and_topic(cache, counted, tmp_path):
    folder = cases_dir(tmp_path, GOOD)
    fresh = load_spec(folder).cases
    counted["static_errors"] = 0
    load_spec(folder, cache=True)
    [cached] = load_spec(folder, cache=True).cases
    assert counted["hits"] == 1 and counted["static_errors"] == 1   # the first load only
    assert not same_case(cached, fresh[0]), same_case(cached, fresh[0])
    value = cached.inputs["x"]["set"][0]["value"]
    assert value != value, "NaN came back as something else"
    assert (cached.topic, cached.line, cached.file) == (fresh[0].topic, fresh[0].line,
                                                         fresh[0].file)


def test_validate_never_reads_the_cache(cache, counted, spec_cases):
    load_spec(spec_cases, cache=True)
    counted["read"] = 0
    load_spec(spec_cases)                 # what `attention-conformance validate` does
    assert counted["read"] == 0 and counted["static_errors"] > 0


def _filled(cases, counted):
    load_spec(cases, cache=True)
    for key in counted:
        counted[key] = 0


@pytest.mark.parametrize("command, reads_the_cache", [
    (["list"], True), (["export", "{out}"], True), (["validate"], False),
    (["golden", "check"], False),
], ids=["list", "export", "validate", "golden"])
def test_list_and_export_read_the_cache_and_validate_and_golden_do_not(
        cache, counted, worked_examples_spec, tmp_path, capsys, command, reads_the_cache):
    _filled(worked_examples_spec, counted)
    argv = [a.format(out=tmp_path / "export") for a in command]
    assert cli.main(["--spec-dir", str(worked_examples_spec), *argv]) == 0
    capsys.readouterr()
    if reads_the_cache:
        assert counted["hits"] == 1 and counted["static_errors"] == 0, counted
    else:
        assert counted["read"] == 0 and counted["static_errors"] > 0, counted


def test_the_api_reads_the_cache(cache, counted, worked_examples_spec):
    api._spec.cache_clear()               # the API keeps a loaded folder for the process
    _filled(worked_examples_spec, counted)
    case = api.load_case("unnormalised-scores-softmax", spec_dir=worked_examples_spec)
    assert case.op == "softmax"
    assert counted["hits"] == 1 and counted["static_errors"] == 0, counted


def _nonfinite_cases(spec):
    """The cases whose inputs hold a NaN or an infinity somewhere in their YAML."""
    return [c for c in spec.cases if "nan" in repr(c.inputs) or "inf" in repr(c.inputs)]


def _input_bits(cases) -> dict:
    """(case, variant, input) -> the bytes of the input as generated (not the in-process
    memo of generated_inputs, whose key, repr(), is blind to a NaN's sign)."""
    return {(c.id, v.label, name): array.tobytes() for c in cases for v in c.variants
            for name, array in build_inputs(c.inputs, v.dims).items()}


def test_inputs_are_the_same_bits_with_a_cold_or_a_warm_cache(cache, counted):
    """PyYAML's NaN has the CPU's sign (set on x86), JSON's has it clear: a case whose
    inputs hold NaN gave the backend other bits on a cold cache than on a warm one."""
    cold = _nonfinite_cases(load_spec(CASES_DIR, cache=True))
    assert counted["hits"] == 0
    warm = _nonfinite_cases(load_spec(CASES_DIR, cache=True))
    assert counted["hits"] == counted["read"] // 2 > 0, counted
    assert len(cold) > 20 and [c.id for c in cold] == [c.id for c in warm]
    cold_bits, warm_bits = _input_bits(cold), _input_bits(warm)
    differing = sorted(k for k in cold_bits if cold_bits[k] != warm_bits[k])
    assert not differing, f"{len(differing)} inputs differ, e.g. {differing[:3]}"
    nan = np.float64(np.nan).tobytes()
    assert any(nan in bits for bits in cold_bits.values())


def test_two_exports_cold_and_warm_are_the_same_bytes(cache, tmp_path):
    """As a user runs them: each export in a fresh process, the first on an empty cache."""
    picked = [arg for c in _nonfinite_cases(load_spec(CASES_DIR)) for arg in ("--case", c.id)]
    files = {}
    for run in ("cold", "warm"):
        done = cli_process("export", tmp_path / run, *picked,
                           env={"ATTENTION_CONFORMANCE_CACHE": str(cache)})
        assert done.returncode == 0, done.stderr
        files[run] = {p.relative_to(tmp_path / run): p.read_bytes()
                      for p in sorted((tmp_path / run).rglob("*")) if p.is_file()}
        assert list(cache.glob("*.json")), "the cold export fills the cache"
    assert len(files["cold"]) > 100 and files["cold"].keys() == files["warm"].keys()
    differing = [str(p) for p in files["cold"] if files["cold"][p] != files["warm"][p]]
    assert not differing, f"{len(differing)} files differ, e.g. {differing[:3]}"
