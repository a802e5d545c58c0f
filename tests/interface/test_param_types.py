"""Params arrive as the case's YAML gives them (docs/interface.md, "Shapes and
broadcasting"): `window` a list, an integer scale an int, an absent param not at all,
in the runner's process and across the wire to an isolated backend's."""

import numpy as np

from _real_spec import real_spec
from attention_conformance.backend.calling import invoke
from attention_conformance.process import wire


class Records:
    def __init__(self):
        self.params = None

    def sdpa(self, q, k, v, **params):
        self.params = params
        return v


def test_window_arrives_as_a_list_and_absent_params_are_not_passed():
    case = next(c for c in real_spec().cases if c.op == "sdpa" and "window" in c.params
                and "mask" not in c.inputs and "bias" not in c.inputs)
    backend = Records()
    arrays = {name: np.zeros((2, 4)) for name in ("q", "k", "v")}
    invoke(backend, "sdpa", arrays, case.params)
    assert type(backend.params["window"]) is list and len(backend.params["window"]) == 2
    assert set(backend.params) == set(case.params)


def test_the_wire_keeps_lists_ints_floats_and_none():
    params = {"window": [2, None], "scale": 1, "softcap": 30.0, "causal": None}
    buffers = []
    back = wire._decode(wire._encode(params, buffers), buffers)
    assert back == params
    assert type(back["window"]) is list and type(back["scale"]) is int


def test_what_is_not_plain_data_crosses_the_wire_as_its_type_name_alone():
    import collections

    import numpy as np

    class Text(str):
        pass

    pair = collections.namedtuple("Pair", "a b")
    sent = {"keys": {1: "one"}, "text": Text("x"), "pair": pair(1, 2), "scalar": np.float32(1),
            "set": {1}, "matrix": np.asmatrix(np.eye(2)), "float128": np.zeros(2, np.longdouble)}
    buffers = []
    back = wire._decode(wire._encode(sent, buffers), buffers)
    assert all(isinstance(v, wire.Foreign) for v in back.values()), back
    assert back["matrix"].subclass and not back["keys"].subclass
    assert {k: v.type_name for k, v in back.items()} == {
        "keys": "builtins.dict", "text": f"{__name__}.Text", "pair": f"{__name__}.Pair",
        "scalar": "numpy.float32", "set": "builtins.set", "matrix": "numpy.matrix",
        "float128": "numpy.ndarray of dtype float128"}


def test_multi_head_attention_broadcasts_the_batch_dims_of_query_key_and_value():
    import numpy as np

    from attention_conformance.golden import reference
    from attention_conformance.model.ops import output_shapes

    shapes = {"query": (2, 3, 4), "key": (1, 5, 4), "value": (5, 4), "w_q": (4, 4),
              "w_k": (4, 4), "w_v": (4, 4), "w_o": (4, 6)}
    params = {"num_heads": 2}
    assert output_shapes("multi_head_attention", shapes, params) == ((2, 3, 6),)
    rng = np.random.RandomState(0)
    arrays = {n: rng.normal(size=s) for n, s in shapes.items()}
    [out] = reference.run("multi_head_attention", arrays, params)
    alone = reference.run("multi_head_attention", dict(arrays, query=arrays["query"][1]), params)[0]
    assert out.shape == (2, 3, 6) and np.allclose(out[1], alone)


def test_the_api_gives_both_tolerance_tiers():
    from attention_conformance.api import load_case

    case = load_case("precision-pv-sum-over-1024-keys")
    for dtype in ("float16", "bfloat16"):
        loose = case.tolerance(dtype)["out"]
        tight = case.tolerance(dtype, accumulation="float32")["out"]
        assert tight < loose / 2, (dtype, tight, loose)
    assert case.tolerance("float32") == case.tolerance("float32", accumulation="float32")
