"""Golden data for other projects: the Python API, and the exported npz / JSON files."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from _cli_support import make_spec, run
from attention_conformance.backends.numpy import NumpyBackend
from attention_conformance.api import CaseNotFound, list_cases, load_case


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_spec(tmp_path_factory.mktemp("tiny"))


# --- the API --------------------------------------------------------------------------

def test_load_a_case_by_id_and_check_an_implementation():
    case = load_case("unnormalised-scores-softmax")
    assert case.op == "softmax" and case.outputs == ("out",) and case.params == {}
    assert "unnormalised-scores-softmax" in list_cases("worked_examples")
    x = case.inputs("float16")["x"]
    assert x.dtype == np.float16
    expected, tolerance = case.expected("float16"), case.tolerance("float16")
    assert expected["out"].dtype == np.float64 and tolerance["out"] > 0
    assert np.isclose(expected["out"].sum(), 1.0)
    mine = NumpyBackend().softmax(x)
    assert case.check(mine, "float16")["out"] <= 1
    with pytest.raises(AssertionError, match="exceeds the tolerance"):
        case.check(mine + np.float16(0.01), "float16")
    assert case.inputs("bfloat16")["x"].dtype == ml_dtypes.bfloat16
    with pytest.raises(CaseNotFound):
        load_case("no-such-case")


def test_variants_arguments_and_policies(tiny):
    case = load_case("tiny-sdpa-default-scale", spec_dir=tiny)
    assert case.variants == ("L3-D4", "L5-D8")
    with pytest.raises(ValueError, match="L3-D4"):
        case.inputs("float32")
    args, kwargs = case.arguments("float32", variant="L5-D8")
    assert [a.shape for a in args] == [(2, 5, 8)] * 3 and kwargs["mask"].dtype == bool
    out = NumpyBackend().sdpa(*args, **kwargs)
    case.check({"out": out}, "float32", variant="L5-D8")

    empty = load_case("tiny-empty-row", spec_dir=tiny)
    assert empty.params == {"scale": 0.5}
    assert empty.policies == ("fully_masked_rows=zeros", "fully_masked_rows=uniform",
                              "fully_masked_rows=nan")
    with pytest.raises(LookupError, match="fully_masked_rows=zeros"):
        empty.expected("float64")
    v = empty.inputs("float64")["v"]
    uniform = empty.expected("float64", policy="fully_masked_rows=uniform")["out"]
    np.testing.assert_allclose(uniform[1], v.mean(axis=0))
    assert np.isnan(empty.expected("float64", policy="fully_masked_rows=nan")["out"][1]).all()


# --- exported files -------------------------------------------------------------------

def _npz_groups(path):
    with np.load(path) as f:
        groups = {}
        for key in f.files:
            group, _, name = key.partition("/")
            groups.setdefault(group, {})[name] = f[key]
    return groups


def test_npz_export_holds_what_a_backend_is_checked_against(tiny, tmp_path, capsys):
    out = tmp_path / "golden"
    result = run(capsys, "--spec-dir", tiny, "export", out)
    assert result.returncode == 0, result.stderr
    assert "exported 5 cases (18 npz files)" in result.stdout
    assert "export: 5/5 cases" in result.stderr                 # progress
    index = json.loads((out / "index.json").read_text())
    assert index["format"] == "attention-conformance-golden/1"
    assert (out / "README.md").exists()
    backend = NumpyBackend()
    checked = 0
    for case in index["cases"]:
        for entry in case["entries"]:
            data = _npz_groups(out / entry["file"])
            inputs = data["inputs"]
            if entry["dtype"] == "bfloat16":              # stored as float32, exactly
                for name, array in inputs.items():
                    if array.dtype != bool:
                        assert array.dtype == np.float32
                        assert np.array_equal(array.astype(ml_dtypes.bfloat16).astype(np.float32), array)
                        inputs[name] = array.astype(ml_dtypes.bfloat16)
            else:
                assert all(a.dtype in (bool, np.dtype(entry["dtype"])) for a in inputs.values())
            args = [inputs.pop(name) for name in case["positional"]]
            got = np.asarray(getattr(backend, case["op"])(*args, **inputs, **case["params"]),
                             dtype=np.float64)
            prefix = "" if case["golden"] and entry["expected"][0]["policy"] is None \
                else "fully_masked_rows=zeros/"
            gold, tol = data["expected"][prefix + "out"], float(data["tolerance"][prefix + "out"])
            assert np.all(np.abs(got - gold) <= tol), (case["id"], entry["file"])
            assert entry["expected"][0]["outputs"]["out"]["tolerance"] == pytest.approx(tol)
            checked += 1
    assert checked == 18
    empty = next(c for c in index["cases"] if c["id"] == "tiny-empty-row")
    assert [e["policy"] for e in empty["entries"][0]["expected"]] == [
        "fully_masked_rows=zeros", "fully_masked_rows=uniform", "fully_masked_rows=nan"]


def _strict(text):
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def _decode(array):
    def number(x):
        return {"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}.get(x, x) \
            if isinstance(x, str) else x
    data = np.vectorize(number, otypes=[float])(np.array(array["data"], dtype=object)) \
        if array["dtype"] != "bool" else np.array(array["data"], dtype=bool)
    return data.reshape(array["shape"])


def test_json_export_is_plain_json_with_the_same_content(tiny, tmp_path, capsys):
    assert run(capsys, "--spec-dir", tiny, "export", tmp_path / "n",
               "--case", "tiny-empty-row", "--case", "tiny-softmax").returncode == 0
    assert run(capsys, "--spec-dir", tiny, "export", tmp_path / "j", "--format", "json",
               "--case", "tiny-empty-row", "--case", "tiny-softmax").returncode == 0
    index = _strict((tmp_path / "j" / "index.json").read_text())
    files = [e["file"] for c in index["cases"] for e in c["entries"]]
    assert len(files) == 6 and all(f.endswith(".json") for f in files)
    for name in files:
        doc = _strict((tmp_path / "j" / name).read_text())
        npz = _npz_groups(tmp_path / "n" / name.replace(".json", ".npz"))
        for group in ("inputs", "expected"):
            for key, array in doc[group].items():
                np.testing.assert_array_equal(_decode(array), npz[group][key])
        for key, value in doc["tolerance"].items():
            assert value == float(npz["tolerance"][key])
    nan_row = _strict((tmp_path / "j" / "tiny" / "tiny-empty-row" / "float64.json").read_text())
    assert nan_row["expected"]["fully_masked_rows=nan/out"]["data"][1] == ["NaN", "NaN"]


_BLOCKER = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "attention_conformance":
            raise ImportError(f"{name} is not available to this project")
sys.meta_path.insert(0, Block())
"""


def test_the_export_readme_loader_needs_only_numpy(tmp_path, capsys):
    assert run(capsys, "export", tmp_path / "golden", "--case",
               "unnormalised-scores-softmax").returncode == 0
    readme = (tmp_path / "golden" / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    script = tmp_path / "load.py"
    script.write_text(_BLOCKER + code + "\nimport attention_conformance\n")
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr
    assert "attention_conformance is not available" in result.stderr   # it really was blocked


def test_export_refuses_an_unknown_case(tmp_path, capsys):
    result = run(capsys, "export", tmp_path / "x", "--case", "no-such-case")
    assert result.returncode == 2 and "no-such-case" in result.stderr
