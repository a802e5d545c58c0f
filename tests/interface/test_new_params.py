"""A backend written before a param or keyword input existed is unsupported for the cases
that give it, not failed: the interface grows compatibly (docs/interface.md)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from attention_conformance.backend.calling import invoke, unaccepted
from attention_conformance.model.errors import Unsupported
from attention_conformance.process import protocol
from attention_conformance.process.backend_host import answer


class Older:
    """An sdpa of the interface before q_lengths, kv_lengths and sink."""

    def sdpa(self, q, k, v, *, mask=None, bias=None, causal=None, scale=None,
             softcap=None, window=None):
        return q


class TakesAnything:
    def sdpa(self, q, k, v, **params):
        return q


def _wrapped(method):
    @functools.wraps(method)
    def wrapper(self, q, k, v, *, q_lengths=None, **params):
        return method(self, q, k, v, **params)
    return wrapper


class Wrapped:
    """A decorator that takes the new param in front of an older method (its __wrapped__
    signature lacks it: the wrapper's own is the one called)."""

    @_wrapped
    def sdpa(self, q, k, v, *, mask=None):
        return q


ARRAYS = {name: np.zeros((2, 3, 4)) for name in ("q", "k", "v")}


@pytest.mark.parametrize("params, sink", [({"q_lengths": [1, 2]}, False),
                                          ({"causal": "top_left"}, True)])
def test_an_older_backend_is_unsupported_for_what_it_cannot_take(params, sink):
    arrays = {**ARRAYS, **({"sink": np.zeros(3)} if sink else {})}
    missing = "sink" if sink else "q_lengths"
    with pytest.raises(Unsupported, match=f"the backend's sdpa takes no {missing}"):
        invoke(Older(), "sdpa", arrays, params)
    reply = answer(Older(), protocol.Call(7, "sdpa", arrays, params), lambda: (None, None))
    assert reply == protocol.Unsupported(7, None, None, f"the backend's sdpa takes no {missing}")


def test_a_backend_that_takes_the_params_is_called():
    params = {"q_lengths": [1, 2], "causal": None}
    assert unaccepted(TakesAnything().sdpa, ["q_lengths", "sink"]) == []
    assert unaccepted(Wrapped().sdpa, ["q_lengths", "mask"]) == []
    assert unaccepted(Older().sdpa, ["mask", "q_lengths", "window"]) == ["q_lengths"]
    out = invoke(TakesAnything(), "sdpa", ARRAYS, params)
    assert out is ARRAYS["q"]
