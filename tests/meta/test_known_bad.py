"""Known-bad adapters (tests/known_bad/): the spec catches real bugs, and passes correct code.

Each adapter plants one realistic bug in the NumPy backend. The quick cases of the spec
run on it programmatically, stopping at the first failure: that case catches the bug.
A bug that only a kind of case can reveal (a grouped-query case, a gradient case ...)
is an expected failure while the spec has no case of that kind; once it has one, the
bug must be caught. The correct NumPy backend, and the planting machinery with no bug
planted, pass every quick case.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attention_conformance.golden import freeze as golden_freeze
from attention_conformance.golden.store import GoldenStore
from attention_conformance.specs.loader import load_spec

ROOT = Path(__file__).resolve().parents[2]
KNOWN_BAD = ROOT / "tests" / "known_bad"
sys.path.append(str(KNOWN_BAD))

from _harness import (bug_files, catch, first_catch, item_id, load_bug, outcome,  # noqa: E402
                      quick_items)
from _needs import NEEDS  # noqa: E402
from _plant import Planted  # noqa: E402
from _real_spec import real_spec  # noqa: E402
from _session_shared import once  # noqa: E402
from _tiled import TiledPlanted, good as tiled_good  # noqa: E402

@pytest.fixture(scope="module")
def spec():
    return real_spec()


@pytest.fixture(scope="module")
def golden():
    return GoldenStore()


def _encode(found):
    return list(found) if isinstance(found, tuple) else found


def _decode(found):
    return tuple(found) if isinstance(found, list) else found


@pytest.fixture(scope="module")
def catch_of(spec, golden, tmp_path_factory):
    """bug file -> what catch() found for it, each bug run once per session (whichever
    xdist worker asks first runs it; the others read its result)."""
    def found(path):
        return once(tmp_path_factory, f"known-bad/{path.stem}",
                    lambda: catch(path, spec, golden), _encode, _decode)
    return found


@pytest.fixture(scope="module")
def catches(catch_of):
    """bug -> (test id, first failure message), None (not caught), or the missing kind."""
    return {path.stem: catch_of(path) for path in bug_files()}


def _doc(path):
    return (type(load_bug(path)).__doc__ or "").strip()


@pytest.mark.parametrize("path", bug_files(), ids=lambda p: p.stem)
def test_planted_bug_is_caught(path, catch_of):
    found = catch_of(path)
    assert not isinstance(found, str), f"{path.stem}: the spec has no {found}, which this bug needs"
    kind = f", a {NEEDS[path.stem][0]} included" if path.stem in NEEDS else ""
    assert found is not None, f"{path.stem} ({_doc(path)}) passes every quick case{kind}"
    case, message = found
    assert message.strip(), f"{path.stem}: {case} failed without a message"
    # a planted bug is caught by a wrong output, not by the planting crashing the adapter
    assert "the backend raised" not in message, f"{path.stem}: {case}: {message}"


def test_the_spec_catches_every_planted_bug_as_the_readme_says(catches):
    caught = {bug: found[0] for bug, found in catches.items() if isinstance(found, tuple)}
    missed = sorted(set(catches) - set(caught))
    assert not missed, f"not caught: {missed}"
    docs = {_doc(KNOWN_BAD / f"{bug}.py") for bug in caught}
    assert len(docs) == len(caught), "two known-bad adapters plant the same bug"
    claim = re.search(r"the spec catches (\d+) of (\d+)", (ROOT / "README.md").read_text())
    assert claim and claim.groups() == (str(len(caught)), str(len(catches))), claim


def test_each_known_bad_adapter_plants_one_named_bug():
    assert bug_files()
    for path in bug_files():
        backend = load_bug(path)
        assert isinstance(backend, (Planted, TiledPlanted)) and _doc(path), path
        declared = backend.name  # each planted bug declares its own name
        assert declared.startswith("bad-") and declared != "bad-planted", path


def _failures(backend, spec, golden):
    return [f"{item_id(c, v, d)}: {message}" for c, v, d in quick_items(spec)
            if (message := outcome(backend, c, v, d, golden)) is not None]


def test_the_correct_numpy_backend_passes_every_quick_case(spec, golden):
    from attention_conformance.backends.numpy import NumpyBackend

    failures = _failures(NumpyBackend(), spec, golden)
    assert not failures, "\n".join(failures[:10])


@pytest.mark.parametrize("block", [16, 64, "prescaled", "half-roundings"])
def test_the_correct_tiled_adapter_passes_every_quick_case(block, spec, golden):
    """tests/known_good/tiled.py, tiles of 16 and of 64, certified like any backend; with
    q and k pre-scaled by sqrt(scale): every `exact` claim holds for that order too; and
    with FlashAttention's roundings to half (logits, P, dS) inside float32 accumulation:
    the float32 tier it declares holds it (accumulation: float32)."""
    backend = {16: tiled_good.Tiled16, 64: tiled_good.Tiled64,
               "prescaled": tiled_good.TiledPrescaled,
               "half-roundings": tiled_good.TiledHalfRoundings}[block]()
    assert (backend.block_q, backend.block_k) == ((block, block) if block in (16, 64)
                                                  else (16, 16))
    assert backend.policy["accumulation"] == "float32"
    failures = _failures(backend, spec, golden)
    assert not failures, "\n".join(failures[:10])


def test_the_tiled_planting_machinery_alone_plants_no_bug(spec, golden):
    """A TiledPlanted subclass with nothing planted computes what Tiled16 computes, bit for bit."""
    class NoTiledBug(TiledPlanted):
        """No bug: the machinery of the tiled known-bad adapters with nothing planted."""

    plain, planted = tiled_good.Tiled16(), NoTiledBug()
    assert planted.name == "bad-no-tiled-bug"
    items = [(c, v, d) for c, v, d in quick_items(spec) if c.topic == "tiles"]
    assert len(items) > 50
    for case, variant, dtype in items:
        assert outcome(planted, case, variant, dtype, golden) is None, item_id(case, variant, dtype)
    from attention_conformance.golden.inputs import build_inputs
    case = spec.by_id()["tiles-causal-bottom-right-vjp"]
    arrays = build_inputs(case.inputs, case.variants[0].dims)
    args = [arrays[n] for n in ("q", "k", "v", "d_out")]
    for a, b in zip(plain.sdpa_vjp(*args, causal="bottom_right"),
                    planted.sdpa_vjp(*args, causal="bottom_right")):
        assert np.array_equal(a, b)


def _documented_catches():
    """bug -> first catching test id, from the table of docs/failures.md."""
    table = (ROOT / "docs" / "failures.md").read_text()
    return dict(re.findall(r"^\| `(\w+)`: .*? \| `([^`]+)` \|", table, re.MULTILINE))


def test_docs_failures_table_names_the_first_catching_case(catches):
    documented = _documented_catches()
    assert set(documented) == {p.stem for p in bug_files()}, "regenerate docs/failures.md"
    wrong = {bug: (documented[bug], found[0]) for bug, found in catches.items()
             if isinstance(found, tuple) and documented[bug] != found[0]}
    assert not wrong, f"docs/failures.md is stale (python tests/known_bad/_harness.py): {wrong}"


def test_every_tiled_bug_is_caught_by_the_quick_spec(catches):
    tiled = {bug: found for bug, found in catches.items() if bug.startswith("tiled_")}
    assert len(tiled) >= 10
    missed = [bug for bug, found in tiled.items() if not isinstance(found, tuple)]
    assert not missed, f"tiled bugs no quick case catches: {missed}"


def test_each_tiled_bug_cites_its_upstream_thread():
    for path in bug_files():
        if path.stem.startswith("tiled_"):
            text = path.read_text()
            assert "Upstream:" in text and re.search(r"(PR|issue) \d+", text), path


def test_the_planting_machinery_alone_plants_no_bug(spec, golden):
    class NoBug(Planted):
        """No bug: the machinery of the known-bad adapters with nothing planted."""

    failures = _failures(NoBug(), spec, golden)
    assert not failures, "\n".join(failures[:10])


@pytest.fixture(scope="module")
def revealing(tmp_path_factory):
    """The cases of tests/known_bad/revealing, with their golden data frozen into tmp."""
    spec = load_spec(KNOWN_BAD / "revealing")
    assert not spec.errors, "\n".join(map(str, spec.errors))
    directory = tmp_path_factory.mktemp("golden")
    golden_freeze.regenerate(spec.cases, directory)
    return spec, GoldenStore(directory)


@pytest.mark.parametrize("bug", sorted(NEEDS))
def test_a_case_of_the_kind_a_bug_needs_catches_it(bug, revealing):
    """The suite's checks catch every bug that waits for a case, given a case of its kind."""
    spec, store = revealing
    needs, reveals = NEEDS[bug]
    assert any(reveals(c) for c in spec.cases), f"revealing.yaml has no {needs}"
    found = first_catch(load_bug(KNOWN_BAD / f"{bug}.py"), quick_items(spec, reveals), store)
    assert found is not None, f"{bug} passes every revealing case"
    case_id = found[0].split("/")[1].split("[")[0]
    assert reveals(spec.by_id()[case_id]), f"{bug} was caught by {found[0]}, not a {needs}"


def test_the_correct_numpy_backend_passes_the_revealing_cases(revealing):
    from attention_conformance.backends.numpy import NumpyBackend

    failures = _failures(NumpyBackend(), *revealing)
    assert not failures, "\n".join(failures)


def test_a_planted_bug_fails_through_the_pytest_plugin():
    case = "wo-ai-zhong-guo-cross-attention"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "spec/cases", "-p", "attention_conformance.plugin",
         "-p", "no:cacheprovider", "--backend", "tests/known_bad/wrong_scale.py:WrongScale",
         "-k", case, "--dtype", "float32"], capture_output=True, text=True, cwd=ROOT,
        timeout=300, env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    out = done.stdout
    assert done.returncode == 1, out[-3000:] + done.stderr[-3000:]
    assert (f"test:   worked_examples/{case}[Lq3-Lk4-D64-float32] on backend 'bad-wrong-scale', "
            "dtype float32") in out
    assert f"FAIL worked_examples/{case}[Lq3-Lk4-D64-float32]: golden out:" in out
    assert "op:     sdpa; inputs: q (3, 64), k (4, 64), v (4, 64); params: none" in out
    assert "golden out: worst abs error" in out and "tolerance" in out
    assert "2 failed" in out
