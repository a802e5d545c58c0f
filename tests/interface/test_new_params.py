"""A backend written before a param or keyword input existed is unsupported for the cases
that give it, not failed: the interface grows compatibly (docs/interface.md)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from _real_spec import real_spec
from attention_conformance.backend.calling import invoke, unaccepted
from attention_conformance.backend.in_process import InProcess
from attention_conformance.backends import rules
from attention_conformance.checking.verdict import verdict_of
from attention_conformance.golden.store import GoldenStore
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


def _plain(q, k, v, mask=None, scale=None):
    """Attention that takes a boolean mask and nothing else (a framework's op), in q's dtype."""
    scale = q.dtype.type(1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    s = (q @ np.swapaxes(k, -1, -2)) * scale
    s = s if mask is None else np.where(mask, s, q.dtype.type(-np.inf))
    with np.errstate(invalid="ignore"):            # a row without keys: 0/0
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        return (p / p.sum(axis=-1, keepdims=True)) @ v


class MaskOnly:
    """An sdpa without bias, softcap or sink, its lengths and documents by rules."""

    name = "mask-only"
    dtypes = {"float64", "float32"}
    policy = {"fully_masked_rows": "nan", "masked_key_nan": "ignored",
              "masked_value_nan": "propagates", "padded_query_rows": "zeros"}

    @rules.lengths_as_mask
    def sdpa(self, q, k, v, *, mask=None, causal=None, scale=None, window=None):
        if k.shape[-3] not in (1, q.shape[-3]):
            raise NotImplementedError("no grouped-query heads")
        allowed = rules.allowed(q.shape[-2], k.shape[-2], causal, window)
        return _plain(q, k, v, rules.and_masks(mask, allowed), scale)


def test_a_method_wrapped_by_rules_is_unsupported_for_what_it_cannot_take():
    """The wrapper's **params claimed every param: a sink case called an sdpa without
    sink (TypeError, a failure). Its signature is the method's plus what it takes."""
    golden, backend = GoldenStore(), InProcess(MaskOnly())
    sinks, lengths = {}, {}
    for case in real_spec().cases:
        given = set(case.inputs) | set(case.params)
        tests = sinks if "sink" in given else lengths if {"q_lengths", "kv_lengths"} & given \
            and not {"bias", "softcap"} & given else None
        if case.op != "sdpa" or tests is None or case.topic not in ("sinks", "varlen"):
            continue
        for variant in case.variants:
            for dtype in set(case.dtypes) & MaskOnly.dtypes:
                verdict = verdict_of(backend, case, variant, dtype, golden)
                tests[case.id, variant.label, dtype] = verdict["status"], verdict["message"]
    assert sinks and all(status == "unsupported" and "the backend's sdpa takes no" in message
                         and "sink" in message for status, message in sinks.values()), sinks
    passed = [t for t, (s, _) in lengths.items() if s == "pass"]
    assert len(passed) >= 10 and all(s == "pass" or m == "no grouped-query heads"
                                     for s, m in lengths.values()), lengths


def test_every_wrapper_of_rules_shows_the_methods_keywords_and_its_own():
    class Adapter:
        name = "wrapped"

        @rules.sized()
        @rules.structure_as_mask
        def sdpa_vjp(self, q, k, v, d_out, *, mask=None, q_lengths=None):
            return q, k, v

        @rules.descaled()
        @rules.sized()
        @rules.lengths_as_mask
        def sdpa(self, q, k, v, *, mask=None, causal=None, window=None, scale=None):
            return q

    taken = {"mask", "block_mask", "q_segment_ids", "q_lengths"}
    assert unaccepted(Adapter().sdpa_vjp, [*taken, "sink", "bias", "qv"]) == \
        ["sink", "bias", "qv"]
    assert unaccepted(Adapter().sdpa, [*taken, "kv_lengths", "block_size", "qv", "scale",
                                       "q_descale", "o_scale", "sink", "softcap"]) == \
        ["sink", "softcap"]
