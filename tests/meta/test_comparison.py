"""The comparison's worst error names its position as NumPy would (np.unravel_index of
the first largest error), in every shape, the 0-d and the singleton axes included."""

from __future__ import annotations

import numpy as np
import pytest

from attention_conformance.checking.comparison import compare, worst_error


@pytest.mark.parametrize("shape", [(), (1,), (5,), (2, 3), (3, 1, 4), (1, 2, 1, 5)])
def test_the_worst_error_is_at_numpys_index_of_it(shape):
    rng = np.random.RandomState(3)
    expected = rng.standard_normal(shape)
    for flat in range(expected.size):
        actual = expected.copy()
        actual.flat[flat] += 1.0
        actual.flat[(flat + 1) % expected.size] += 1.0 if expected.size > 1 else 0.0
        error, index, pattern = worst_error(actual, expected)
        want = tuple(int(i) for i in np.unravel_index(int(np.argmax(np.abs(actual - expected))),
                                                      shape))
        assert (index, pattern) == (want, "") and all(type(i) is int for i in index)
        assert error == np.abs(actual - expected)[want]
        assert compare(actual, expected, 0.5).actual == float(actual[want])


def test_beside_matching_infinities_the_worst_finite_error_is_named_the_same():
    expected = np.array([[np.inf, 1.0, 2.0], [3.0, -np.inf, 4.0]])
    actual = expected + np.array([[0.0, 0.1, 0.0], [0.0, 0.0, 0.3]])
    error, index, pattern = worst_error(actual, expected)
    assert (index, pattern) == ((1, 2), "") and all(type(i) is int for i in index)
    assert error == np.abs(actual[1, 2] - expected[1, 2])
