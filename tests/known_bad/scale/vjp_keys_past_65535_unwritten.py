"""Known bug (scale): the backward pass never writes dk and dv of the keys past 65,535 (a
key block index held in 16 bits, the blocks past it never launched): their gradients
stay 0, while dq, which reads every key, is right."""

from _plant import Planted
from attention_conformance.backends.numpy import NumpyBackend

KEYS = 1 << 16


class VjpKeysPast65535Unwritten(Planted):
    """dk and dv of keys past 65,535 never written: their rows of the gradients stay 0."""

    def sdpa_vjp(self, q, k, v, d_out, **params):
        dq, dk, dv, *rest = NumpyBackend.sdpa_vjp(self, q, k, v, d_out, **params)
        dk[..., KEYS:, :] = 0          # the buffers were zeroed; these blocks never ran
        dv[..., KEYS:, :] = 0
        return (dq, dk, dv, *rest)
