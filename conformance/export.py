"""Export golden data as plain files that another project reads without this package.

Layout of the export folder (docs/cli.md and the README.md written into it say more):

    README.md                 the format, and a loader in a dozen lines of NumPy
    index.json                every case: op, params, expectations, and its files
    TOPIC/CASE-ID/LABEL.npz   one per variant and dtype (LABEL as in the test ids)
    TOPIC/CASE-ID/LABEL.json  the same in JSON, with --format json

Each data file holds ``inputs/NAME`` (as the backend receives them: the dtype itself, but
bfloat16 stored as float32, which holds every bfloat16 value exactly), ``expected/OUT``
(float64) and ``tolerance/OUT`` (the largest absolute error allowed); a case whose
outcome is a declared policy has ``expected/POLICY=CHOICE/OUT`` and
``tolerance/POLICY=CHOICE/OUT`` instead or as well.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np

from .api import GoldenCase
from .golden_compute import golden_entries
from .golden_store import GoldenStore, write_npz
from .ops import OPS
from .results import spec_hash, suite_version

FORMAT = "attention-conformance-golden/1"
FORMATS = ("npz", "json")


def _stored(array: np.ndarray) -> np.ndarray:
    """An array as written to the file: bfloat16 (not a NumPy type) becomes float32."""
    if array.dtype == bool or array.dtype in (np.float64, np.float32, np.float16):
        return array
    return array.astype(np.float32)


def _json_number(x: float):
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x


def jsonable(value):
    """value with every non-finite float written as a string (JSON has no NaN)."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float):
        return _json_number(value)
    return value


def json_array(array: np.ndarray, dtype: str | None = None) -> dict:
    """{dtype, shape, data}; data nested lists, non-finite numbers as strings."""
    array = np.asarray(array)
    if array.dtype == bool:
        data = array.tolist()
        kind = "bool"
    else:
        flat = [_json_number(float(x)) for x in array.astype(np.float64).ravel()]
        data = np.array(flat, dtype=object).reshape(array.shape).tolist() if array.ndim else flat[0]
        kind = dtype or str(array.dtype)
    return {"dtype": kind, "shape": list(array.shape), "data": data}


def _label(variant, dtype) -> str:
    return f"{variant.label}-{dtype}" if variant.label else dtype


def _entry(golden: GoldenCase, variant, dtype, directory: Path, relative: str, fmt: str):
    """Write one variant x dtype of a case; return its index entry."""
    arrays = golden.inputs(dtype, variant.label)
    stored = {f"inputs/{n}": _stored(a) for n, a in arrays.items()}
    expected_sets = []
    rule = golden.store.tolerances
    for policy in golden_entries(golden.case):
        prefix = "" if policy is None else f"{policy[0]}={policy[1]}/"
        data = golden.store.get(golden.case, variant, dtype, policy)
        outputs = {}
        for name, (gold, plain_error) in data.items():
            tol = rule.output(dtype, plain_error, gold)
            stored[f"expected/{prefix}{name}"] = np.asarray(gold, dtype=np.float64)
            stored[f"tolerance/{prefix}{name}"] = np.array(tol)
            outputs[name] = {"shape": list(np.shape(gold)), "tolerance": tol}
        expected_sets.append({"policy": None if policy is None else prefix[:-1],
                              "outputs": outputs})
    path = directory / f"{_label(variant, dtype)}.{fmt}"
    if fmt == "npz":
        write_npz(path, stored)
    else:
        doc = {"case": golden.id, "variant": variant.label, "dtype": dtype,
               "params": jsonable(golden.params)}
        for key, value in stored.items():
            group, _, name = key.partition("/")
            if group == "tolerance":
                doc.setdefault(group, {})[name] = float(value)
            else:
                kind = dtype if (group == "inputs" and value.dtype != bool) else None
                doc.setdefault(group, {})[name] = json_array(
                    value, kind if group == "inputs" else "float64")
        path.write_text(json.dumps(doc, allow_nan=False) + "\n")
    return {"file": f"{relative}/{path.name}", "variant": variant.label,
            "dims": dict(variant.dims), "dtype": dtype,
            "inputs": {n: {"shape": list(a.shape),
                           "stored_as": str(_stored(a).dtype)} for n, a in arrays.items()},
            "expected": expected_sets}


def export(cases, directory: Path, fmt: str = "npz", *, golden_dir: Path,
           dtypes=None, spec_dir: Path | None = None, progress=None) -> dict:
    """Write every case (and each of its variants and dtypes) into directory; return the
    index. progress(done, total, case_id) is called after each case."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, not {fmt!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    store = GoldenStore(Path(golden_dir))
    index = {"format": FORMAT, "data_format": fmt, "suite_version": suite_version(),
             "spec_hash": spec_hash(spec_dir) if spec_dir else None,
             "tolerance_rule": "|actual - expected| <= tolerance at every position where "
                               "expected is finite; NaN and +-inf must sit exactly where "
                               "expected has them",
             "cases": []}
    cases = list(cases)
    for done, case in enumerate(cases, 1):
        golden = GoldenCase(case, store)
        relative = f"{case.topic}/{case.id}"
        case_dir = directory / relative
        if case_dir.exists():
            shutil.rmtree(case_dir)
        case_dir.mkdir(parents=True)
        entries = [_entry(golden, variant, dtype, case_dir, relative, fmt)
                   for variant in case.variants for dtype in case.dtypes
                   if not dtypes or dtype in dtypes]
        index["cases"].append({
            "id": case.id, "topic": case.topic, "op": case.op,
            "description": case.description, "source": case.source,
            "positional": list(OPS[case.op].positional), "outputs": list(OPS[case.op].outputs),
            "params": jsonable(golden.params), "dtypes": list(case.dtypes),
            "expect": jsonable(case.expect),
            "golden": golden.has_golden, "entries": entries})
        if progress:
            progress(done, len(cases), case.id)
    (directory / "index.json").write_text(json.dumps(index, indent=1, allow_nan=False) + "\n")
    (directory / "README.md").write_text(README)
    return index


README = '''\
# Golden attention data (attention-conformance export)

Written by `attention-conformance export`. Everything here is plain files: reading them
needs NumPy (the `.npz` files) or any JSON reader (the `.json` files), not the
attention-conformance package.

## Files

- `index.json`: `format` ("attention-conformance-golden/1"), `spec_hash`, the tolerance
  rule, and `cases`: for each case its `id`, `topic`, `op` (the attention operation),
  `description`, `source`, `positional` (the op's positional inputs, in order),
  `outputs` (output names: `out`, or `dq`, `dk`, `dv` for `sdpa_vjp`), `params` (the op's
  keyword parameters: `causal`, `scale`, `window`, ...), `expect` (the case's
  expectations as the spec writes them, e.g. exact values) and `entries`, one per shape
  variant and dtype: `file`, `variant`, `dims`, `dtype`, `inputs` (shape and storage
  dtype of each input) and `expected` (for each policy branch, or `null` for the plain
  golden: each output's `shape` and `tolerance`).
- `TOPIC/CASE-ID/LABEL.npz` (or `.json`), LABEL being `VARIANT-DTYPE` or `DTYPE`, with:
  - `inputs/NAME`: an input as the implementation under test receives it, in the dtype
    (`bfloat16` inputs are stored as float32, which holds each bfloat16 value exactly:
    cast them with `ml_dtypes.bfloat16`, `torch.bfloat16`, ...); masks are boolean,
    True meaning "may attend";
  - `expected/OUT`: the float64 reference output for exactly these inputs;
  - `tolerance/OUT`: the largest absolute error allowed for that dtype;
  - for a case whose result is an implementation's declared choice (a row with every
    key masked, ...): `expected/POLICY=CHOICE/OUT` and `tolerance/POLICY=CHOICE/OUT`.

  A JSON file has the keys `case`, `variant`, `dtype`, `params`, `inputs`, `expected`
  (each array as `{"dtype", "shape", "data"}`, `data` nested lists with non-finite
  numbers written as the strings "NaN", "Infinity", "-Infinity") and `tolerance`.

An output passes when `|actual - expected| <= tolerance` at every position where
`expected` is finite, and NaN and +-inf sit exactly where `expected` has them.

## Conventions

Tokens are rows: `q (*batch, Lq, Dk)`, `k (*batch, Lk, Dk)`, `v (*batch, Lk, Dv)`; `scale`
None means `1/sqrt(Dk)`; `causal` is `top_left` or `bottom_right`; `window` is
`(left, right)`. The score pipeline is `q k^T * scale`, softcap, `+ bias`, masking,
softmax over keys.

## Reading it with NumPy

```python
import json
import numpy as np

root = "golden"                      # the folder written by attention-conformance export
index = json.load(open(f"{root}/index.json"))


def entries(case_id):
    """(dtype, variant, inputs, params, expected, tolerance) of each file of a case."""
    case = next(c for c in index["cases"] if c["id"] == case_id)
    for entry in case["entries"]:
        with np.load(f"{root}/{entry['file']}") as f:
            group = lambda g: {k.split("/", 1)[1]: f[k] for k in f.files if k.startswith(g + "/")}
            inputs, expected, tolerance = group("inputs"), group("expected"), group("tolerance")
        yield entry["dtype"], entry["variant"], inputs, case["params"], expected, tolerance


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


for dtype, variant, inputs, params, expected, tolerance in entries("unnormalised-scores-softmax"):
    mine = softmax(inputs["x"].astype(np.float64))
    assert np.all(np.abs(mine - expected["out"]) <= tolerance["out"]), (dtype, variant)
print("ok")
```
'''
