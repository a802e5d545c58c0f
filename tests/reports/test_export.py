"""Golden data for other projects: the Python API, and the exported npz / JSON files."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from _cli_support import ROOT, make_spec, run
from _real_spec import real_spec
from attention_conformance.api import CaseNotFound, list_cases, load_case
from attention_conformance.backends.numpy import NumpyBackend
from attention_conformance.cli import main as main_cli
from attention_conformance.export import README as reader_readme_text
from attention_conformance.export import TAGS, case_tags, reader_code
from attention_conformance.golden.compute import generated_inputs


def reader_readme():
    return reader_readme_text


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



def test_a_policy_is_a_dict_of_declared_choices(tiny):
    """policy= takes a dict (a backend's whole declaration picks the branch); without one,
    a policy-dependent case says which policy to give, and how."""
    empty = load_case("tiny-empty-row", spec_dir=tiny)
    declared = NumpyBackend().policy                    # fully_masked_rows: zeros, and more
    zeros = empty.expected("float64", policy=declared)["out"]
    assert (zeros[1] == 0).all()
    assert empty.tolerance("float64", policy={"fully_masked_rows": "nan"}) == \
        empty.tolerance("float64", policy="fully_masked_rows=nan")
    empty.check(NumpyBackend().sdpa(*empty.arguments("float64")[0], **empty.arguments(
        "float64")[1]), "float64", policy=declared)
    for missing in (None, {"masked_key_nan": "ignored"}):
        with pytest.raises(LookupError) as raised:
            empty.expected("float64", policy=missing)
        assert "depends on the declared policy fully_masked_rows: pass " \
               "policy={'fully_masked_rows': CHOICE}" in str(raised.value)

# --- exported files -------------------------------------------------------------------

def _npz_groups(path, only=None):
    """{group: {name: array}} of an exported npz file; only: read just that group."""
    with np.load(path) as f:
        groups = {}
        for key in f.files:
            group, _, name = key.partition("/")
            if only is None or group == only:
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

#: appended to the README's reader: check the outputs saved under argv[2] (one npz per
#: data file, at the same relative path) against the export argv[1], policy argv[3:]
_DRIVER = """
import sys
root, saved, policy = sys.argv[1], sys.argv[2], sys.argv[3:]


def saved_outputs(case, entry, inputs):
    with np.load(f"{saved}/{entry['file']}.npz") as f:
        return dict(f)


checked, failures = check(root, saved_outputs, policy)
print(json.dumps({"checked": checked, "failures": failures}))
try:
    import attention_conformance
except ImportError as exc:
    print(exc, file=sys.stderr)
"""


def _python_blocks(readme):
    return re.findall(r"```python\n(.*?)```", readme, re.S)


def _run_blocked(script, *args, cwd):
    """Run a script in a fresh Python where attention_conformance cannot be imported."""
    path = cwd / "reader.py"
    path.write_text(_BLOCKER + script)
    return subprocess.run([sys.executable, str(path), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


_NOT_NUMPY = {name: getattr(ml_dtypes, name) for name in ("bfloat16", "float8_e4m3fn",
                                                            "float8_e5m2")}


def _numpy_outputs(root, saved, index):
    """Run the NumPy backend on every exported input; save its outputs per data file."""
    backend = NumpyBackend()
    for case in index["cases"]:
        for entry in case["entries"]:
            data = _npz_groups(root / entry["file"], only="inputs")
            # bfloat16 and fp8 are stored as float32: cast back, as the export's README says
            inputs = {n: a.astype(_NOT_NUMPY.get(entry["inputs"][n]["dtype"], a.dtype))
                      for n, a in data.get("inputs", {}).items()}
            args = [inputs.pop(name) for name in case["positional"]]
            # a sharded case's golden is the whole call's: the sharding is how it is split
            params = {k: v for k, v in case["params"].items() if k != "sharding"}
            with np.errstate(all="ignore"):
                got = getattr(backend, case["op"])(*args, **inputs, **params)
            got = got if isinstance(got, tuple) else (got,)
            target = saved / f"{entry['file']}.npz"
            target.parent.mkdir(parents=True, exist_ok=True)
            np.savez(target, **{name: np.asarray(a, dtype=np.float64)
                                for name, a in zip(case["outputs"], got)})


def _policy(backend):
    return [f"{name}={choice}" for name, choice in sorted(backend.policy.items())]


def _run_reader(root, saved, policy, cwd):
    """(outputs checked, failures) of the README's reader run on saved outputs."""
    reader = reader_code((root / "README.md").read_text())
    result = _run_blocked(reader + _DRIVER, root, saved, *policy, cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert "attention_conformance is not available" in result.stderr      # really blocked
    found = json.loads(result.stdout)
    return found["checked"], found["failures"]


def _checked_branches(index, policy) -> int:
    return sum(len(b["outputs"]) for c in index["cases"] for e in c["entries"]
               for b in e["expected"] if b["policy"] is None or b["policy"] in policy)


def _perturb(saved: Path, entry_file: str, name: str, how) -> None:
    path = saved / f"{entry_file}.npz"
    with np.load(path) as f:
        arrays = dict(f)
    arrays[name] = how(arrays[name].copy())
    np.savez(path, **arrays)


def _first_with_nan(root, index, policy):
    """(entry, output key) of the first checked golden output that holds a NaN."""
    for case in index["cases"]:
        for entry in case["entries"]:
            for branch in entry["expected"]:
                if branch["policy"] in (None, *policy):
                    prefix = f"{branch['policy']}/" if branch["policy"] else ""
                    data = _npz_groups(root / entry["file"])["expected"]
                    for name in branch["outputs"]:
                        if np.isnan(data[prefix + name]).any():
                            return entry, prefix, name
    raise AssertionError("no golden output with a NaN")


def _wrong_outputs(root, index, saved) -> set[str]:
    """Make three saved outputs wrong: a number beyond the tolerance, a NaN where a
    number is expected, a number where NaN is expected; return what the reader should say."""
    plain = [e for c in index["cases"] for e in c["entries"]
             if e["expected"] and e["expected"][0]["policy"] is None]
    beyond, into_nan = plain[len(plain) // 3], plain[2 * len(plain) // 3]
    name = sorted(beyond["expected"][0]["outputs"])[0]
    tolerance = beyond["expected"][0]["outputs"][name]["tolerance"]
    _perturb(saved, beyond["file"], name, lambda a: a + 3 * tolerance + 1e-6)
    other = sorted(into_nan["expected"][0]["outputs"])[0]
    _perturb(saved, into_nan["file"], other, lambda a: np.where(a == a.flat[0], np.nan, a))
    nan_entry, prefix, nan_name = _first_with_nan(root, index, _policy(NumpyBackend()))
    _perturb(saved, nan_entry["file"], nan_name, lambda a: np.nan_to_num(a, nan=0.0))
    return {f"{beyond['file']}: {name}", f"{into_nan['file']}: {other}",
            f"{nan_entry['file']}: {prefix}{nan_name}"}


def _check_policy_only_cases(root, index, saved, tmp):
    """In some sdpa cases every golden output is a policy branch: the reader must pick
    the one the backend declares; another choice's branch fails, no choice checks nothing."""
    only_policy = [c for c in index["cases"] if c["op"] == "sdpa"
                   and not c["expect"].get("golden") and any(e["expected"] for e in c["entries"])]
    assert len(only_policy) >= 10
    assert all(b["policy"] for c in only_policy for e in c["entries"] for b in e["expected"])
    case = next(c for c in only_policy if {b["policy"] for b in c["entries"][0]["expected"]}
                >= {"fully_masked_rows=zeros", "fully_masked_rows=nan"})
    single = tmp / "single"
    assert main_cli(["export", str(single), "--case", case["id"]]) == 0
    policy = _policy(NumpyBackend())
    checked, failures = _run_reader(single, saved, policy, tmp)
    assert failures == [] and checked == _checked_branches(
        json.loads((single / "index.json").read_text()), policy) > 0
    other = [p if not p.startswith("fully_masked_rows=") else "fully_masked_rows=nan"
             for p in policy]
    _, failures = _run_reader(single, saved, other, tmp)
    assert failures and all(f.endswith(": fully_masked_rows=nan/out") for f in failures)
    assert _run_reader(single, saved, [], tmp)[0] == 0


def test_the_readme_reader_on_the_whole_quick_spec(tmp_path):
    """Export every quick case; the README's reader (NumPy only, the package blocked)
    passes the NumPy backend's outputs on every exported case, and fails wrong ones."""
    started = time.perf_counter()
    assert main_cli(["export", str(tmp_path / "golden")]) == 0
    exported = time.perf_counter() - started
    root, saved = tmp_path / "golden", tmp_path / "numpy"
    index = _assert_self_consistent(root)
    assert len(index["cases"]) == len([c for c in real_spec().cases
                                       if c.profile == "quick"])
    reader = _python_blocks((root / "README.md").read_text())[0]
    assert len(reader.strip().splitlines()) <= 30, "the README promises a reader of <= 30 lines"
    _numpy_outputs(root, saved, index)
    policy = _policy(NumpyBackend())
    # three outputs made wrong: one run shows that exactly those fail and every other passes
    wrong = _wrong_outputs(root, index, saved)
    started = time.perf_counter()
    checked, failures = _run_reader(root, saved, policy, tmp_path)
    seconds = time.perf_counter() - started
    entries = sum(len(c["entries"]) for c in index["cases"])
    assert set(failures) == wrong and len(failures) == len(wrong)
    assert checked == _checked_branches(index, policy) > entries
    print(f"\nreader: {len(index['cases'])} cases, {entries} files, {checked} outputs in "
          f"{seconds:.1f} s (export {exported:.1f} s)")
    _check_policy_only_cases(root, index, saved, tmp_path)


def test_the_readme_usage_example_runs_on_a_json_export(tmp_path, capsys):
    """The README's second block (a NumPy softmax over the softmax cases) on a JSON
    export, through the same reader, with the package unimportable."""
    assert run(capsys, "export", tmp_path / "j", "--format", "json",
               "--op", "softmax").returncode == 0
    readme = (tmp_path / "j" / "README.md").read_text()
    reader, usage = _python_blocks(readme)[:2]
    result = _run_blocked(reader + usage, cwd=tmp_path / "j")
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    checked = int(first.split()[0])
    softmax = sum(len(c["entries"]) for c in _strict(
        (tmp_path / "j" / "index.json").read_text())["cases"])
    assert first == f"{checked} outputs checked, 0 failures" and checked == softmax > 0


# --- the target folder ----------------------------------------------------------------

def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def _assert_self_consistent(root: Path) -> dict:
    """The index lists exactly the files there, with their sha256; entries point at them."""
    index = json.loads((root / "index.json").read_text())
    assert _files(root) == set(index["files"]) | {"index.json"}
    data = {e["file"] for c in index["cases"] for e in c["entries"]}
    assert set(index["files"]) == data | {"README.md"}
    for name, digest in index["files"].items():
        assert hashlib.sha256((root / name).read_bytes()).hexdigest() == digest, name
    return index


def test_a_folder_that_is_not_empty_is_refused_without_force(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    result = run(capsys, "--spec-dir", tiny, "export", out)
    assert result.returncode == 2
    assert f"{out} is not empty" in result.stderr and "--force" in result.stderr
    assert _files(out) == {"mine.txt"} and (out / "mine.txt").read_text() == "keep me"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]           # nothing staged left
    (out / "mine.txt").unlink()
    assert run(capsys, "--spec-dir", tiny, "export", out).returncode == 0   # empty: fine
    a_file = tmp_path / "file"
    a_file.write_text("x")
    refused = run(capsys, "--spec-dir", tiny, "export", a_file, "--force")
    assert refused.returncode == 2 and "is not a folder" in refused.stderr


def test_force_replaces_npz_with_json_whole(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert run(capsys, "--spec-dir", tiny, "export", out).returncode == 0
    (out / "stray.txt").write_text("from before")
    assert run(capsys, "--spec-dir", tiny, "export", out, "--format", "json",
               "--force").returncode == 0
    index = _assert_self_consistent(out)
    assert index["data_format"] == "json"
    assert {Path(f).suffix for f in _files(out)} == {".json", ".md"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_subset_export_with_force_leaves_no_stale_case(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert run(capsys, "--spec-dir", tiny, "export", out).returncode == 0
    assert len(list((out / "tiny").iterdir())) == 5
    assert run(capsys, "--spec-dir", tiny, "export", out, "--case", "tiny-softmax",
               "--force").returncode == 0
    assert [p.name for p in (out / "tiny").iterdir()] == ["tiny-softmax"]
    assert [c["id"] for c in _assert_self_consistent(out)["cases"]] == ["tiny-softmax"]


def test_force_never_follows_a_symlink_inside_the_folder(tiny, tmp_path, capsys):
    out, outside = tmp_path / "out", tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("untouched")
    (outside / "tiny-softmax").mkdir()
    (outside / "tiny-softmax" / "float32.npz").write_text("not golden")
    assert run(capsys, "--spec-dir", tiny, "export", out).returncode == 0
    (out / "link-to-file").symlink_to(outside / "precious.txt")
    (out / "README.md").unlink()
    (out / "README.md").symlink_to(outside / "precious.txt")        # a file it writes
    shutil.rmtree(out / "tiny")
    (out / "tiny").symlink_to(outside)                              # a folder it writes
    assert run(capsys, "--spec-dir", tiny, "export", out, "--force").returncode == 0
    assert (outside / "precious.txt").read_text() == "untouched"
    assert (outside / "tiny-softmax" / "float32.npz").read_text() == "not golden"
    assert _files(outside) == {"precious.txt", "tiny-softmax/float32.npz"}
    assert not any(p.is_symlink() for p in out.rglob("*"))          # the links are gone
    _assert_self_consistent(out)
    link = tmp_path / "link"
    link.symlink_to(outside)
    refused = run(capsys, "--spec-dir", tiny, "export", link, "--force")
    assert refused.returncode == 2 and "symbolic link" in refused.stderr
    assert _files(outside) == {"precious.txt", "tiny-softmax/float32.npz"}


def test_force_never_replaces_the_golden_data_it_reads(tiny, tmp_path, capsys):
    golden = tiny.parent / "golden"
    before = _files(golden)
    for target in (golden, tiny.parent):
        result = run(capsys, "--spec-dir", tiny, "export", target, "--force")
        assert result.returncode == 2 and "must not replace" in result.stderr
    assert _files(golden) == before


# --- tags -----------------------------------------------------------------------------

@pytest.mark.parametrize("case_id, present, absent", [
    ("heads-gqa-sdpa-4-2", {"grouped-query"}, {"broadcast-batch", "causal", "mask"}),
    ("heads-mqa-sdpa-8-1", {"grouped-query"}, {"broadcast-batch"}),
    ("heads-mha-gqa-four-heads-two-kv", {"grouped-query"}, {"broadcast-batch"}),
    ("heads-gqa-sdpa-equal-heads", set(), {"grouped-query"}),
    ("heads-kv-batch-broadcast", {"broadcast-batch"}, {"grouped-query"}),
    ("heads-gqa-kv-batch-broadcast", {"broadcast-batch", "grouped-query"}, set()),
    ("wo-shi-xiao-gou-causal-first-row-is-one-hot", {"causal", "causal:top_left"},
     {"causal:bottom_right", "grouped-query"}),
    ("unnormalised-scores-softmax", set(), set(TAGS)),
    ("varlen-kv-lengths-sdpa", {"varlen"}, {"policy-dependent", "causal"}),
    ("varlen-causal-bottom-right", {"varlen", "causal:bottom_right", "policy-dependent"},
     {"mask"}),
])
def test_tags_come_from_the_case_data(case_id, present, absent):
    case = load_case(case_id).case
    tags = set(case_tags(case, [{n: a.shape for n, a in generated_inputs(case, v).items()}
                                for v in case.variants]))
    assert present <= tags and not tags & absent, tags


def test_every_exported_case_carries_its_tags(tiny, tmp_path, capsys):
    assert run(capsys, "--spec-dir", tiny, "export", tmp_path / "t").returncode == 0
    index = _strict((tmp_path / "t" / "index.json").read_text())
    tags = {c["id"]: c["tags"] for c in index["cases"]}
    assert tags["tiny-weights-causal"] == ["causal", "causal:top_left"]
    assert tags["tiny-empty-row"] == ["mask", "policy-dependent"]
    assert tags["tiny-softmax"] == [] and tags["tiny-sdpa-default-scale"] == ["mask"]
    assert set(index["tags"]) == set(TAGS)
    for case in index["cases"]:                                    # from one table
        assert all(t in TAGS for t in case["tags"]) and case["op"]


def test_the_tags_and_bfloat16_are_documented():
    docs = (ROOT / "docs" / "cli.md").read_text()
    readme = reader_readme()
    for tag in TAGS:
        assert f"`{tag}`" in docs and f"`{tag}`" in readme, tag
    for text in (docs, readme):
        assert "bfloat16" in text and "float32" in text and "ml_dtypes" in text


def test_export_refuses_an_unknown_case(tmp_path, capsys):
    result = run(capsys, "export", tmp_path / "x", "--case", "no-such-case")
    assert result.returncode == 2 and "no-such-case" in result.stderr


@pytest.mark.parametrize("command", ["export", "list"])
def test_an_unknown_topic_or_op_names_the_known_ones(tiny, tmp_path, capsys, command):
    where = [tmp_path / "x"] if command == "export" else []
    result = run(capsys, "--spec-dir", tiny, command, *where, "--topic", "nosuch")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == ["no case selected: no topic nosuch (topics: tiny)"]
    result = run(capsys, "--spec-dir", tiny, command, *where, "--op", "sdpaa", "--topic", "tiny")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "no case selected: no op sdpaa (ops: attention_weights, sdpa, self_attention, softmax)"]


@pytest.mark.parametrize("fmt", ["npz", "json"])
def test_the_reader_takes_nan_only_where_the_export_allows_it(tmp_path, fmt):
    """dq of a NaN stored in a masked key: NaN passes at the export's nan_allowed positions
    (a plain dS K's 0 x NaN) and fails anywhere else."""
    root = tmp_path / "golden"
    assert main_cli(["export", str(root), "--format", fmt, "--case",
                     "policies-masked-key-nan-vjp", "--dtype", "float64"]) == 0
    reader = {}
    exec(reader_code(), reader)
    [case] = json.loads((root / "index.json").read_text())["cases"]
    data = reader["load"](str(root / case["entries"][0]["file"]))
    branch = "masked_key_nan=ignored"
    allowed = data["nan_allowed"][f"{branch}/dq"]
    assert allowed.any() and not allowed.all()

    def outputs(nan_at):
        got = {k.split("/")[1]: v.copy() for k, v in data["expected"].items()
               if k.startswith(branch + "/")}
        got["dq"][nan_at] = np.nan
        return lambda c, e, inputs: got

    for nan_at, failed in ((allowed, []), (~allowed, [f"{branch}/dq"])):
        checked, failures = reader["check"](str(root), outputs(nan_at), [branch])
        assert checked == 3 and [f.split(": ")[1] for f in failures] == failed
