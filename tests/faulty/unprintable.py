"""Faulty: sdpa raises an exception whose __str__ itself raises."""

from attention_conformance.backends.numpy import NumpyBackend


class Unprintable(Exception):
    def __str__(self):
        raise ValueError("no message for you")


class RaisesUnprintable(NumpyBackend):
    name = "faulty-raises-unprintable"

    def sdpa(self, q, k, v, **kw):
        raise Unprintable()
