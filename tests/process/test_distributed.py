"""A sharded call's ranks (backend/distributed.py): a rank killed in the middle of the
ring is one crash of its test (a rank deadlocked there, one timeout), the group is ended,
the run goes on with a fresh backend process, and no rank, store or process of the run
outlives it (the run in a fresh pytest process: slow_ring, in tox -e torch-ring; in this
process, in the suite's quick run)."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch.distributed")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_isolation import FAULTY, ROOT, assert_nothing_left, certify  # noqa: E402
from _ring_tests import children as _children, slow_ring  # noqa: E402

from attention_conformance.backend.distributed import RankCrashed  # noqa: E402
from attention_conformance.backend.in_process import InProcess  # noqa: E402
from attention_conformance.backend.resolve import load_backend  # noqa: E402
from attention_conformance.model.errors import BackendRaised, Unsupported  # noqa: E402

CASE = "cp-contiguous-causal-top-left-w2"
DIED = "rank 1 of 2 died during sdpa_lse (killed by signal SIGKILL); its group of 2 ranks was ended"


@slow_ring
def test_a_rank_killed_mid_ring_is_one_crash_and_the_run_goes_on(tmp_path):
    tag = uuid.uuid4().hex
    done, report = certify(tmp_path, "rank_killed.py:RankKilled",
                           ROOT / "spec" / "cases" / "context_parallel.yaml", tag=tag,
                           select=CASE, spec_dir=ROOT / "spec" / "cases")
    out = done.stdout + done.stderr
    assert report is not None, out[-3000:]
    statuses = sorted((r["status"], r["message"]) for r in report["results"])
    assert [s for s, _ in statuses] == ["crash", "pass"], statuses   # the one crash: its test
    assert DIED in statuses[0][1] and "exited with code 70" in statuses[0][1], statuses
    assert report["complete"] is True
    assert_nothing_left(tmp_path, tag)


@slow_ring
def test_a_rank_deadlocked_mid_ring_is_one_timeout_and_the_run_goes_on(tmp_path):
    tag = uuid.uuid4().hex
    done, report = certify(tmp_path, "rank_hangs.py:RankHangs",
                           ROOT / "spec" / "cases" / "context_parallel.yaml",
                           "--case-timeout", "5", tag=tag, select=CASE,
                           spec_dir=ROOT / "spec" / "cases")
    out = done.stdout + done.stderr
    assert report is not None, out[-3000:]
    statuses = sorted((r["status"], r["message"]) for r in report["results"])
    assert [s for s, _ in statuses] == ["pass", "timeout"], statuses   # its test alone
    assert "within 5 s (--case-timeout" in statuses[1][1], statuses
    assert report["complete"] is True
    assert_nothing_left(tmp_path, tag)


def _call(backend, **params):
    rng = np.random.default_rng(0)
    q = rng.normal(size=(1, 2, 8, 4)).astype(np.float32)
    return backend.call("sdpa_lse", {"q": q, "k": q.copy(), "v": q.copy()},
                        {"causal": "top_left", "sharding": {"world_size": 2}, **params})


def test_in_process_a_killed_rank_raises_rank_crashed_and_leaves_no_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("FAULTY_MARKERS", str(tmp_path))
    before = _children()
    backend = InProcess(load_backend(f"{FAULTY / 'rank_killed.py'}:RankKilled"))
    with pytest.raises(RankCrashed, match="rank 1 of 2 died during sdpa_lse"):
        _call(backend)
    assert _children() <= before
    out, lse = _call(backend)                   # the next call: a fresh group
    assert out.shape == (1, 2, 8, 4) and lse.shape == (1, 2, 8)
    assert _children() <= before


def test_a_rank_that_raises_fails_the_test_and_ends_its_group(monkeypatch):
    backend = InProcess(load_backend("torch-ring"))
    adapter = backend.adapter

    def broken(self, ring, source, allowed):
        if ring["rank"] == 0:
            raise ValueError("planted")
        return False
    monkeypatch.setattr(type(adapter), "_skips", broken)
    before = _children()
    with pytest.raises(BackendRaised, match="rank 0 of 2 raised ValueError: planted"):
        _call(backend)
    assert _children() <= before


def test_a_backend_without_a_distributed_form_is_unsupported():
    backend = InProcess(load_backend("numpy"))
    with pytest.raises(Unsupported, match="declares no distributed form"):
        _call(backend)


THREADED_PARENT = """
import numpy as np, torch
from attention_conformance.backend.in_process import InProcess
from attention_conformance.backend.resolve import load_backend
torch.set_num_threads(2)
torch.ones(256, 256, dtype=torch.float64) @ torch.ones(256, 256, dtype=torch.float64)
backend = InProcess(load_backend("torch-ring"))
q = np.random.default_rng(0).normal(size=(1, 2, 8, 4))
out, lse = backend.call("sdpa_lse", {"q": q, "k": q.copy(), "v": q.copy()},
                        {"causal": "top_left", "sharding": {"world_size": 2}})
print("answered", out.shape)
"""


@slow_ring
def test_ranks_forked_from_a_process_that_computed_on_several_threads_answer():
    """OpenMP's worker threads do not survive the fork: without one thread per rank
    (rank.py), a rank waits for them forever in its first parallel region."""
    import subprocess

    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-c", THREADED_PARENT], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0 and "answered (1, 2, 8, 4)" in done.stdout, done.stderr[-2000:]
