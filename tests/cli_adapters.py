"""Known-bad and partial adapters for the tests of the command line, reports and fuzzing.

Loaded by path (tests/cli_adapters.py:NAME), as a user's own adapter would be.
"""

from attention_conformance.backends.numpy import NumpyBackend


class WrongDefaultScale(NumpyBackend):
    """The NumPy backend with a classic slip: the default scale is 1/d_k instead of
    1/sqrt(d_k). Right whenever a scale is given, and wherever d_k = 1."""

    name = "bad-scale"

    def _fix(self, q, scale):
        return 1.0 / q.shape[-1] if scale is None else scale

    def attention_weights(self, q, k, *, scale=None, **kw):
        return super().attention_weights(q, k, scale=self._fix(q, scale), **kw)

    def sdpa(self, q, k, v, *, scale=None, **kw):
        return super().sdpa(q, k, v, scale=self._fix(q, scale), **kw)

    def sdpa_vjp(self, q, k, v, d_out, *, scale=None, **kw):
        return super().sdpa_vjp(q, k, v, d_out, scale=self._fix(q, scale), **kw)


class WrongEmptyRowPolicy(NumpyBackend):
    """Declares that a query with no allowed key gets the mean of V (uniform weights),
    but returns zeros there, as the NumPy backend does."""

    name = "bad-policy"

    def __init__(self):
        super().__init__()
        self.policy = dict(self.policy, fully_masked_rows="uniform")


class Float32Only(NumpyBackend):
    """A partial backend: float64 and float32 only, and no self_attention."""

    name = "partial"
    dtypes = frozenset({"float64", "float32"})

    def self_attention(self, *args, **kwargs):
        raise NotImplementedError("partial: no self_attention")


class RaisingSoftmax(NumpyBackend):
    """Its softmax raises from inside a helper: a failure with a traceback."""

    name = "raising-softmax"

    def softmax(self, x, axis=-1):
        return _kernel(x)


def _kernel(x):
    raise RuntimeError(f"softmax kernel failed on shape {x.shape}")


class ThreadsSeen(NumpyBackend):
    """The NumPy backend that reports, in its versions, the thread variables its process
    started with."""

    name = "threads-seen"

    def __init__(self):
        import os

        super().__init__()
        self.versions = dict(self.versions, **{
            name: os.environ.get(name, "unset") for name in ("OMP_NUM_THREADS",
                                                             "OPENBLAS_NUM_THREADS")})
