"""Distributed known-bad adapters (tests/known_bad/distributed/): the sharded cases catch
the bugs of ring attention, each planted in a copy of the torch ring.

Each adapter runs the sharded cases (spec/cases/context_parallel.yaml) in this process,
its ranks forked from it, stopping at the first failure; docs/failures.md names that
case. The correct ring passing them all is the torch-ring certification; both run in
`tox -e torch-ring` (slow_ring: seconds each, on its ranks).
"""

import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "tests" / "known_bad" / "distributed"))

from _ring_harness import bug_files, catch, load_bug  # noqa: E402
from _ring_tests import slow_ring  # noqa: E402
from attention_conformance.golden.store import GoldenStore  # noqa: E402
from _real_spec import real_spec  # noqa: E402

#: the five bugs of issue 40, and two of packed documents and block masks: each a file
BUGS = {"diagonal_block_twice", "zigzag_local_causal_skip", "lse_merge_wrong_base",
        "masked_chunk_drops_state", "kv_grads_not_reduced", "document_ids_left_behind",
        "block_mask_local_rows"}


def _documented() -> dict:
    text = (ROOT / "docs" / "failures.md").read_text()
    return dict(re.findall(r"^\| `distributed/(\w+)`: .*? \| `([^`]+)` \|", text, re.MULTILINE))


def test_each_bug_of_the_issue_has_its_adapter():
    assert {p.stem for p in bug_files()} == BUGS
    for path in bug_files():
        backend = load_bug(path)
        assert backend.name.startswith("bad-") and type(backend).__doc__, path


@pytest.fixture(scope="module")
def spec_and_golden():
    return real_spec(), GoldenStore()


@slow_ring
@pytest.mark.parametrize("path", bug_files(), ids=lambda p: p.stem)
def test_a_sharded_case_catches_the_bug_where_docs_say(path, spec_and_golden):
    found = catch(path, *spec_and_golden)
    assert found is not None, f"{path.stem} passes every sharded case"
    case, message = found
    assert "the backend raised" not in message, message     # a wrong output, not a crash
    assert _documented().get(path.stem) == case, \
        "docs/failures.md is stale (python tests/known_bad/distributed/_ring_harness.py)"
