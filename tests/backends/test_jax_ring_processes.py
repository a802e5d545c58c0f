"""The jax.distributed form (backend/rank.py; backends/jax_ring_processes.py): W ranks
forked from this process, each one process of a JAX cluster on the CPU (a coordinator on
the loopback, gloo collectives), run jax-ring's program across processes. A rank killed
while its peer waits on it in the ring is one crash, a rank that raises fails the call,
and neither leaves a process behind; the next call gets a fresh cluster. (tox -e
jax-ring certifies the backend on every sharded case; these run there, in a process
where no JAX backend has started: initialize must come first in each rank.)"""

import os
import signal

import numpy as np
import pytest

pytest.importorskip("jax")

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
    with pytest.raises(RankCrashed, match="rank 1 of 2 died during sdpa_lse .killed by signal "
                                          "SIGKILL."):
        _call(backend, 2)
    assert children() <= before
    adapter.fault = "raised"
    with pytest.raises(BackendRaised, match="rank 0 of 4 raised ValueError: planted"):
        _call(backend, 4)
    assert children() <= before
    adapter.fault = None
    _call(backend, 2)                     # a fresh cluster, its own coordinator
    assert children() <= before
