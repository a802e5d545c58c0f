"""Faulty but correct: a catch-all __getattr__ answers every attribute the adapter lacks
(expected_failures_file, op_policy, versions, ...) with a function."""

from attention_conformance.backends.numpy import NumpyBackend


class CatchAllGetattr(NumpyBackend):
    name = "faulty-catch-all-getattr"

    def __getattr__(self, name):
        return lambda *args, **kwargs: None
