"""The jax.distributed form (backend/rank.py; backends/jax_ring_processes.py): W ranks
forked from this process, each one process of a JAX cluster on the CPU (a coordinator on
the loopback, gloo collectives), run jax-ring's program across processes. A rank killed
while its peer waits on it in the ring is one crash, a rank that raises fails the call,
and neither leaves a process behind; the next call gets a fresh cluster. (tox -e
jax-ring certifies the backend on four sharded cases; the killed rank runs there, in a
process where no JAX backend has started: initialize must come first in each rank.)

The quick certification below runs wherever jax is installed, the suite's own run
included: without it, the backend's every rank once raised on every case unseen."""

import json
import os
import signal

import numpy as np
import pytest

pytest.importorskip("jax", reason="jax is not installed (pip install -e '.[jax]'; "
                                  "tox -e jax-ring runs these)")

from _cli_support import cli  # noqa: E402
from _ring_tests import children, slow_ring  # noqa: E402
from attention_conformance.backend.distributed import RankCrashed  # noqa: E402
from attention_conformance.backend.in_process import InProcess  # noqa: E402
from attention_conformance.backends.jax_ring_processes import JaxRingProcessesBackend  # noqa: E402
from attention_conformance.golden import reference  # noqa: E402
from attention_conformance.model.errors import BackendRaised  # noqa: E402


class RankKilled(JaxRingProcessesBackend):
    """Rank 1 killed by SIGKILL when the call is `killed`, as rank 0 enters the ring."""

    name = "faulty-jax-rank-killed"
    fault = None

    def _places(self, *stacked):
        import jax

        if self.fault == "killed" and jax.process_index() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault == "raised" and jax.process_index() == 0:
            raise ValueError("planted")
        return super()._places(*stacked)


def _call(backend, world):
    rng = np.random.default_rng(0)
    arrays = {n: rng.normal(size=(1, 2, 8, 4)) for n in "qkv"}
    params = {"causal": "top_left", "sharding": {"world_size": world, "scheme": "zigzag"}}
    out, lse = backend.call("sdpa_lse", arrays, params)
    expected = reference.run("sdpa_lse", arrays, params)
    assert np.allclose(out, expected[0], atol=1e-12) and np.allclose(lse, expected[1])


@slow_ring
def test_a_killed_rank_is_one_crash_and_the_next_call_gets_a_fresh_cluster():
    adapter = RankKilled()
    backend, before = InProcess(adapter), children()
    adapter.fault = "killed"
    # jax.distributed aborts the survivors of a cluster whose process died: the crash may
    # name rank 0 (SIGABRT) where the suite sees both dead at once
    with pytest.raises(RankCrashed, match="rank [01] of 2 died during sdpa_lse .killed by signal "
                                          "SIG(KILL|ABRT).; its group of 2 ranks was ended"):
        _call(backend, 2)
    assert children() <= before
    adapter.fault = "raised"
    with pytest.raises(BackendRaised, match="rank 0 of 4 raised ValueError: planted"):
        _call(backend, 4)
    assert children() <= before
    adapter.fault = None
    _call(backend, 2)                     # a fresh cluster, its own coordinator
    assert children() <= before


#: two sharded cases that take each path across processes: W = 4 forward, and W = 2
#: gradients with document ids travelling and a block mask (~10 CPU s: each rank of each
#: case compiles its program)
CERTIFIED = ("cp-zigzag-causal-top-left-w4", "cp-block-mask-documents-vjp-zigzag-w2")


def test_it_certifies_sharded_cases_across_processes(tmp_path):
    """`attention-conformance certify jax-ring-processes` on CERTIFIED in float64, as tox
    -e jax-ring's second command certifies four: every test passes."""
    args = ("certify", "jax-ring-processes", "--dtype", "float64",
            "-k", " or ".join(CERTIFIED), "--report", tmp_path / "reports")
    done = cli(*args, cwd=tmp_path, timeout=300)
    out = f"attention-conformance {' '.join(map(str, args))}:\n{(done.stdout + done.stderr)[-3000:]}"
    report = tmp_path / "reports" / "jax-ring-processes.json"
    assert report.exists(), out
    results = json.loads(report.read_text())["results"]
    statuses = {(r["case"], r["variant"], r["dtype"]): (r["status"], r["message"][:300])
                for r in results}
    assert {case for case, _, _ in statuses} == set(CERTIFIED), out
    assert {status for status, _ in statuses.values()} == {"pass"}, statuses
    assert done.returncode == 0, out
