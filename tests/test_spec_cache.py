"""The spec cache: clean files come back identical, problems are never cached."""

import json

import pytest

from attention_conformance import spec_cache
from attention_conformance.spec_folder import default_folder
from attention_conformance.spec_loader import load_spec

CASES_DIR = default_folder().cases_dir

GOOD = """\
topic: tiny
cases:
  - id: tiny-softmax
    description: a softmax row sums to one
    source: tests/test_spec_cache.py
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


def test_off_disables_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTENTION_CONFORMANCE_CACHE", "off")
    assert spec_cache.cache_dir() is None
    assert load_spec(cases_dir(tmp_path, GOOD), cache=True).cases
