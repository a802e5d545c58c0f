"""Faulty declarations: each is one clear error when the backend is loaded."""

from attention_conformance.backends.numpy import NumpyBackend


class DtypesString(NumpyBackend):
    name = "faulty-dtypes-string"
    dtypes = "float32"


class CatchAll:
    """Answers every attribute, the interface's included, with a function."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class UnknownPolicy(NumpyBackend):
    name = "faulty-unknown-policy"

    def __init__(self):
        super().__init__()
        self.policy = {"fully_masked_rows": "zeros", "masked_rows": "nan"}
