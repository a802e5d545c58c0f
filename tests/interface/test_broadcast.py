"""model/shapes.broadcast, which the shapes of every output are checked with, is NumPy's
broadcast_shapes: the same shape, or a ValueError, for every shape it is given."""

import itertools
import random

import numpy as np
import pytest

from attention_conformance.model.shapes import broadcast

#: every shape of rank 0 to 3 with dims 0 to 3
SHAPES = [shape for rank in range(4) for shape in itertools.product(range(4), repeat=rank)]


def _numpy(*shapes):
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        return ValueError


def _ours(*shapes):
    try:
        result = broadcast(*shapes)
    except ValueError:
        return ValueError
    assert type(result) is tuple and all(type(size) is int for size in result)
    return result


def test_every_pair_of_small_shapes_broadcasts_as_numpys():
    for a, b in itertools.product(SHAPES, repeat=2):
        assert _ours(a, b) == _numpy(a, b), (a, b)


def test_threes_and_ones_and_none_broadcast_as_numpys():
    draw = random.Random(0)
    for _ in range(5000):
        shapes = [draw.choice(SHAPES) for _ in range(3)]
        assert _ours(*shapes) == _numpy(*shapes), shapes
    assert _ours((2, 1), [3, 1, 4], (np.int64(1), 4)) == _numpy((2, 1), [3, 1, 4], (1, 4))
    assert _ours((5,)) == (5,) and _ours() == () == _numpy()


@pytest.mark.parametrize("shapes", [((-1,), (1,)), ((2, -3),), ((1,), (1, -1))])
def test_a_negative_dim_does_not_broadcast(shapes):
    assert _ours(*shapes) is ValueError is _numpy(*shapes)
