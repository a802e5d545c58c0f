"""Helpers of the tests of the command line: a small spec of our own, and running the CLI
as a user does (a fresh process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ADAPTERS = ROOT / "tests" / "cli_adapters.py"

TINY = """\
topic: tiny
description: A few small cases for the suite's own tests of the command line.
cases:
  - id: tiny-softmax
    description: softmax of four scores
    source: tests of the command line
    op: softmax
    inputs:
      x: {values: [[5, 2, 1, 2]]}
    dtypes: [float64, float32, float16, bfloat16]
    expect:
      golden: true
      properties: [rows_sum_to_one]
  - id: tiny-sdpa-default-scale
    description: sdpa with the default scale and a key padding mask
    source: tests of the command line
    op: sdpa
    dims:
      - {L: 3, D: 4}
      - {L: 5, D: 8}
    inputs:
      q: {normal: {shape: [2, L, D], seed: 1}}
      k: {normal: {shape: [2, L, D], seed: 2}}
      v: {normal: {shape: [2, L, D], seed: 3}}
      mask: {key_padding: {lengths: [2, 3], size: L, rank: 3}}
    dtypes: [float64, float32, float16, bfloat16]
    expect:
      golden: true
  - id: tiny-weights-causal
    description: causal weights with a given scale; the first row is one-hot
    source: tests of the command line
    op: attention_weights
    inputs:
      q: {normal: {shape: [4, 8], seed: 4}}
      k: {normal: {shape: [4, 8], seed: 5}}
    params: {causal: top_left, scale: 0.5}
    dtypes: [float64, float32]
    expect:
      golden: true
      exact: {"[0]": [1, 0, 0, 0]}
      properties: [rows_sum_to_one, masked_weights_zero]
  - id: tiny-self-attention
    description: the learned-projection module on three tokens
    source: tests of the command line
    op: self_attention
    inputs:
      x: {normal: {shape: [3, 4], seed: 6}}
      w_q: {normal: {shape: [4, 2], seed: 7}}
      w_k: {normal: {shape: [4, 2], seed: 8}}
      w_v: {normal: {shape: [4, 3], seed: 9}}
    dtypes: [float64, float32]
    expect:
      golden: true
  - id: tiny-empty-row
    description: the second query may see no key
    source: tests of the command line
    op: sdpa
    inputs:
      q: {normal: {shape: [3, 4], seed: 10}}
      k: {normal: {shape: [4, 4], seed: 11}}
      v: {normal: {shape: [4, 2], seed: 12}}
      mask: {values: [[true, true, false, true], [false, false, false, false], [true, false, true, true]]}
    params: {scale: 0.5}
    dtypes: [float64, float32]
    expect:
      policy:
        fully_masked_rows:
          zeros: {golden: true}
          uniform: {golden: true}
          nan: {golden: true}
"""


def make_spec(tmp_path: Path, text: str = TINY, topic: str = "tiny") -> Path:
    """tmp_path/spec/cases/TOPIC.yaml with its golden data; returns the cases folder."""
    from attention_conformance.golden import freeze as golden_freeze
    from attention_conformance.specs.loader import load_spec

    cases = tmp_path / "spec" / "cases"
    cases.mkdir(parents=True, exist_ok=True)
    (cases / f"{topic}.yaml").write_text(text)
    spec = load_spec(cases)
    assert not spec.errors, "\n".join(map(str, spec.errors))
    golden_freeze.regenerate(spec.cases, cases.parent / "golden")
    return cases


def cli(*args, cwd=None, env=None, python=None, timeout=180) -> subprocess.CompletedProcess:
    """Run `python -m attention_conformance ARGS` in a fresh process; stdout and stderr captured."""
    full_env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", **(env or {}))
    full_env.pop("PYTEST_XDIST_WORKER", None)
    # plugins a certification does not need, and slow to import on a busy machine
    full_env["PYTEST_ADDOPTS"] = "-p no:hypothesispytest -p no:benchmark -p no:cacheprovider"
    return subprocess.run([python or sys.executable, "-m", "attention_conformance", *map(str, args)],
                          cwd=cwd or ROOT, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


def adapter(name: str) -> str:
    return f"{ADAPTERS}:{name}"


class Ran:
    """What an in-process run of the command line returned and printed."""

    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def run(capsys, *args) -> Ran:
    """`attention-conformance ARGS` in this process (for the commands that run no pytest)."""
    from attention_conformance.cli import main

    capsys.readouterr()
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return Ran(code, out, err)
