"""tests/_session_shared.py: a value several tests need is computed once per session."""

import pytest
from _session_shared import once, session_root


def test_a_value_is_computed_once_and_read_back_alike(tmp_path_factory):
    calls = []

    def compute():
        calls.append(1)
        return ["caught", "message"]

    first = once(tmp_path_factory, "selftest/value", compute, tuple, list)
    again = once(tmp_path_factory, "selftest/value", compute, tuple, list)
    assert first == ["caught", "message"] and again == first and calls == [1]
    assert (session_root(tmp_path_factory) / "selftest" / "value.json").exists()


def test_a_computation_that_raises_leaves_nothing_behind(tmp_path_factory):
    def broken():
        raise ValueError("planted")

    with pytest.raises(ValueError, match="planted"):
        once(tmp_path_factory, "selftest/broken", broken)
    assert once(tmp_path_factory, "selftest/broken", lambda: 3) == 3
