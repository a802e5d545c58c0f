"""The spec cache: clean files come back identical, problems are never cached.

The spec cache is really used: a second load reads every file back from it, without
parsing or validating anything, and what it reads equals a fresh validation field by field.

The first tests prove that the cache never serves a stale or a bad file; the later ones
that it serves at all (with spec_cache.read returning None, they fail), and that the
commands the README says read it do, and `validate` does not.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import secrets
import shutil

import numpy as np
import pytest

from _cli_support import cli as cli_process
from attention_conformance import api, cli
from attention_conformance.golden.inputs import build_inputs
from attention_conformance.model import case as case_model
from attention_conformance.model.case import Case, memo
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
    monkeypatch.setenv(spec_cache.KEY_ENV, str(tmp_path / "config" / "cache-key"))
    return folder


def cases_dir(tmp_path, text):
    folder = tmp_path / "spec" / "cases"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny.yaml").write_text(text)
    return folder


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


def test_an_edited_case_works_out_its_input_dtypes_again(cache, tmp_path):
    """What the checks work out once per case (model/case.py memo) is the case object's
    own: the cache stores none of it, and a case read again (from the cache or from its
    edited file) is a new object, which works it out anew."""
    folder = cases_dir(tmp_path, GOOD)
    first = load_spec(folder, cache=True).cases[0]
    assert dict(first.input_dtypes("float32")) == {"x": "float32"}
    stored = [p.read_bytes() for p in cache.glob("*.json")]
    assert b"input_dtypes" not in b"".join(stored)
    warm = load_spec(folder, cache=True).cases[0]
    assert warm is not first and memo(warm, "probe", lambda: "warm") == "warm"
    assert memo(first, "probe", lambda: "first") == "first"
    cases_dir(tmp_path, GOOD.replace("seed: 3}", "seed: 3}, passed_as: float64"))
    edited = load_spec(folder, cache=True).cases[0]
    assert dict(edited.input_dtypes("float32")) == {"x": "float64"}
    assert memo(edited, "probe", lambda: "edited") == "edited"


def test_a_case_memo_is_its_objects_alone_read_only_and_goes_with_it(spec_cases):
    case = next(c for c in load_spec(spec_cases).cases if len(c.inputs) > 1)
    dtypes = case.input_dtypes("float16")
    assert case.input_dtypes("float16") is dtypes
    with pytest.raises(TypeError):
        dtypes["q"] = "float64"                 # read-only: no caller changes another's
    name = next(iter(case.inputs))
    other = type(case)(**{**case.__dict__, "inputs": {name: {**case.inputs[name],
                                                             "passed_as": "float64"}}})
    assert dict(other.input_dtypes("float16")) == {name: "float64"}
    assert case.input_dtypes("float16") is dtypes and len(dtypes) == len(case.inputs)
    memos = len(case_model._MEMOS)
    del other
    gc.collect()
    assert len(case_model._MEMOS) == memos - 1


def _forge(entry: dict) -> dict:
    for case in entry["cases"]:
        case["data"]["expect"] = {"properties": ["finite"]}
    return entry


def _huge_input(entry: dict) -> dict:
    entry["cases"][0]["data"]["inputs"]["x"]["normal"]["shape"] = [100000, 100000]
    return entry


#: what is done to a cache entry -> (its new text from the stored entry, signed with: None
#: (the MAC line kept as it was), "other" (another user's key: a cache restored in CI from
#: an untrusted job) or "own" (this user's key: what the checks behind the MAC catch))
TAMPERED = {
    "forged_expectation": (lambda e: json.dumps(_forge(e)), None),
    "forged_expectation_other_key": (lambda e: json.dumps(_forge(e)), "other"),
    "other_format": (lambda e: json.dumps({"format": "something else"}), None),
    "not_json": (lambda e: "{not json", "own"),
    "no_cases_signed": (lambda e: json.dumps({k: v for k, v in e.items() if k != "cases"}), "own"),
    "cases_not_a_list_signed": (lambda e: json.dumps({**e, "cases": {"0": 1}}), "own"),
    "case_without_data_signed": (lambda e: json.dumps({**e, "cases": [{"line": 3}]}), "own"),
    "input_of_1e10_elements_signed": (lambda e: json.dumps(_huge_input(e)), "own"),
}


def _rewrite(path, make_text, signer=None) -> None:
    """An entry's stored JSON rewritten; its MAC line (if any) kept, or made anew."""
    mac, _, stored = path.read_bytes().rpartition(b"\n")
    text = make_text(json.loads(stored)).encode()
    if signer is not None:
        secret = secrets.token_bytes(32) if signer == "other" else spec_cache._secret()
        mac = spec_cache._mac(secret, path.stem, text)
    path.write_bytes(mac + b"\n" + text if mac else text)


@pytest.mark.parametrize("how", TAMPERED)
def test_a_tampered_entry_is_a_miss_validated_again(cache, counted, tmp_path, how):
    """Never an error, never code, never the tampered data: the file validates in full."""
    folder = cases_dir(tmp_path, GOOD)
    fresh = load_spec(folder).cases
    load_spec(folder, cache=True)
    [entry] = cache.glob("*.json")
    _rewrite(entry, *TAMPERED[how])
    counted["load_file"] = 0
    spec = load_spec(folder, cache=True)
    assert counted["load_file"] == 1, "the file was not validated again"
    assert not spec.errors and len(spec.cases) == 1 and not same_case(spec.cases[0], fresh[0])
    assert spec.cases[0].expect == {"golden": True, "properties": ["finite"]}


def test_the_probe_forged_sdpa_expectations_are_not_used(cache, counted, worked_examples_spec):
    """The probe: four worked-example sdpa cases edited to expect only finite outputs
    (a backend returning zeros went from 28 failures to 148 passes)."""
    fresh = {c.id: c for c in load_spec(worked_examples_spec).cases}
    load_spec(worked_examples_spec, cache=True)
    counted["load_file"] = 0
    [entry] = cache.glob("*.json")
    forged = []

    def forge(stored):
        forged.extend([c["data"]["id"] for c in stored["cases"] if c["data"]["op"] == "sdpa"][:4])
        for case in stored["cases"]:
            if case["data"]["id"] in forged:
                case["data"]["expect"] = {"properties": ["finite"]}
        return json.dumps(stored)

    _rewrite(entry, forge)
    loaded = {c.id: c for c in load_spec(worked_examples_spec, cache=True).cases}
    assert len(forged) == 4 and counted["load_file"] == 1, "the file was not validated again"
    for case_id in forged:
        assert loaded[case_id].expect == fresh[case_id].expect != {"properties": ["finite"]}


def test_the_key_is_private_made_once_and_outside_the_cache(cache, tmp_path):
    folder = cases_dir(tmp_path, GOOD)
    load_spec(folder, cache=True)
    key = spec_cache.key_file()
    assert key.stat().st_mode & 0o777 == 0o600 and key.parent.stat().st_mode & 0o077 == 0
    assert cache not in key.parents and len(key.read_bytes()) == 64
    made = key.read_bytes()
    load_spec(folder, cache=True)
    assert key.read_bytes() == made and list(cache.glob("*.json"))


@pytest.mark.parametrize("key", ["readable_by_others", "a_link", "inside_the_cache"])
def test_an_untrusted_key_turns_the_cache_off(cache, counted, tmp_path, monkeypatch, key):
    """Nothing read, nothing written: every load validates in full, and still loads."""
    folder = cases_dir(tmp_path, GOOD)
    load_spec(folder, cache=True)                # a key and an entry, made
    path = spec_cache.key_file()
    if key == "readable_by_others":
        path.chmod(0o644)
    elif key == "a_link":
        path.rename(tmp_path / "moved-key")
        path.symlink_to(tmp_path / "moved-key")
    else:
        monkeypatch.setenv(spec_cache.KEY_ENV, str(cache / "keys" / "cache-key"))
    for entry in cache.glob("*.json"):
        entry.unlink()
    counted["load_file"] = 0
    assert [c.id for c in load_spec(folder, cache=True).cases] == ["tiny-softmax"]
    assert counted["hits"] == 0 and counted["load_file"] == 1
    assert not list(cache.glob("*.json"))


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


def test_a_cached_spec_equals_the_validated_one(cache):
    """The whole spec (here, after the tests of a few files: a mutant of the cache that
    they catch, run with -x, stops before these seconds of validation)."""
    fresh = load_spec(CASES_DIR, cache=True)      # validates and fills the cache
    cached = load_spec(CASES_DIR, cache=True)     # reads every file back
    assert not fresh.errors and len(list(cache.glob("*.json"))) == len(list(CASES_DIR.glob("*.yaml")))
    assert [repr(c) for c in cached.cases] == [repr(c) for c in fresh.cases]   # NaN-safe


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
