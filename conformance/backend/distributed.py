"""A sharded case's call: the inputs split over W ranks, each rank's outputs gathered back.

A case with the `sharding` param (model/sharding.py) is computed by the backend's
distributed form, which it declares as `distributed`:

- ``"torch.distributed"``: the suite starts W rank processes (torch.multiprocessing,
  forked from the backend's process), joins them in one gloo process group (the default
  group, through a TCP store on the loopback that rank 0 serves), and calls the adapter's op in each with that
  rank's shard and ``shard=`` its place (backend/rank.py); each returns its rows;
- ``"jax.distributed"``: the same W forked ranks, each made one process of a JAX cluster
  (jax.distributed, a coordinator on the loopback, gloo CPU collectives) instead;
- ``"spmd"``: one call in the backend's own process with every rank's shard stacked on a
  new leading axis (W, ...), as ``shard_map`` takes them; it returns its outputs stacked.

The group is the test's: a rank that dies (a signal, an exit) or raises ends every rank
at once, and a rank that dies is one crash of the test (RankCrashed); a group that hangs
or deadlocks is ended with the backend's process by --case-timeout. No rank outlives
its call. A backend that declares no distributed form is unsupported for sharded cases.
"""

from __future__ import annotations

import signal

import numpy as np

from ..model.dtypes import dtype_name, numpy_dtype, output_dtype
from ..model.layout import split as split_layout, views as strided_views
from ..model.errors import BackendCrashed, BackendRaised, CheckFailure, SuiteError, Unsupported
from ..model.ops import OPS, output_shapes, outputs_for
from ..model.sharding import FORMS, Sharding, gather, shard_description, shard_inputs, shard_shape
from .calling import assert_unchanged, invoke, output_tuple, snapshot, unaccepted, unaccepted_text
from .interface import really_has

#: how often the suite looks at its ranks while they run (seconds)
POLL = 0.05


class RankCrashed(BackendCrashed):
    """A rank's process died during a sharded call: the whole group was ended."""


class GroupUnformed(SuiteError):
    """A rank could not join its group (the suite's rendezvous on the loopback, before the
    backend's method is called): tried once more, then the suite's error, not a fail."""


def dispatch(adapter, op: str, arrays: dict, params: dict):
    """Call the adapter's op: sharded over its ranks when the case gives `sharding`, its
    inputs made the strided views of the case's layout when the call carries one
    (model/layout.py: here, on the backend's side of the process boundary)."""
    layout, params = split_layout(params)
    arrays = strided_views(arrays, layout)
    if "sharding" in params:
        return invoke_sharded(adapter, op, arrays, params)
    return invoke(adapter, op, arrays, params)


def declared_form(adapter) -> str:
    """The adapter's distributed form, or Unsupported with the reason."""
    form = getattr(adapter, "distributed", None) if really_has(adapter, "distributed") else None
    if not isinstance(form, str) or form not in FORMS:
        raise Unsupported("the backend declares no distributed form (`distributed` = "
                          f"{' or '.join(map(repr, FORMS))}): a sharded case needs one")
    return form


def invoke_sharded(adapter, op: str, arrays: dict, params: dict):
    """The op's raw result put back together from its ranks (a tuple for several outputs).
    Unsupported, BackendRaised or CheckFailure as calling.invoke; RankCrashed."""
    form = declared_form(adapter)
    sharding = Sharding.of(params["sharding"])
    rest = {k: v for k, v in params.items() if k != "sharding"}
    method = getattr(adapter, op, None)
    if method is None:
        raise Unsupported(f"backend has no method {op!r}")
    missing = unaccepted(method, [n for n in arrays if n not in OPS[op].positional]
                         + [*rest, "shard"])
    if missing:
        raise Unsupported(unaccepted_text(op, missing))
    shards, places = shard_inputs(sharding, arrays)
    before = snapshot(arrays)
    if form == "spmd":
        results = _spmd(method, op, shards, places, sharding, rest)
    else:
        try:
            results = _ranks(form, method, op, shards, places, sharding, rest)
        except GroupUnformed:       # a loopback rendezvous that failed (a peer's port taken
            results = _ranks(form, method, op, shards, places, sharding, rest)    # meanwhile)
    assert_unchanged(before, arrays)
    return _gathered(op, arrays, params, results, places)


def _positional(op, shard: dict) -> tuple[list, dict]:
    positional = OPS[op].positional
    return [shard[n] for n in positional], {n: a for n, a in shard.items() if n not in positional}


def _spmd(method, op, shards, places, sharding, params) -> list[tuple]:
    stacked = {name: np.stack([s[name] for s in shards]) for name in shards[0]}
    args, keywords = _positional(op, stacked)
    try:
        result = method(*args, **keywords, **params,
                        shard=shard_description(sharding, places, None))
    except NotImplementedError as exc:
        raise Unsupported(str(exc) or type(exc).__name__) from None
    except (KeyboardInterrupt, Exception) as exc:
        raise BackendRaised(exc) from exc
    outputs = output_tuple(op, shards[0], result)
    for name, value in zip(outputs_for(op, shards[0]), outputs):
        if not isinstance(value, np.ndarray) or value.shape[:1] != (sharding.world_size,):
            raise CheckFailure(f"output {name} of the spmd form must be a NumPy array stacked "
                               f"over the {sharding.world_size} ranks (axis 0), got "
                               f"{getattr(value, 'shape', type(value).__name__)}")
    return [tuple(o[r] for o in outputs) for r in range(sharding.world_size)]


def _ranks(form, method, op, shards, places, sharding, params) -> list[tuple]:
    from . import rank         # torch or jax is imported by the rank's form, never by the suite

    world, started = sharding.world_size, []
    store = rank.open_store() if form == "torch.distributed" else None
    port = rank.free_port() if store is None else store.getsockname()[1]
    try:
        context = rank.context(form)
        for r, shard in enumerate(shards):
            args, keywords = _positional(op, shard)
            receive, send = context.Pipe(duplex=False)
            job = rank.Job(form, r, world, port, -1 if store is None else store.fileno(),
                           shard_description(sharding, places, r))
            process = context.Process(target=rank.main, daemon=True,
                                      args=(job, method, args, {**keywords, **params}, send))
            process.start()
            send.close()
            started.append((process, receive))
        if store is not None:
            store.close()       # rank 0 holds it now
        answers = _answers(started, op, world)
        failed = [r for r, a in enumerate(answers) if a is not None and a[0] != "outputs"]
        for r in failed[:1]:
            _result(op, shards[r], r, world, answers[r])     # raises what the rank said
        return [_result(op, shards[r], r, world, answer) for r, answer in enumerate(answers)]
    finally:
        _end(started)
        if store is not None:
            store.close()


def _answers(started, op, world) -> list:
    """Each rank's answer, in rank order. A rank that dies without answering is a
    RankCrashed; the first answer that is no outputs ends the wait (the others may wait
    on that rank forever: the group is then ended by _end)."""
    from multiprocessing.connection import wait

    answers = [None] * world
    while any(a is None for a in answers):
        waiting = [r for r in range(world) if answers[r] is None]
        ready = set(wait([started[r][1] for r in waiting] + [started[r][0].sentinel for r in waiting],
                         timeout=POLL))
        for r in waiting:
            process, receive = started[r]
            if receive in ready or process.sentinel in ready:
                answers[r] = _receive(receive)
                if answers[r] is None:
                    _died(process, r, world, op)
        if any(a is not None and a[0] != "outputs" for a in answers):
            _crash_behind(started, answers, op, world)
            return answers
    return answers


def _receive(receive):
    """The rank's answer, or None when it has none (its end of the pipe closed)."""
    try:
        return receive.recv() if receive.poll() else None
    except (EOFError, OSError):
        return None


def _died(process, r, world, op) -> None:
    """RankCrashed if the rank has ended without answering."""
    process.join(1)
    if process.exitcode is not None:
        raise RankCrashed(f"rank {r} of {world} died during {op} "
                          f"({_ending(process.exitcode)}); its group of {world} ranks "
                          "was ended")


#: how long a rank's failure waits for another rank's death behind it (a rank killed in a
#: collective makes its peers raise a gloo error first: the death is the test's status)
GRACE = 0.5


def _crash_behind(started, answers, op, world) -> None:
    from multiprocessing.connection import wait

    silent = [r for r in range(world) if answers[r] is None]
    ended = set(wait([started[r][0].sentinel for r in silent], timeout=GRACE))
    for r in silent:
        process, receive = started[r]
        if process.sentinel in ended:   # its files are closed, but it may not be reaped yet
            process.join(GRACE)
        if not process.is_alive():
            answers[r] = _receive(receive)
            if answers[r] is None:
                _died(process, r, world, op)


def _ending(code) -> str:
    if code is None:
        return "it stopped answering"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"it exited with code {code} before answering"


def _result(op, shard, r, world, answer) -> tuple:
    """A rank's outputs, or the exception its answer stands for."""
    if answer is None:
        raise CheckFailure(f"rank {r} of {world} gave no answer")   # another rank failed first
    kind, *rest = answer
    if kind == "unformed":
        raise GroupUnformed(f"rank {r} of {world} could not join its group: {rest[0]}")
    if kind == "unsupported":
        raise Unsupported(f"rank {r} of {world}: {rest[0]}")
    if kind == "raised":
        raise BackendRaised.remote(f"rank {r} of {world} raised {rest[0]}", rest[1])
    return output_tuple(op, shard, rest[0])


def _end(started) -> None:
    """Every rank ended and reaped (killed if it is still running)."""
    for process, receive in started:
        if process.is_alive():
            process.kill()
        receive.close()
    for process, _ in started:
        process.join()


def _gathered(op, arrays, params, results, places):
    """The whole outputs from each rank's rows (CheckFailure for a rank's wrong output)."""
    names = outputs_for(op, arrays)
    shapes = output_shapes(op, {n: a.shape for n, a in arrays.items()}, params)
    whole = []
    for i, (name, shape) in enumerate(zip(names, shapes)):
        parts, dtype = [], numpy_dtype(output_dtype(dtype_name(arrays["q"].dtype), name, params))
        for r, outputs in enumerate(results):
            part, expected = outputs[i], shard_shape(name, shape, places, r)
            if not isinstance(part, np.ndarray) or part.shape != expected or part.dtype != dtype:
                got = (f"{part.dtype} {part.shape}" if isinstance(part, np.ndarray)
                       else type(part).__name__)
                raise CheckFailure(f"rank {r}'s output {name} must be a NumPy array {dtype} "
                                   f"{expected} (its rows), got {got}")
            parts.append(part)
        whole.append(gather(name, parts, places, shape))
    return whole[0] if len(whole) == 1 else tuple(whole)
