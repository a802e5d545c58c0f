"""The ONNX backends build one model a signature (shapes, dtypes, attributes) and reuse
its session; what the cache keys on changes the model."""

import numpy as np
import pytest

pytest.importorskip("onnx")


@pytest.fixture(params=[("onnxruntime", "OnnxruntimeBackend"),
                        ("onnx_reference", "OnnxReferenceBackend")], ids=lambda p: p[0])
def backend(request):
    module, cls = request.param
    if module == "onnxruntime":
        pytest.importorskip("onnxruntime")
    return getattr(pytest.importorskip(f"attention_conformance.backends.{module}"), cls)()


def test_one_session_per_signature(backend):
    r = np.random.RandomState(0)
    q, k, v = (r.randn(2, 3, 4).astype(np.float32) for _ in range(3))
    first = backend.sdpa(q, k, v)
    assert len(backend._sessions) == 1
    again = backend.sdpa(q + 1, k, v)                       # same signature: reused
    assert len(backend._sessions) == 1
    assert not np.array_equal(first, again)                 # and it ran on the new inputs
    backend.sdpa(q, k, v, scale=0.5)                        # an attribute: a new model
    backend.sdpa(q[:, :2], k, v)                            # a shape: a new model
    backend.sdpa(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))  # a dtype
    assert len(backend._sessions) == 4
    assert np.array_equal(backend.sdpa(q, k, v), first)     # the first model, reused
    assert len(backend._sessions) == 4
