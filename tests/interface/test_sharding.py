"""The `sharding` param (model/sharding.py) and a sharded call's plumbing
(backend/distributed.py) without any framework: which tokens each rank holds, the cases
that cannot be sharded, and the spmd form's shards stacked in and gathered back."""

import numpy as np
import pytest

from attention_conformance.backend.in_process import InProcess
from attention_conformance.backend.resolve import load_backend
from attention_conformance.backends.numpy import NumpyBackend
from attention_conformance.golden import reference
from attention_conformance.model.errors import CheckFailure, Unsupported
from attention_conformance.model.sharding import Sharding, case_problems


def _split(param, length, side="q"):
    return [p.tolist() for p in Sharding.of(param).split(length, side)]


def test_contiguous_zigzag_and_explicit_positions():
    assert _split({"world_size": 2}, 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert _split({"world_size": 2, "scheme": "zigzag"}, 8) == [[0, 1, 6, 7], [2, 3, 4, 5]]
    assert _split({"world_size": 4, "scheme": "zigzag"}, 8) == [[0, 7], [1, 6], [2, 5], [3, 4]]
    striped = {"world_size": 2, "positions": [[0, 2], [1, 3]], "kv_positions": [[3, 0], [1, 2]]}
    assert _split(striped, 4) == [[0, 2], [1, 3]] and _split(striped, 4, "kv") == [[3, 0], [1, 2]]


@pytest.mark.parametrize("param, length, text", [
    ({"world_size": 3}, 8, "contiguous sharding over 3 ranks needs Lq divisible by 3"),
    ({"world_size": 2, "scheme": "zigzag"}, 6, "needs Lq divisible by 4 (2W chunks)"),
    ({"world_size": 2, "positions": [[0, 1], [1, 2]]}, 4, "must list each of the 4 positions"),
    ({"world_size": 2, "positions": [[0], [1, 2]]}, 3, "every rank holds as many"),
    ({"world_size": 2, "scheme": "zigzag", "positions": [[0], [1]]}, 4, "only with scheme explicit"),
])
def test_a_sharding_that_cannot_split_says_why(param, length, text):
    assert text in Sharding.of(param).problem(length, "q")


def test_a_sharded_case_takes_no_mask_and_only_the_sdpa_ops():
    shapes = {"q": (1, 4, 2), "k": (1, 4, 2), "v": (1, 4, 2), "mask": (4, 4)}
    problems = case_problems("sdpa", shapes, {"sharding": {"world_size": 2}})
    assert problems == ["a sharded case takes no mask (its key axis would be split too)"]
    assert case_problems("attention_weights", shapes, {"sharding": {"world_size": 2}}) == \
        ["sharding applies to sdpa, sdpa_lse, sdpa_vjp, not attention_weights"]


class StackedNumpy:
    """The spmd form on NumPy: the whole sequence put back from the stacked shards, one
    single-device sdpa_lse, each rank's rows stacked again."""

    name = "stacked-numpy"
    dtypes = {"float64"}
    policy = dict(NumpyBackend().policy)
    distributed = "spmd"

    def sdpa_lse(self, q, k, v, *, causal=None, shard):
        assert shard["rank"] is None and q.shape[0] == shard["world_size"]
        qp, kp = (np.concatenate(shard[n]) for n in ("q_positions", "kv_positions"))
        whole = [np.empty_like(np.concatenate(list(a), axis=-2)) for a in (q, k, v)]
        for target, stacked, places in zip(whole, (q, k, v), (qp, kp, kp)):
            target[..., places, :] = np.concatenate(list(stacked), axis=-2)
        out, lse = NumpyBackend().sdpa_lse(*whole, causal=causal)
        rows = shard["q_positions"]
        return (np.stack([out[..., r, :] for r in rows]), np.stack([lse[..., r] for r in rows]))


class Unstacked(StackedNumpy):
    def sdpa_lse(self, q, k, v, **params):
        return tuple(o[0] for o in super().sdpa_lse(q, k, v, **params))


def _arrays():
    rng = np.random.default_rng(1)
    return {n: rng.normal(size=(2, 8, 3)) for n in "qkv"}


def test_the_spmd_form_gets_stacked_shards_and_its_rows_are_gathered():
    params = {"causal": "top_left", "sharding": {"world_size": 2, "scheme": "zigzag"}}
    out, lse = InProcess(StackedNumpy()).call("sdpa_lse", _arrays(), params)
    expected = reference.run("sdpa_lse", _arrays(), params)
    np.testing.assert_allclose(out, expected[0], atol=1e-12)
    np.testing.assert_allclose(lse, expected[1], atol=1e-12)


def test_spmd_outputs_not_stacked_fail_and_no_form_is_unsupported():
    params = {"sharding": {"world_size": 2}}
    with pytest.raises(CheckFailure, match="rank 0.s output out must be a NumPy array float64 .2, 4, 3."):
        InProcess(Unstacked()).call("sdpa_lse", _arrays(), params)
    with pytest.raises(Unsupported, match="declares no distributed form"):
        InProcess(load_backend("numpy")).call("sdpa_lse", _arrays(), params)


def test_documents_and_block_masks_shard_and_lengths_do_not():
    shapes = {"q": (1, 2, 8, 4), "k": (1, 2, 8, 4), "v": (1, 2, 8, 4)}
    structure = {"q_segment_ids": [0] * 3 + [1] * 5, "kv_segment_ids": [0] * 3 + [1] * 5,
                 "block_mask": [[1, 0], [1, 1]], "block_size": [4, 4]}
    assert case_problems("sdpa", shapes, {"sharding": {"world_size": 2}, **structure}) == []
    assert case_problems("sdpa", shapes, {"sharding": {"world_size": 2}, "q_lengths": [8]}) == \
        ["a sharded case takes no q_lengths (its distributed form is not specified)"]


@pytest.mark.parametrize("param", [{"world_size": 2}, {"world_size": 4, "scheme": "zigzag"},
                                   {"world_size": 2, "positions": [[0, 1, 6, 7], [2, 3, 4, 5]]}])
def test_shard_allowed_is_the_whole_mask_read_at_global_positions(param):
    from attention_conformance.backends import rules

    ids = [[0, 0, 0, 1, 1, 1, 1, 2], [0, 1, 1, 1, 1, 1, 2, 2]]
    blocks = [[[1, 0, 0, 0], [1, 1, 0, 1], [0, 1, 1, 0], [1, 0, 1, 1]]]     # (1, 4, 4): heads
    params = {"q_segment_ids": ids, "kv_segment_ids": ids, "block_mask": blocks,
              "block_size": [2, 2]}
    whole = rules.and_masks(rules.allowed(8, 8, "top_left", [3, 0]),
                            rules.structure_mask(None, (2, 1, 8, 4), (2, 1, 8, 4), **params))
    places = {s: Sharding.of(param).split(8, s) for s in ("q", "kv")}
    shard = {"rank": None, "world_size": param["world_size"],
             "q_positions": [p.tolist() for p in places["q"]],
             "kv_positions": [p.tolist() for p in places["kv"]]}
    for rank in range(param["world_size"]):
        for source in range(param["world_size"]):
            got = rules.shard_allowed(shard, source, 4, rank=rank, causal="top_left",
                                      window=[3, 0], **params)
            rows, cols = places["q"][rank], places["kv"][source]
            assert np.array_equal(np.broadcast_to(got, (2, 1, len(rows), len(cols))),
                                  whole[..., rows[:, None], cols[None, :]])
