"""Strided inputs (a case's `layout`, model/layout.py): the views hold the input's values
with the strides the form says, NaN wherever they do not reach, and are made on the
backend's side of the process boundary, for the test's first call only; an adapter that
reads them as packed is caught (tests/known_bad/strides_read_as_packed.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from attention_conformance.backend.in_process import InProcess
from attention_conformance.model.layout import LAYOUT_KEY, call_params, split, strided

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE.parent / "known_bad"))
sys.path.append(str(HERE.parent / "process"))

from strides_read_as_packed import read_as_packed  # noqa: E402
from test_backend_proxy import isolated  # noqa: E402

A = np.arange(1.0, 25.0, dtype=np.float32).reshape(2, 3, 4)


@pytest.mark.parametrize("form, strides", [
    ({"order": [0, 2, 1]}, (48, 4, 12)),          # stored (2, 4, 3)
    ({"pad": 3}, (84, 28, 4)),                     # rows of 4 + 3
    ({"step": 2}, (96, 32, 8)),
    ({"order": [2, 0, 1], "pad": 1}, (16, 4, 32)),  # stored (4, 2, 3), rows of 3 + 1
])
def test_a_view_holds_the_values_with_the_strides_of_its_form(form, strides):
    view = strided(A, form)
    assert view.strides == strides and view.dtype == A.dtype
    np.testing.assert_array_equal(view, A)


def test_an_offset_view_starts_off_alignment_and_a_bool_mask_is_filled_with_true():
    view = strided(A, {"offset": 1})
    assert view.flags.c_contiguous and view.ctypes.data % 16 == 4
    mask = np.eye(3, dtype=bool)
    padded = strided(mask, {"pad": 2})
    np.testing.assert_array_equal(padded, mask)
    assert read_as_packed(padded).sum() > mask.sum()      # the padding reads True


@pytest.mark.parametrize("form", [{"order": [0, 2, 1]}, {"pad": 3}, {"step": 2}])
def test_what_the_view_does_not_cover_is_nan_or_read_in_the_wrong_place(form):
    packed = read_as_packed(strided(A, form))
    assert np.isnan(packed).any() or not np.array_equal(packed, A)


def test_the_layout_rides_in_the_first_calls_params_and_never_reaches_the_adapter():
    class Case:
        params, layout = {"scale": 0.5}, {"q": {"pad": 1}}
    params = call_params(Case)
    assert params == {"scale": 0.5, LAYOUT_KEY: {"q": {"pad": 1}}}
    assert split(params) == ({"q": {"pad": 1}}, {"scale": 0.5})
    Case.layout = {}
    assert call_params(Case) is Case.params


def _q_call(backend):
    q = np.ones((1, 2, 3, 4), dtype=np.float32)
    params = {"scale": 0.5, LAYOUT_KEY: {"q": {"order": [0, 2, 1, 3], "offset": 1}}}
    return backend.call("sdpa", {"q": q, "k": q, "v": q}, params)[0]


def test_an_isolated_backend_receives_the_view_made_in_its_own_process():
    proxy = isolated(f"{HERE.parent / 'faulty' / 'strides_echo.py'}:StridesEcho")
    try:
        with proxy.test() as backend:
            strides, misaligned, names, values = _q_call(backend)
    finally:
        proxy.close()
    assert strides == [96, 16, 32, 4] and misaligned == 4 and names == ["scale"]
    np.testing.assert_array_equal(values, np.ones((1, 2, 3, 4)))


def test_in_process_the_backend_receives_the_same_view():
    sys.path.append(str(HERE.parent / "faulty"))
    from strides_echo import StridesEcho
    strides, misaligned, names, _ = _q_call(InProcess(StridesEcho()))
    assert strides == [96, 16, 32, 4] and misaligned == 4 and names == ["scale"]
