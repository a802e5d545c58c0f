"""Export golden data as plain files that another project reads without this package.

Layout of the export folder (docs/cli.md and the README.md written into it say more):

    README.md                 the format, and a complete reader that needs only NumPy
    index.json                every case: op, tags, params, expectations, and its files
    TOPIC/CASE-ID/LABEL.npz   one per variant and dtype (LABEL as in the test ids)
    TOPIC/CASE-ID/LABEL.json  the same in JSON, with --format json

Each data file holds ``inputs/NAME`` (as the backend receives them: the dtype itself, but
bfloat16 stored as float32, which holds every bfloat16 value exactly), ``expected/OUT``
(float64) and ``tolerance/OUT`` (the largest absolute error allowed); a case whose
outcome is a declared policy has ``expected/POLICY=CHOICE/OUT`` and
``tolerance/POLICY=CHOICE/OUT`` instead or as well.

An export is written into a fresh hidden folder beside DIR and renamed into place, so
that DIR always holds one complete export (its index lists exactly the files there), a
failed export leaves the old one untouched, and replacing an old export (``force``)
removes it whole without following any symbolic link inside it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
import shutil
from pathlib import Path

import numpy as np

from .api import GoldenCase
from .checking.expectations import key_nan_allowed
from .golden.compute import generated_inputs, golden_entries
from .golden.store import GoldenStore, write_npz
from .model.files import write_file
from .model.ops import OPS
from .reports.results import spec_hash, suite_version

FORMAT = "attention-conformance-golden/1"
FORMATS = ("npz", "json")
# zlib's fastest level: the quick spec's export is written a quarter faster than with its
# default and is 1 % bigger (golden_store's own files keep the default: their bytes are pinned)
NPZ_LEVEL = 1
#: files of an export that are not data files
OWN_FILES = ("README.md", "index.json")


class ExportError(Exception):
    """The target folder cannot be written (not empty without force, a link, a file)."""


# --- tags -----------------------------------------------------------------------------

#: the inputs whose leading (batch and head) dims are compared, per op
_BATCHED = {"multi_head_attention": ("query", "key", "value")}
_QKV = ("q", "k", "v", "d_out")


def _leading(shapes: dict, names) -> list[tuple]:
    """The leading dims (all but the last two) of the named inputs, padded to one rank."""
    lead = [tuple(shapes[n][:-2]) for n in names if n in shapes]
    rank = max(map(len, lead), default=0)
    return [(1,) * (rank - len(s)) + s for s in lead]


def _head_groups(shapes: dict) -> bool:
    """k (rank >= 3) has fewer heads (dim -3) than q: grouped- or multi-query heads.

    One kv head counts only at rank >= 4, where dim -3 is a head dim and not a batch."""
    q, k = shapes.get("q"), shapes.get("k")
    if q is None or k is None or len(q) < 3 or len(k) < 3 or k[-3] >= q[-3]:
        return False
    return k[-3] > 1 or (len(q) >= 4 and len(k) >= 4)


def _grouped_query(case, shapes: dict) -> bool:
    if case.op == "multi_head_attention":
        kv = case.params.get("num_kv_heads")
        return kv is not None and kv != case.params.get("num_heads")
    return _head_groups(shapes)


def _broadcast_batch(case, shapes: dict) -> bool:
    """A leading dim differs between the inputs (other than grouped-query heads)."""
    lead = _leading(shapes, _BATCHED.get(case.op, _QKV))
    if _head_groups(shapes):
        lead = [s[:-1] for s in lead]
    return len(set(lead)) > 1


def _causal(alignment):
    return lambda case, shapes: case.params.get("causal") == alignment


#: tag -> (what it means, whether one variant of a case has it: f(case, input shapes))
TAGS: dict[str, tuple] = {
    "mask": ("a boolean mask input (True: may attend)",
             lambda case, shapes: "mask" in case.inputs),
    "bias": ("an additive bias input", lambda case, shapes: "bias" in case.inputs),
    "causal": ("causal masking, either alignment",
               lambda case, shapes: case.params.get("causal") is not None),
    "causal:top_left": ("causal, query i sees keys j <= i", _causal("top_left")),
    "causal:bottom_right": ("causal, the last query sees the last key (Lq != Lk differs)",
                            _causal("bottom_right")),
    "window": ("a sliding window (left, right)",
               lambda case, shapes: case.params.get("window") is not None),
    "softcap": ("a softcap of the scores (softcap * tanh(s / softcap))",
                lambda case, shapes: case.params.get("softcap") is not None),
    "varlen": ("per-batch sequence lengths (q_lengths, kv_lengths params)",
               lambda case, shapes: any(case.params.get(n) is not None
                                        for n in ("q_lengths", "kv_lengths"))),
    "sink": ("an attention sink input (a per-head logit in the softmax denominator)",
             lambda case, shapes: "sink" in case.inputs),
    "grouped-query": ("fewer kv heads than query heads (grouped- or multi-query)",
                      _grouped_query),
    "broadcast-batch": ("inputs whose leading (batch) dims differ and broadcast",
                        _broadcast_batch),
    "long": ("a long-sequence case (profile long)",
             lambda case, shapes: case.profile == "long"),
    "scale": ("a case of the scale profile (128k-token prefill, million-key decode)",
              lambda case, shapes: case.profile == "scale"),
    "policy-dependent": ("the expected outcome is the backend's declared policy choice",
                         lambda case, shapes: "policy" in case.expect),
}


def case_tags(case, shapes_by_variant) -> list[str]:
    """The tags of TAGS that hold for a case, in the table's order; shapes_by_variant:
    for each variant, input name -> shape (a tag holds when it holds for one variant)."""
    shapes_by_variant = list(shapes_by_variant) or [{}]
    return [tag for tag, (_, holds) in TAGS.items()
            if any(holds(case, shapes) for shapes in shapes_by_variant)]


# --- data files -----------------------------------------------------------------------

def _stored(array: np.ndarray) -> np.ndarray:
    """An array as written to the file: bfloat16 and fp8 (not NumPy types) become float32."""
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
    """{dtype, shape, data}; data nested lists, non-finite numbers as strings.

    Numbers are written as the shortest decimal that reads back as the same float64,
    so every float16, float32 and bfloat16 value round-trips exactly."""
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


def _golden_arrays(golden: GoldenCase, variant, dtype, arrays) -> tuple[dict, list]:
    """expected/..., tolerance/... (and nan_allowed/...) arrays of one variant x dtype, and
    their index sets; arrays: the inputs as the backend gets them."""
    stored, expected_sets = {}, []
    rule = golden.store.tolerances
    for policy in golden_entries(golden.case):
        prefix = "" if policy is None else f"{policy[0]}={policy[1]}/"
        outputs = {}
        for name, (gold, plain_error) in golden.store.get(golden.case, variant, dtype,
                                                          policy).items():
            tol = rule.output(dtype, plain_error, gold)
            stored[f"expected/{prefix}{name}"] = np.asarray(gold, dtype=np.float64)
            stored[f"tolerance/{prefix}{name}"] = np.array(tol)
            outputs[name] = {"shape": list(np.shape(gold)), "tolerance": tol}
            allowed = key_nan_allowed(golden.case.op, name, arrays, golden.params, policy)
            if allowed is not None and allowed.any():
                stored[f"nan_allowed/{prefix}{name}"] = allowed
        expected_sets.append({"policy": None if policy is None else prefix[:-1],
                              "outputs": outputs})
    return stored, expected_sets


def _json_document(golden: GoldenCase, variant, dtype, stored: dict) -> dict:
    doc = {"case": golden.id, "variant": variant.label, "dtype": dtype,
           "params": jsonable(golden.params), "inputs": {}, "expected": {}, "tolerance": {}}
    own = golden.case.input_dtypes(dtype)       # each input's dtype (mixed dtypes, fp8)
    for key, value in stored.items():
        group, _, name = key.partition("/")
        if group == "tolerance":
            doc[group][name] = float(value)
        elif group == "inputs" or group == "nan_allowed":
            doc.setdefault(group, {})[name] = json_array(value, None if value.dtype == bool
                                                         else own.get(name, dtype))
        else:
            doc[group][name] = json_array(value, "float64")
    return doc


def _entry(golden: GoldenCase, variant, dtype, directory: Path, relative: str, fmt: str):
    """Write one variant x dtype of a case; return its index entry."""
    arrays = golden.inputs(dtype, variant.label)
    stored = {f"inputs/{n}": _stored(a) for n, a in arrays.items()}
    gold, expected_sets = _golden_arrays(golden, variant, dtype, arrays)
    stored.update(gold)
    path = directory / f"{_label(variant, dtype)}.{fmt}"
    if fmt == "npz":
        write_npz(path, stored, level=NPZ_LEVEL)
    else:
        document = _json_document(golden, variant, dtype, stored)
        write_file(path, json.dumps(document, allow_nan=False) + "\n")
    own = golden.case.input_dtypes(dtype)
    return {"file": f"{relative}/{path.name}", "variant": variant.label,
            "dims": dict(variant.dims), "dtype": dtype,
            "inputs": {n: {"shape": list(a.shape),
                           "dtype": "bool" if a.dtype == bool else own.get(n, dtype),
                           "stored_as": str(_stored(a).dtype)} for n, a in arrays.items()},
            "expected": expected_sets}


def _case_record(case, golden: GoldenCase, entries: list, shapes: list) -> dict:
    return {"id": case.id, "topic": case.topic, "op": case.op,
            "tags": case_tags(case, shapes),
            "description": case.description, "source": case.source,
            "positional": list(OPS[case.op].positional), "outputs": list(OPS[case.op].outputs_for(case.inputs)),
            "params": jsonable(golden.params), "dtypes": list(case.dtypes),
            "expect": jsonable(case.expect),
            "golden": golden.has_golden, "entries": entries}


def _write_cases(cases, root: Path, fmt: str, store, dtypes, progress) -> list[dict]:
    records = []
    for done, case in enumerate(cases, 1):
        golden = GoldenCase(case, store)
        relative = f"{case.topic}/{case.id}"
        (root / relative).mkdir(parents=True)
        entries = [_entry(golden, variant, dtype, root / relative, relative, fmt)
                   for variant in case.variants for dtype in case.dtypes
                   if not dtypes or dtype in dtypes]
        shapes = [{n: a.shape for n, a in generated_inputs(case, variant).items()}
                  for variant in case.variants]
        records.append(_case_record(case, golden, entries, shapes))
        if progress:
            progress(done, len(cases), case.id)
    return records


# --- the target folder ----------------------------------------------------------------

def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_target(directory: Path, force: bool = False, keep=()) -> None:
    """Raise ExportError unless directory may receive an export: absent, an empty
    folder, or (force) a folder whose whole content is to be replaced. keep: folders
    (the golden data being read, ...) that directory must neither be nor hold."""
    directory = Path(os.path.abspath(directory))
    if directory.is_symlink():
        raise ExportError(f"{directory} is a symbolic link; name the folder itself "
                          f"({os.path.realpath(directory)}) or a new one")
    if directory.exists() and not directory.is_dir():
        raise ExportError(f"{directory} exists and is not a folder")
    for folder in [Path.cwd(), *keep]:
        if _inside(Path(os.path.realpath(folder)), Path(os.path.realpath(directory))):
            raise ExportError(f"{directory} holds {folder}, which an export must not "
                              "replace; choose another folder")
    if directory.is_dir() and any(directory.iterdir()) and not force:
        raise ExportError(f"{directory} is not empty; export into a new or empty folder, "
                          "or pass --force to replace everything in it")


def _remove(path: Path) -> None:
    """Delete a folder tree; symbolic links inside are removed, never followed."""
    shutil.rmtree(path)


def _replace(staging: Path, directory: Path) -> None:
    """Put the finished export staging at directory, removing what was there."""
    if not directory.exists():
        staging.rename(directory)
        return
    old = staging.with_name(staging.name + ".old")
    directory.rename(old)
    try:
        staging.rename(directory)
    except OSError:
        old.rename(directory)                  # put the previous export back
        raise
    _remove(old)


def _staging(directory: Path) -> Path:
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = directory.parent / f".{directory.name}.export-{secrets.token_hex(6)}"
    staging.mkdir()
    return staging


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _file_list(root: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under root (written before index.json)."""
    return {p.relative_to(root).as_posix(): _sha256(p)
            for p in sorted(root.rglob("*")) if p.is_file()}


def export(cases, directory: Path, fmt: str = "npz", *, golden_dir: Path,
           dtypes=None, spec_dir: Path | None = None, progress=None,
           force: bool = False) -> dict:
    """Write every case (and each of its variants and dtypes) into directory; return the
    index. progress(done, total, case_id) is called after each case.

    directory must be absent or empty; with force a folder that holds anything (an
    older export, say) is replaced whole. Raises ExportError when it may not be
    written, GoldenError when the golden data are broken (directory is then unchanged)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, not {fmt!r}")
    directory = Path(os.path.abspath(directory))
    keep = [Path(golden_dir)] + ([Path(spec_dir)] if spec_dir else [])
    check_target(directory, force, keep)
    staging = _staging(directory)
    try:
        index = _write_export(list(cases), staging, fmt, Path(golden_dir), dtypes,
                              spec_dir, progress)
        check_target(directory, force, keep)   # nothing appeared there meanwhile
        _replace(staging, directory)
    except BaseException:
        if staging.exists():
            _remove(staging)
        raise
    return index


def _write_export(cases, root: Path, fmt, golden_dir, dtypes, spec_dir, progress) -> dict:
    store = GoldenStore(golden_dir)
    index = {"format": FORMAT, "data_format": fmt, "suite_version": suite_version(),
             "spec_hash": spec_hash(spec_dir) if spec_dir else None,
             "tolerance_rule": "|actual - expected| <= tolerance at every position where "
                               "expected is finite; NaN and +-inf must sit exactly where "
                               "expected has them",
             "bfloat16": "stored as float32 (npz) or as its exact decimal value (json), "
                         "with the dtype named bfloat16 (likewise float8_e4m3fn, float8_e5m2)",
             "tags": {tag: meaning for tag, (meaning, _) in TAGS.items()},
             "cases": _write_cases(cases, root, fmt, store, dtypes, progress)}
    write_file(root / "README.md", README)
    index["files"] = _file_list(root)
    write_file(root / "index.json", json.dumps(index, indent=1, allow_nan=False) + "\n")
    return index


def reader_code(readme: str = None) -> str:
    """The reader of an export's README (its first Python block)."""
    text = README if readme is None else readme
    start = text.index("```python\n") + len("```python\n")
    return text[start:text.index("```", start)]


README = '''\
# Golden attention data (attention-conformance export)

Written by `attention-conformance export`. Everything here is plain files: reading them
needs NumPy (the `.npz` files) or NumPy and Python's `json` (the `.json` files), not the
attention-conformance package.

## Files

- `index.json`: `format` ("attention-conformance-golden/1"), `spec_hash`, the tolerance
  rule, `tags` (tag -> meaning), `files` (every file of this folder but `index.json`
  itself -> its sha256) and `cases`: for each case its `id`, `topic`, `op` (the
  attention operation), `tags` (below), `description`, `source`, `positional` (the op's
  positional inputs, in order), `outputs` (output names: `out`; `out`, `lse` for
  `sdpa_lse`; `dq`, `dk`, `dv`, and `d_sink` with a `sink`, for `sdpa_vjp`), `params` (the op's keyword parameters: `causal`, `scale`, `window`, ...; `sharding`
  says how a context-parallel case splits the sequence over ranks, and its expected outputs
  are those of the whole, unsharded call),
  `expect` (the case's expectations as the spec writes them, e.g. exact values) and
  `entries`, one per shape variant and dtype: `file`, `variant`, `dims`, `dtype`,
  `inputs` (shape, dtype and storage dtype of each input) and `expected` (one branch
  each: `policy` null for the plain golden output, or "NAME=CHOICE" for a declared
  choice; with each output's `shape` and `tolerance`).
- `TOPIC/CASE-ID/LABEL.npz` (or `.json`), LABEL being `VARIANT-DTYPE` or `DTYPE`, with:
  - `inputs/NAME`: an input as the implementation under test receives it, in the dtype;
    masks are boolean, True meaning "may attend";
  - `expected/OUT`: the float64 reference output for exactly these inputs;
  - `tolerance/OUT`: the largest absolute error allowed for that dtype;
  - for a case whose result is an implementation's declared choice (a row with every
    key masked, ...): `expected/POLICY=CHOICE/OUT` and `tolerance/POLICY=CHOICE/OUT`.

  A JSON file has the keys `case`, `variant`, `dtype`, `params`, `inputs`, `expected`
  (each array as `{"dtype", "shape", "data"}`, `data` nested lists with non-finite
  numbers written as the strings "NaN", "Infinity", "-Infinity") and `tolerance`.

**bfloat16** (not a NumPy dtype): an `.npz` file stores bfloat16 inputs as float32
arrays, a `.json` file writes them as their values with `"dtype": "bfloat16"`. Either
way each value is a bfloat16 value exactly (float32 holds every bfloat16, and the
decimal reads back exactly); read them as float32 and cast with `ml_dtypes.bfloat16`,
`torch.bfloat16`, `jnp.bfloat16`, ... (the raw bits are `x.view(np.uint32) >> 16`).
The fp8 dtypes `float8_e4m3fn` and `float8_e5m2` are stored the same way (cast with
`ml_dtypes.float8_e4m3fn`, `torch.float8_e4m3fn`, ...); each input names its own dtype
(an fp8 case's descales and a `passed_as` bias are float32; an fp8 case's outputs are
float32), and an fp8 case's q, k, v are the stored values, to be multiplied by their
descales (`q_descale`, `k_descale`, `v_descale`).

## Tags

Each case lists `tags` derived from its data, to filter on: `mask`, `bias`, `causal`,
`causal:top_left`, `causal:bottom_right`, `window`, `softcap`, `varlen` (per-batch
lengths), `sink` (an attention sink input), `grouped-query` (fewer kv heads than query
heads), `broadcast-batch` (leading dims that differ and
broadcast), `long` (long-sequence cases), `policy-dependent` (the expected outcome is
a declared choice: pass yours as `policy`). `index["tags"]` says what each means.

## Passing

An output passes when `|actual - expected| <= tolerance` at every position where
`expected` is finite, and NaN and +-inf sit exactly where `expected` has them. Check
the plain branch (`policy` null) and each branch whose "NAME=CHOICE" your
implementation declares (e.g. `fully_masked_rows=zeros`: a query whose every key is
masked gets zeros); in some cases the only branches are policy branches. Under
`padded_query_rows=unspecified` the rows of padded queries (row `i >= q_lengths[b]` of
batch element `b`, `params["q_lengths"]`) of `out` and `dq` are free: the stored
expected values there are the `zeros` choice's, and an implementation that declares
`unspecified` is judged on the other rows only (the reader below checks every row: set
those rows of your output to 0 first). Where a file holds `nan_allowed/KEY` (a boolean of
the output's shape), NaN is a second exact form at its True positions: dq of `sdpa_vjp`
where a kernel's plain dS K meets 0 x NaN from a key its row does not read (a NaN stored
in a masked key); elsewhere the expected value holds.

## A complete reader (NumPy only)

```python
import json
import numpy as np

def load(path):  # {"inputs": {...}, "expected": {...}, "tolerance": {...}} of a .npz or .json
    if path.endswith(".npz"):
        with np.load(path) as f:
            return {g: {k.split("/", 1)[1]: f[k] for k in f.files if k.startswith(g + "/")}
                    for g in ("inputs", "expected", "tolerance", "nan_allowed")}
    doc, num = json.load(open(path)), lambda x: [num(y) for y in x] if isinstance(x, list) else float(x) if isinstance(x, str) else x
    arr = lambda a: np.array(num(a["data"]), "float32" if a["dtype"] in ("bfloat16", "float8_e4m3fn", "float8_e5m2") else a["dtype"])
    return {"tolerance": doc["tolerance"], **{g: {k: arr(a) for k, a in doc.get(g, {}).items()}
                                              for g in ("inputs", "expected", "nan_allowed")}}

def check(root, outputs_of, policy=()):  # -> (outputs checked, failures)
    checked, failures = 0, []
    for case in json.load(open(f"{root}/index.json"))["cases"]:
        for entry in case["entries"]:
            data = load(f"{root}/{entry['file']}")
            actual = outputs_of(case, entry, data["inputs"])
            for branch in [b for b in entry["expected"] if b["policy"] in (None, *policy)]:
                for name in branch["outputs"] if actual is not None else []:
                    key = f"{branch['policy']}/{name}" if branch["policy"] else name
                    got, want = np.asarray(actual[name], np.float64), data["expected"][key]
                    nan_ok = data["nan_allowed"].get(key, np.zeros(want.shape, bool))  # NaN: a 2nd exact form
                    got = np.where(nan_ok & np.isnan(got), want, got) if got.shape == want.shape else got
                    fin, checked = np.isfinite(want), checked + 1
                    if not (got.shape == want.shape and np.array_equal(got[~fin], want[~fin], equal_nan=True)
                            and np.all(np.abs(got[fin] - want[fin]) <= data["tolerance"][key])):
                        failures.append(f"{entry['file']}: {key}")
    return checked, failures
```

`check(root, outputs_of, policy)` reads every data file of the export at `root`, calls
`outputs_of(case, entry, inputs)` (your implementation: it returns `{output name:
array}`, or None to skip that file) and compares each output with the plain golden
branch and with each branch your `policy` declares (a list of "NAME=CHOICE"). `load`
reads one data file of either format; a JSON array's non-finite strings become floats
through `float("NaN")`, `float("Infinity")`, `float("-Infinity")`.

## Using it

```python
def my_outputs(case, entry, inputs):        # here: a NumPy softmax, for the softmax cases
    if case["op"] != "softmax":
        return None                          # for attention: call yours with the inputs
    x = inputs["x"].astype(np.float64)       # [inputs[n] for n in case["positional"]], the
    axis = case["params"].get("axis", -1)    # other inputs and case["params"] as keywords
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return {"out": e / e.sum(axis=axis, keepdims=True)}


checked, failures = check(".", my_outputs, policy=["fully_masked_rows=zeros"])
print(f"{checked} outputs checked, {len(failures)} failures", *failures[:10], sep="\\n")
```

To run only some cases, filter in `outputs_of` by `case["op"]`, `case["tags"]` (e.g.
skip `"grouped-query"`), `entry["dtype"]` or `case["topic"]`.

## Conventions

Tokens are rows: `q (*batch, Lq, Dk)`, `k (*batch, Lk, Dk)`, `v (*batch, Lk, Dv)`; `scale`
None means `1/sqrt(Dk)`; `causal` is `top_left` or `bottom_right`; `window` is
`(left, right)`; `q_lengths`, `kv_lengths` (one per element of dim 0) keep the first
`q_lengths[b]` queries and `kv_lengths[b]` keys, padding at the end, bottom-right causal
offset `kv_lengths[b] - q_lengths[b]`. The score pipeline is `q k^T * scale`, softcap,
`+ bias`, masking, softmax over keys.
'''
