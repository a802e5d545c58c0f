"""What runs in one rank of a sharded call (backend/distributed.py starts W of them).

A rank is a process forked from the backend's (torch.multiprocessing): it joins its
group (torch.distributed, gloo, through a TCP store on the loopback that rank 0 serves
on a socket the backend's process bound for that one call: no file is left behind), calls the
adapter's op with its shard and ``shard=`` its place, waits at a barrier until every rank
has returned (so that no rank leaves while another still receives from it), sends its
outputs (or what it raised) to the suite, and leaves at once (os._exit: nothing of the
process it was forked from runs again). It dies with that process.

A rank of the ``jax.distributed`` form is forked the same way (plain multiprocessing),
becomes one process of a JAX cluster (jax.distributed.initialize with a coordinator on a
loopback port rank 0 serves, gloo CPU collectives), calls the op, answers (its outputs or
its error), and stays until the suite ends the group: a JAX process that leaves aborts
its whole cluster.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import traceback
from dataclasses import dataclass
from datetime import timedelta

#: how long a rank waits in a collective before gloo gives up (the suite's --case-timeout
#: ends a hung group well before, with the backend's process)
GROUP_TIMEOUT = timedelta(seconds=600)


@dataclass(frozen=True)
class Job:
    form: str           # the adapter's distributed form: "torch.distributed" or "jax.distributed"
    rank: int
    world_size: int
    store_port: int     # the port of the group's TCP store (or JAX coordinator) on 127.0.0.1,
                        # which rank 0 serves
    store_fd: int       # rank 0: the listening socket of that store, inherited
    shard: dict         # what the adapter's op receives as `shard`


def open_store() -> socket.socket:
    """The listening socket of the group's store, bound here on the loopback (its port
    chosen by the system) and served by rank 0, which inherits it: this process starts
    no thread of torch's before it forks the ranks (a lock a thread holds at a fork
    would be held forever in the child). Closed here once the ranks are started."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.set_inheritable(True)
    return listener


def free_port() -> int:
    """A port of the loopback free now, for the JAX coordinator that rank 0 serves (JAX
    binds it itself: it takes no socket)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def context(form: str = "torch.distributed"):
    """The multiprocessing context ranks start in, forked (the adapter is already loaded:
    nothing is imported or pickled again): torch's for torch.distributed."""
    if form == "torch.distributed":
        import torch.multiprocessing as mp

        return mp.get_context("fork")
    import multiprocessing

    return multiprocessing.get_context("fork")


def main(job: Job, method, args, keywords, answer) -> None:
    """The rank's whole life; it never returns."""
    _die_with_parent()
    joined = False
    try:
        _join(job)
        joined = True
        result = method(*args, **keywords, shard=job.shard)
        _barrier(job)
        answer.send(("outputs", _plain(result)))
    except NotImplementedError as exc:
        _send(answer, ("unsupported", str(exc) or type(exc).__name__))
    except BaseException as exc:
        # a group that could not form (the suite's loopback rendezvous) is not the backend's
        _send(answer, ("raised" if joined else "unformed", f"{type(exc).__name__}: {_text(exc)}",
                       "".join(traceback.format_exception(exc, limit=-4))[-4000:]))
    finally:
        if job.form == "jax.distributed":
            _wait_to_be_ended()       # a JAX process that leaves aborts its whole cluster
        os._exit(0)


def _join(job: Job) -> None:
    if job.form == "jax.distributed":
        return _join_jax(job)
    import torch
    import torch.distributed as dist

    # OpenMP's worker threads do not survive a fork: a rank forked after its backend's
    # process computed on several threads would wait for them forever in its first
    # parallel region. One intra-op thread per rank (W ranks share the machine anyway).
    torch.set_num_threads(1)

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    serves = job.rank == 0
    store = dist.TCPStore("127.0.0.1", job.store_port, job.world_size, serves,
                          timeout=GROUP_TIMEOUT, wait_for_workers=False,
                          master_listen_fd=job.store_fd if serves else None)
    dist.init_process_group("gloo", store=store, rank=job.rank, world_size=job.world_size,
                            timeout=GROUP_TIMEOUT)


def _join_jax(job: Job) -> None:
    """This process made one of the group's JAX processes (jax.distributed, a coordinator
    on the loopback that rank 0 serves; CPU collectives through gloo). The adapter's
    process must not have started JAX's backend before the fork: initialize comes first."""
    import faulthandler

    import jax

    faulthandler.disable()      # a peer's death aborts this process: the suite says which
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{job.store_port}",
                               num_processes=job.world_size, process_id=job.rank,
                               initialization_timeout=int(GROUP_TIMEOUT.total_seconds()))


def _barrier(job: Job) -> None:
    """torch.distributed: every rank has returned before any leaves (a rank may still
    receive from another). A JAX rank instead stays until the suite ends the group, once
    every rank has answered (_wait_to_be_ended): its coordinator and its peers' gloo
    pairs are not torn down under a rank that is still finishing."""
    if job.form != "torch.distributed":
        return
    import torch.distributed as dist

    dist.barrier()


def _wait_to_be_ended() -> None:
    """Stay (answered, or failed) until the suite ends the group: jax.distributed's health
    checking aborts every process of a cluster when one leaves, which would turn a rank's
    error into its peers' crash."""
    while True:
        signal.pause()


def _plain(result):
    """Outputs as they cross to the suite: NumPy arrays stay, a tuple stays a tuple; the
    suite checks each (a framework tensor crosses as what it is, and fails there)."""
    return tuple(result) if isinstance(result, (tuple, list)) else result


def _send(answer, message) -> None:
    try:
        answer.send(message)
    except Exception:
        pass


def _text(exc) -> str:
    try:
        return str(exc)
    except Exception:
        return "<its __str__ raised>"


def _die_with_parent() -> None:
    """SIGKILL when the backend's process dies (Linux's PR_SET_PDEATHSIG), so that no rank
    outlives a backend killed for a timeout; elsewhere the run's process tree is ended."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
