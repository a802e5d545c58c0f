"""Golden data that are missing, truncated or changed make their tests the suite's error
(status `error`, never a `fail` blamed on the backend), with the reason."""

import json
import shutil
from pathlib import Path

import pytest

from attention_conformance.backends.numpy import NumpyBackend
from attention_conformance.golden import compute as golden_compute
from attention_conformance.golden import freeze as golden_freeze
from attention_conformance.golden import store as golden_store
from attention_conformance.backend.in_process import InProcess
from attention_conformance.checking.verdict import run_case, verdict_of
from attention_conformance.specs.loader import load_spec
from _cli_support import cli

ROOT = Path(__file__).resolve().parents[2]

CASES = """\
topic: tiny
cases:
  - id: tiny-sdpa
    description: a small sdpa case with frozen golden data
    source: tests/spec/test_bad_golden.py
    op: sdpa
    inputs:
      q: {normal: {shape: [2, 4], seed: 1}}
      k: {normal: {shape: [3, 4], seed: 2}}
      v: {normal: {shape: [3, 4], seed: 3}}
    dtypes: [float32]
    expect: {golden: true, properties: [finite]}
"""


@pytest.fixture
def frozen(tmp_path):
    """(case, golden folder): the case's golden data freshly regenerated into tmp."""
    spec = tmp_path / "spec"
    (spec / "cases").mkdir(parents=True)
    shutil.copy(ROOT / "spec" / "schema.json", spec)
    (spec / "cases" / "tiny.yaml").write_text(CASES)
    loaded = load_spec(spec / "cases")
    assert not loaded.errors, loaded.errors
    golden_freeze.regenerate(loaded.cases, spec / "golden")
    return loaded.cases[0], spec / "golden"


def run(case, directory):
    return run_case(InProcess(NumpyBackend()), case, case.variants[0], "float32",
                    golden_store.GoldenStore(directory))


def failure(case, directory) -> str:
    """The message of the test's verdict, which is the suite's error, never a fail."""
    verdict = verdict_of(InProcess(NumpyBackend()), case, case.variants[0], "float32",
                         golden_store.GoldenStore(directory))
    assert verdict["status"] == "error", verdict
    return verdict["message"]


def test_intact_golden_data_pass(frozen):
    assert run(*frozen).worst_ratio < 1


def test_missing_file(frozen):
    case, directory = frozen
    (directory / "tiny.npz").unlink()
    message = failure(case, directory)
    assert message == (f"golden data: golden file {directory / 'tiny.npz'} is missing "
                       "(run: attention-conformance golden regenerate)")


def test_truncated_file_is_caught_by_its_sha256(frozen):
    case, directory = frozen
    path = directory / "tiny.npz"
    path.write_bytes(path.read_bytes()[:200])
    message = failure(case, directory)
    assert message.startswith(f"golden data: golden file {path} does not match its sha256 "
                              "in SHA256SUMS (listed ")
    assert "200 bytes: truncated or changed by hand?" in message


def test_truncated_file_listed_with_its_new_sha256_cannot_be_read(frozen):
    case, directory = frozen
    path = directory / "tiny.npz"
    path.write_bytes(path.read_bytes()[:200])
    golden_store.write_manifest(directory)
    message = failure(case, directory)
    assert message.startswith(f"golden data: golden file {path} cannot be read "
                              "(truncated or corrupt): BadZipFile")


def test_changed_file_does_not_match_its_sha256(frozen):
    case, directory = frozen
    data = bytearray((directory / "tiny.npz").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (directory / "tiny.npz").write_bytes(bytes(data))
    assert "does not match its sha256 in SHA256SUMS" in failure(case, directory)


def test_file_not_in_the_manifest(frozen):
    case, directory = frozen
    (directory / "SHA256SUMS").write_text("")
    assert f"is not listed in {directory / 'SHA256SUMS'}" in failure(case, directory)


def test_a_missing_file_is_an_error_even_where_the_backend_is_wrong(frozen, monkeypatch):
    """With the golden data gone the test is not judged: an error naming the file, never
    a fail, whatever the backend returns."""
    case, directory = frozen
    (directory / "tiny.npz").unlink()
    monkeypatch.setattr(NumpyBackend, "sdpa", lambda self, q, k, v, **kw: q[:, :4] * float("nan"))
    assert failure(case, directory) == (f"golden data: golden file {directory / 'tiny.npz'} "
                                        "is missing (run: attention-conformance golden regenerate)")


@pytest.mark.parametrize("manifest", ["kept", "rewritten"])
def test_certify_reports_a_missing_golden_file_as_an_error(frozen, tmp_path, manifest):
    """certify numpy on a spec folder whose golden file is gone, its manifest listing it
    still or written again without it: each test of the topic is an error naming it."""
    case, directory = frozen
    (directory / "tiny.npz").unlink()
    if manifest == "rewritten":
        golden_store.write_manifest(directory)
    done = cli("--spec-dir", directory.parent / "cases", "certify", "numpy", "--report",
               tmp_path / "report", "-p", "no:cacheprovider", "-q")
    assert done.returncode == 1, done.stdout + done.stderr
    [record] = json.loads((tmp_path / "report" / "numpy.json").read_text())["results"]
    assert record["status"] == "error", record
    assert record["message"].startswith(f"golden data: golden file {directory / 'tiny.npz'} "
                                        "is missing"), record
    assert "ERROR tiny/tiny-sdpa[float32]: golden data: golden file" in done.stdout, done.stdout


def test_regenerating_unchanged_data_changes_no_byte(frozen):
    """Arrays the reference reproduces within 1e-12 are kept as frozen, so another
    machine's BLAS (~1e-16 apart) does not rewrite the golden files."""
    case, directory = frozen
    path = directory / "tiny.npz"
    data = golden_store.load_topic(directory, "tiny")
    [key] = [k for k in data if k.endswith("/out")]
    nudged = dict(data, **{key: data[key] * (1 + 1e-15)})
    golden_store.write_topic(path, nudged)
    golden_store.write_manifest(directory)
    before = path.read_bytes()
    assert golden_freeze.regenerate([case], directory) == []
    assert path.read_bytes() == before
    nudged[key] = data[key] * (1 + 1e-9)              # a real change is written
    golden_store.write_topic(path, nudged)
    assert [k for k, _ in golden_freeze.regenerate([case], directory)] == [key]


def test_a_packed_topic_unpacks_to_every_array(frozen):
    case, directory = frozen
    data = golden_store.load_topic(directory, "tiny")
    fresh = golden_compute.compute_case(case, golden_store.GoldenStore(directory).tolerances)
    assert sorted(data) == sorted(fresh)
    assert all(data[k].shape == fresh[k].shape and not data[k].flags.writeable for k in data)


@pytest.mark.parametrize("line, why", [
    ("not a manifest line", "no digest"),
    ("0123abcd  tiny.npz", "a short digest"),
    ("{digest}tiny.npz", "no separator"),
    ("{digest}\ttiny.npz", "a tab for a separator"),
    ("{digest}  ", "no file name"),
])
def test_a_malformed_manifest_line_is_named(frozen, line, why):
    case, directory = frozen
    manifest = directory / "SHA256SUMS"
    good = manifest.read_text()
    digest = good.split()[0]
    manifest.write_text(good + line.format(digest=digest) + "\n")
    expected = (f"golden data: {manifest}:2: malformed line "
                f"{line.format(digest=digest)[:80]!r}: expected '<64 hex digits>  <file name>'")
    assert failure(case, directory).startswith(expected), why
    problems = golden_freeze.check([case], directory)         # `golden check` reports it
    assert len(problems) == 1 and problems[0].startswith(expected[len("golden data: "):])


@pytest.mark.parametrize("form", ["{upper}  tiny.npz", "{digest} *tiny.npz", "{upper} *tiny.npz\r"])
def test_the_forms_sha256sum_writes_are_read(frozen, form):
    case, directory = frozen
    manifest = directory / "SHA256SUMS"
    digest = manifest.read_text().split()[0]
    manifest.write_text("\n" + form.format(digest=digest, upper=digest.upper()) + "\n")
    assert golden_store.read_manifest(directory) == {"tiny.npz": digest}
    assert run(case, directory).worst_ratio < 1
    assert golden_freeze.check([case], directory) == []


def test_a_file_listed_twice_with_two_digests(frozen):
    case, directory = frozen
    manifest = directory / "SHA256SUMS"
    manifest.write_text(manifest.read_text() + "0" * 64 + "  tiny.npz\n")
    assert failure(case, directory) == (f"golden data: {manifest}:2: tiny.npz is listed again "
                                        "with another sha256 (first at line 1)")


def test_a_manifest_that_is_not_text(frozen):
    case, directory = frozen
    (directory / "SHA256SUMS").write_bytes(b"\xff\xfe\x00garbage")
    assert failure(case, directory).startswith(
        f"golden data: {directory / 'SHA256SUMS'} cannot be read: UnicodeDecodeError")


def test_the_plain_errors_are_the_machines_and_never_a_change(tmp_path):
    """A plain error (either tier) is the BLAS's own rounding, which moves with its
    threads: `golden check` does not report it, `regenerate` keeps the frozen one."""
    spec = tmp_path / "spec"
    (spec / "cases").mkdir(parents=True)
    shutil.copy(ROOT / "spec" / "schema.json", spec)
    (spec / "cases" / "tiny.yaml").write_text(CASES.replace("[float32]", "[float16]"))
    [case] = load_spec(spec / "cases").cases
    directory = spec / "golden"
    golden_freeze.regenerate([case], directory)
    path = directory / "tiny.npz"
    data = golden_store.load_topic(directory, "tiny")
    errors = [k for k in data if k.endswith(golden_freeze.PLAIN_ERRORS)]
    assert {k.rsplit(".", 1)[1] for k in errors} == {"plain_error", "plain_error_float32"}
    nudged = dict(data, **{k: data[k] * 1.05 for k in errors})
    golden_store.write_topic(path, nudged)
    golden_store.write_manifest(directory)
    before = path.read_bytes()
    assert golden_freeze.check([case], directory) == []
    assert golden_freeze.regenerate([case], directory) == []
    assert path.read_bytes() == before
