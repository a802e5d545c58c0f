"""Bad spec input: each problem is one clear error naming file, line and case id.

Every scenario below is a known-good case with one thing broken. Loading it gives
exactly one SpecError that names the file, the line of the fault and the case id, and
`validate` reports all of them in one run. YAML tags that would construct Python
objects are refused before anything runs.
"""

import json
import os
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
import yaml

from _cli_support import cli
from attention_conformance.specs import yaml_reader
from attention_conformance.specs.loader import load_spec
from attention_conformance.specs.yaml_reader import MAX_FILE_BYTES
from attention_conformance.specs.validation import (ID_PATTERN, MAX_CASE_ELEMENTS, MAX_FILE_ELEMENTS,
                                             TOPIC_PATTERN)

ROOT = Path(__file__).resolve().parents[2]

GOOD = """\
  - id: {id}
    description: a case of the bad-spec tests
    source: tests/spec/test_bad_spec.py
    op: sdpa
    inputs:
      q: {{normal: {{shape: [2, 4], seed: 1}}}}
      k: {{normal: {{shape: [3, 4], seed: 2}}}}
      v: {{normal: {{shape: [3, 4], seed: 3}}}}
    dtypes: [float64]
    expect: {{properties: [finite]}}
"""


def case(case_id, old=None, new=None):
    """The good case under another id, with the text `old` replaced by `new`."""
    text = GOOD.format(id=case_id)
    if old is not None:
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


def policy(case_id, name, choice):
    return case(case_id, "    expect: {properties: [finite]}\n",
                f"    expect:\n      policy:\n        {name}:\n"
                f"          {choice}: {{properties: [finite]}}\n")


def batched(case_id, params, expect=None):
    """The good case with a batch dim of 2 and the given params (lengths)."""
    text = (case(case_id, "    dtypes:", f"    params: {params}\n    dtypes:")
            .replace("shape: [2, 4], seed: 1", "shape: [2, 2, 4], seed: 1")
            .replace("shape: [3, 4], seed: 2", "shape: [2, 3, 4], seed: 2")
            .replace("shape: [3, 4], seed: 3", "shape: [2, 3, 4], seed: 3"))
    if expect is not None:
        text = text.replace("    expect: {properties: [finite]}", f"    expect: {expect}")
    return text


PAYLOAD = "!!python/object/apply:os.system [\"touch {marker}\"]"

MHA = """\
  - id: {id}
    description: a multi-head case of the bad-spec tests
    source: tests/spec/test_bad_spec.py
    op: multi_head_attention
    inputs:
      query: {{normal: {{shape: [3, 4], seed: 1}}}}
      key: {{normal: {{shape: [5, 4], seed: 2}}}}
      value: {{normal: {{shape: [5, 4], seed: 3}}}}
      w_q: {{normal: {{shape: [4, 4], seed: 4}}}}
      w_k: {{normal: {{shape: [4, 4], seed: 5}}}}
      w_v: {{normal: {{shape: [4, 4], seed: 6}}}}
      w_o: {{normal: {{shape: [4, 4], seed: 7}}}}
    params: {{num_heads: 2}}
    dtypes: [float64]
    expect: {{properties: [finite]}}
"""


def mha(case_id, old, new):
    text = MHA.format(id=case_id)
    assert old in text, old
    return text.replace(old, new, 1)


def softmax(case_id, params):
    return (f"  - id: {case_id}\n    description: softmax of the bad-spec tests\n"
            "    source: tests/spec/test_bad_spec.py\n    op: softmax\n"
            "    inputs:\n      x: {values: [[1, 2, 3], [4, 5, 6]]}\n"
            f"    params: {params}\n    dtypes: [float64]\n    expect: {{golden: true}}\n")


def expect(case_id, expectation):
    return case(case_id, "    expect: {properties: [finite]}\n", f"    expect: {expectation}\n")


def bomb(levels=9, width=9):
    """An alias bomb: `width ** levels` strings from a few hundred bytes."""
    rows = [f"      a0: &a0 [{', '.join(['x'] * width)}]"]
    rows += [f"      a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "    note:\n" + "\n".join(rows) + "\n"


def nested(depth):
    return "[" * depth + "1.0" + "]" * depth

#: name -> (cases text, text on the line at fault (None: the case's first line), message)
SCENARIOS = {
    "malformed_yaml": (case("broken", "seed: 2}}", "seed: 2}"),
                       "v: {normal", "invalid YAML"),
    "unknown_key": (case("with-colour", "    op: sdpa\n", "    op: sdpa\n    colour: red\n"),
                    "colour: red", "unknown key 'colour'"),
    "wrong_type_list": (case("dtypes-not-a-list", "dtypes: [float64]", "dtypes: float64"),
                        "dtypes: float64", "'float64' is not of type 'array'"),
    "wrong_type_seed": (case("seed-not-a-number", "seed: 3", "seed: three"),
                        "seed: three", "'three' is not of type 'integer'"),
    "duplicate_key": (case("two-ops", "    dtypes:", "    op: softmax\n    dtypes:"),
                      "op: softmax", "duplicate key 'op' (first at line 6)"),
    "duplicate_flow_key": (case("two-seeds", "seed: 1}", "seed: 1, seed: 9}"),
                           "seed: 9", "duplicate key 'seed'"),
    "unknown_op": (case("bad-op", "op: sdpa", "op: sdpaa"),
                   "op: sdpaa", "unknown op 'sdpaa' (known: softmax"),
    "unknown_dtype": (case("bad-dtype", "[float64]", "[float64, float8]"),
                      "float8", "unknown dtype 'float8'"),
    "fp8_without_descales": (case("fp8-weights", "      v: {normal: {shape: [3, 4], seed: 3}}\n"
                                  "    dtypes: [float64]", "    dtypes: [float8_e4m3fn]").replace(
                                      "op: sdpa", "op: attention_weights"),
                             "id: fp8-weights", "dtype float8_e4m3fn is for the ops that take "
                             "descale factors (sdpa, paged_sdpa), not attention_weights"),
    "o_scale_without_fp8": (case("o-scale-float64", "    dtypes:",
                                 "    params: {o_scale: 0.5}\n    dtypes:"),
                            "id: o-scale-float64", "param o_scale writes the output in the "
                            "case's fp8 format: dtype float64 has none"),
    "passed_as_fp8": (case("fp8-bias", "seed: 3}}", "seed: 3}, passed_as: float8_e5m2}"),
                      "passed_as", "unknown passed_as 'float8_e5m2' (known: float64"),
    "unknown_policy": (policy("bad-policy", "fully_masked", "zeros"),
                       "fully_masked:", "unknown policy 'fully_masked'"),
    "unknown_choice": (policy("bad-choice", "fully_masked_rows", "zeroes"),
                       "zeroes", "unknown choice of fully_masked_rows 'zeroes' "
                                 "(known: zeros, uniform, nan)"),
    "choice_of_another_policy": (policy("foreign-choice", "fully_masked_rows", "ignored"),
                                 None, "policy fully_masked_rows has no choice 'ignored'"),
    "widths_differ": (case("q-k-widths", "shape: [3, 4], seed: 2", "shape: [3, 5], seed: 2"),
                      None, "inconsistent shapes: q has width 4 but k has 5"),
    "mask_not_broadcast": (case("mask-3x3", "    dtypes:",
                                "      mask: {full: {shape: [3, 3], value: true}}\n    dtypes:"),
                           None, "mask against scores (2, 3): shapes (3, 3) and (2, 3) "
                                 "do not broadcast"),
    "no_seed": (case("unseeded", "shape: [2, 4], seed: 1", "shape: [2, 4]"),
                "q: {normal", "'seed' is a required property: every random input needs"),
    "same_as_missing": (case("copy-of-nothing", "v: {normal: {shape: [3, 4], seed: 3}}",
                             "v: {same_as: w}"),
                        None, "input 'v' is same_as unknown input 'w'"),
    "no_tolerance": (case("bf16", "[float64]", "[float64, bfloat16]"),
                     None, "dtype 'bfloat16' has no tolerance in spec/tolerances.yaml"),
    "python_object_payload": (case("payload", "seed: 3}}", "seed: 3}}\n    note: " + PAYLOAD),
                              "note:", "YAML tag !!python/object/apply:os.system is refused"),
    "python_name_payload": (case("name-payload", "seed: 3}}", "seed: 3}}\n    note: "
                                 "!!python/name:os.system ''"),
                            "note:", "YAML tag !!python/name:os.system is refused"),
    # limits (docs/writing-cases.md, "Limits")
    "alias_bomb": (case("alias-bomb", "    dtypes:", bomb() + "    dtypes:"), None,
                   "YAML nodes with its aliases (a file may hold at most 200,000)"),
    "recursive_alias": (case("recursive-alias", "    dtypes:", "    note: &r [*r]\n    dtypes:"),
                        "note: &r", "a recursive alias (a node that contains itself) is refused"),
    "nesting_depth": (case("too-deep", "v: {normal: {shape: [3, 4], seed: 3}}",
                           "v: {values: " + nested(40) + "}"),
                      None, "the case nests 46 levels deep (at most 32)"),
    "shape_1e18": (case("huge-shape", "shape: [3, 4], seed: 2", "shape: [1000000000, 1000000000], seed: 2"),
                   "k: {normal", "input 'k' of shape (1000000000, 1000000000) has "
                                 "1,000,000,000,000,000,000 elements (at most 16,777,216 in one array)"),
    "dims_1e9": (case("huge-dims", "    inputs:", "    dims: [{L: 1000000000}]\n    inputs:")
                 .replace("shape: [3, 4], seed: 3", "shape: [L, 4], seed: 3"),
                 "v: {normal", "dims L1000000000: input 'v' of shape (1000000000, 4) has "
                               "4,000,000,000 elements (at most 16,777,216 in one array)"),
    "case_elements": (case("many-variants", "    inputs:",
                           "    dims: [" + ", ".join(f"{{L: {n}}}" for n in range(1 << 20, (1 << 20) + 20))
                           + "]\n    inputs:").replace("shape: [3, 4], seed: 3", "shape: [L, 4], seed: 3")
                      .replace("shape: [3, 4], seed: 2", "shape: [L, 4], seed: 2"),
                      "v: {normal", "dims L1048577: the inputs and outputs of the case's variants have "
                                    "more than 16,777,216 elements in all (at most that per case)"),
    "score_matrix": (case("huge-scores", "shape: [2, 4], seed: 1", "shape: [100000, 4], seed: 1")
                     .replace("[3, 4], seed: 2", "[100000, 4], seed: 2")
                     .replace("[3, 4], seed: 3", "[100000, 4], seed: 3"),
                     "    inputs:", "the score matrix of shape (100000, 100000) has "
                                   "10,000,000,000 elements (at most 67,108,864)"),
    "long_integer": (case("long-seed", "seed: 2}", "seed: " + "7" * 5001 + "}"),
                     "k: {normal", "an integer of 5001 digits is too long (at most 20 digits, "
                                   "a 64-bit integer)"),
    "integer_out_of_range": (case("big-seed", "seed: 2}", "seed: 99999999999999999999}"),
                             "k: {normal", "the integer 99999999999999999999 is out of range "
                                           "(at most 2**63 - 1 in magnitude)"),
    # plain YAML only
    "binary_property_argument": (expect("binary-seed", "{properties: [{permutation_equivariant: "
                                                       "{seed: !!binary aGVsbG8=}}]}"),
                                 "!!binary", "YAML tag !!binary is refused: spec files hold plain data"),
    "date_property_argument": (expect("date-seed", "{properties: [{permutation_equivariant: "
                                                   "{seed: 2024-01-01}}]}"),
                               "2024-01-01", "a date or timestamp ('2024-01-01') is refused: "
                                             "spec files hold plain data; quote it"),
    "set_tag": (case("a-set", "    dtypes:", "    note: !!set {a, b}\n    dtypes:"),
                "note: !!set", "YAML tag !!set is refused"),
    "integer_key": (case("int-key", "    inputs:", "    dims: [{1: 3}]\n    inputs:"),
                    "dims: [{1: 3}]", "a mapping key must be a string, not '1' (quote it)"),
    # types and values
    "num_heads_float": (mha("heads-float", "num_heads: 2}", "num_heads: 2.0}"),
                        "num_heads: 2.0", "params/num_heads: 2.0 is not an "
                                          "integer (write 2)"),
    "window_float": (case("window-float", "    dtypes:", "    params: {window: [2.0, 0]}\n    dtypes:"),
                     "window: [2.0", "params/window/0: 2.0 is not an integer (write 2)"),
    "nan_std": (case("nan-std", "seed: 2}", "seed: 2, std: .nan}"),
                "std: .nan", "inputs/k/normal/std must be a finite number, not nan"),
    "nan_p": (case("nan-p", "    dtypes:", "      mask: {bernoulli: {shape: [2, 3], seed: 4, "
                                             "p: .nan}}\n    dtypes:"),
              "p: .nan", "inputs/mask/bernoulli/p must be a finite number, not nan"),
    "inf_scale": (case("inf-scale", "    dtypes:", "    params: {scale: .inf}\n    dtypes:"),
                  "scale: .inf", "params/scale must be a finite number, not inf"),
    "nan_softcap": (case("nan-softcap", "    dtypes:", "    params: {softcap: .nan}\n    dtypes:"),
                    "softcap: .nan", "params/softcap must be a finite number, not nan"),
    "nan_band": (expect("nan-band", "{statistic: [{name: std, expected: 1.0, band: .nan, "
                                    "why: sampling spread}]}"),
                 "band: .nan", "expect/statistic/0/band must be a finite number, not nan"),
    "property_seed_float": (expect("seed-float", "{properties: [{permutation_equivariant: "
                                                 "{seed: 1.5}}]}"),
                            None, "property permutation_equivariant argument 'seed' must be an "
                                  "integer, not 1.5"),
    "lk_zero_shape": (case("lk-zero", "shape: [3, 4], seed: 2", "shape: [0, 4], seed: 2")
                      .replace("shape: [3, 4], seed: 3", "shape: [0, 4], seed: 3"),
                      "k: {normal", "inputs 'k', 'v' have an axis of length 0 (shapes (0, 4), "
                                    "(0, 4)): every axis needs a length of at least 1"),
    "lk_zero_dims": (case("lk-zero-dims", "    inputs:", "    dims: [{Lk: 0}]\n    inputs:"),
                     "dims: [{Lk: 0}]", "dims/0/Lk: 0 is less than the minimum of 1"),
    "duplicate_variants": (case("twice-l3", "    inputs:", "    dims:\n      - {L: 3}\n"
                                "      - {L: 3}\n    inputs:")
                           .replace("shape: [3, 4], seed: 3", "shape: [L, 4], seed: 3")
                           .replace("shape: [3, 4], seed: 2", "shape: [L, 4], seed: 2"),
                           "- {L: 3}", "dims L3 is given twice (entries 0 and 1 of dims)"),
    "colliding_variant_labels": (case("a11-a1-1", "    inputs:", "    dims:\n      - {A: 11}\n"
                                      "      - {A1: 1}\n    inputs:"),
                                 "- {A1: 1}", "dims A11 is given twice (entries 0 and 1 of dims)"),
    "exact_quoted_word": (expect("quoted-nan", "{exact: {\"[0]\": \".nan\"}}"), None,
                          "exact '[0]': the value '.nan' is not a number or a list of numbers of "
                          "one shape (write .nan, .inf or -.inf unquoted)"),
    # already checked before: each keeps a row
    "exact_index_out_of_range": (expect("exact-index", "{exact: {\"[5]\": 0}}"), None,
                                 "exact '[5]': the index does not fit output out of shape (2, 4)"),
    "exact_value_length": (expect("exact-length", "{exact: {\"[0]\": [1, 2, 3]}}"), None,
                           "exact '[0]': a value of shape (3,) does not fit the selection of "
                           "shape (4,)"),
    "close_atol_tighter_than_the_dtype": (
        expect("close-tight", "{close: {\"[0, 0]\": {value: 0.5, atol: 1.0e-17}}}"), None,
        "close '[0, 0]': atol 1e-17 is tighter than float64 can meet (4 x unit roundoff x "
        "max|value| = 2.22e-16)"),
    "accumulation_as_a_case_policy": (
        expect("accumulation-outcome", "{policy: {accumulation: {float32: {golden: true}}}}"),
        None, "policy accumulation sets the tolerance tier of golden comparisons"),
    "close_index_out_of_range": (expect("close-index", "{close: {\"[5]\": {value: 0, digits: 2}}}"),
                                 None, "close '[5]': the index does not fit output out of shape"),
    "statistic_of_no_output": (expect("stat-dv", "{statistic: [{name: std, output: dv, "
                                                 "expected: 1.0, band: 0.5, why: sampling spread}]}"),
                               None, "statistic std: sdpa has no output 'dv' (its outputs: out)"),
    "misspelt_property_argument": (expect("sed", "{properties: [{permutation_equivariant: "
                                                 "{sed: 1}}]}"),
                                   None, "property permutation_equivariant takes no argument 'sed' "
                                         "(it takes: seed)"),
    # variable lengths
    "lengths_without_batch": (case("kv-lengths-no-batch", "    dtypes:",
                                   "    params: {kv_lengths: [3]}\n    dtypes:"),
                              None, "inconsistent shapes: kv_lengths needs a batch dim: the "
                                    "scores (2, 3) have none"),
    "lengths_count": (batched("kv-lengths-count", "{kv_lengths: [3]}"), None,
                      "inconsistent shapes: kv_lengths has 1 lengths for a batch of 2 (dim 0 "
                      "of the scores (2, 2, 3))"),
    "length_past_the_queries": (batched("q-length-3-of-2", "{q_lengths: [2, 3]}"), None,
                                "inconsistent shapes: q_lengths 3 is outside 0..2"),
    "length_negative": (batched("kv-length-negative", "{kv_lengths: [-1, 3]}"), "kv_lengths",
                        "-1 is less than the minimum of 0"),
    "q_lengths_golden_not_under_policy": (
        batched("q-lengths-top-golden", "{q_lengths: [2, 1]}", "{golden: true}"), None,
        "q_lengths makes padded query rows, a policy: give golden and exact under "
        "expect.policy.padded_query_rows, not at the top of expect"),
    # packed documents
    "segment_ids_alone": (batched("q-segment-ids-alone", "{q_segment_ids: [0, 1]}"), None,
                          "inconsistent shapes: q_segment_ids and kv_segment_ids are given "
                          "together"),
    "segment_ids_count": (batched("kv-segment-ids-count",
                                  "{q_segment_ids: [0, 1], kv_segment_ids: [0, 1]}"), None,
                          "inconsistent shapes: kv_segment_ids needs 3 ids a list"),
    "segment_ids_per_batch": (batched("segment-ids-one-list-of-lists",
                                      "{q_segment_ids: [[0, 1]], kv_segment_ids: [[0, 0, 1]]}"),
                              None, "inconsistent shapes: q_segment_ids has 1 lists: one a "
                              "batch element needs 2"),
    # block-sparse masks
    "block_mask_alone": (batched("block-mask-alone", "{block_mask: [[1]]}"), None,
                         "inconsistent shapes: block_mask and block_size are given together"),
    "block_mask_blocks": (batched("block-mask-blocks",
                                  "{block_mask: [[1, 1]], block_size: [1, 2]}"), None,
                          "inconsistent shapes: block_mask (1, 2) needs last axes (2, 2)"),
    "block_mask_ragged": (batched("block-mask-ragged",
                                  "{block_mask: [[1, 1], [1]], block_size: [1, 2]}"), None,
                          "inconsistent shapes: block_mask is not a regular array"),
    "block_mask_values": (batched("block-mask-two", "{block_mask: [[2, 1]], block_size: [2, 2]}"),
                          "block_mask", "is not valid under any of the given schemas"),
    "softmax_axis_out_of_range": (softmax("axis-5", "{axis: 5}"), None,
                                  "inconsistent shapes: axis 5 is out of range for x of 2 dims"),
    "layout_unknown_input": (case("layout-mask", "    dtypes:", "    layout: {mask: {pad: 1}}\n"
                                  "    dtypes:"), None, "layout 'mask': the case has no input"),
    "layout_order_not_a_permutation": (
        case("layout-order", "    dtypes:", "    layout: {q: {order: [0, 0]}}\n    dtypes:"),
        None, "layout 'q': order [0, 0] is not a permutation of the 2 axes"),
    "layout_pad_too_large": (case("layout-pad", "    dtypes:", "    layout: {k: {pad: 65}}\n"
                                  "    dtypes:"), "layout", "65 is greater than the maximum"),
}

#: rows whose problem is in one case: the good cases around it still load
GOOD_AROUND = [name for name in SCENARIOS if name not in (
    "malformed_yaml", "python_object_payload", "python_name_payload",
    "duplicate_key", "duplicate_flow_key")]


@pytest.fixture
def spec_dir(tmp_path):
    """tmp/spec with the project's schema, tolerances without bfloat16, and no cases."""
    spec = tmp_path / "spec"
    (spec / "cases").mkdir(parents=True)
    shutil.copy(ROOT / "spec" / "schema.json", spec)
    tolerances = yaml.safe_load((ROOT / "spec" / "tolerances.yaml").read_text())
    del tolerances["dtypes"]["bfloat16"]
    (spec / "tolerances.yaml").write_text(yaml.safe_dump(tolerances))
    return spec


def write(spec_dir, name, cases_text):
    text = f"topic: {name}\ncases:\n{cases_text}".replace("{marker}", str(spec_dir / "pwned"))
    (spec_dir / "cases" / f"{name}.yaml").write_text(text)
    return text


def line_of(text, needle, occurrence=-1) -> int:
    """1-based line of the last (or given) line holding needle."""
    return [n for n, row in enumerate(text.splitlines(), 1) if needle in row][occurrence]


def expected_location(name, text):
    """'spec/cases/NAME.yaml:LINE: case 'ID':' as the error must begin."""
    cases_text, needle, _ = SCENARIOS[name]
    case_id = cases_text.split("- id: ")[-1].split("\n")[0]
    line = line_of(text, needle) if needle else line_of(text, f"- id: {case_id}")
    return f"spec/cases/{name}.yaml:{line}: case '{case_id}':"


@pytest.mark.parametrize("name", SCENARIOS)
def test_each_problem_is_one_error_naming_file_line_and_case(spec_dir, name):
    text = write(spec_dir, name, SCENARIOS[name][0])
    spec = load_spec(spec_dir / "cases")
    assert len(spec.errors) == 1, "\n".join(map(str, spec.errors))
    message = str(spec.errors[0])
    assert message.startswith(expected_location(name, text)), message
    assert SCENARIOS[name][2] in message, message


def test_malformed_yaml_is_located_at_the_parser_line(spec_dir):
    text = write(spec_dir, "malformed", case("broken", "seed: 2}}", "seed: 2}"))
    [error] = load_spec(spec_dir / "cases").errors
    assert error.line == line_of(text, "v: {normal")    # where the parser noticed
    assert error.case_id == "broken" and "did not find expected" in error.message


def test_payload_tags_never_run(spec_dir):
    for name in ("python_object_payload", "python_name_payload"):
        write(spec_dir, name, SCENARIOS[name][0])
    (spec_dir / "cases" / "new_payload.yaml").write_text(
        f"!!python/object/new:os.system [\"touch {spec_dir / 'pwned'}\"]\n")
    errors = load_spec(spec_dir / "cases").errors
    assert len(errors) == 3 and all("is refused" in e.message for e in errors), errors
    assert not (spec_dir / "pwned").exists()


def test_a_bad_file_does_not_stop_the_others(spec_dir):
    write(spec_dir, "a_broken", case("broken", "seed: 2}}", "seed: 2}"))
    write(spec_dir, "b_good", case("fine") + case("bad-op", "op: sdpa", "op: sdpaa"))
    spec = load_spec(spec_dir / "cases")
    assert [c.id for c in spec.cases] == ["fine"]
    assert [e.case_id for e in spec.errors] == ["broken", "bad-op"]


def _write_twins(spec_dir) -> tuple[int, int]:
    """mine.yaml with 'same-id' and 'other', then bad.yaml (alphabetically first) with
    another 'same-id': the lines of the two 'same-id' cases (mine, bad)."""
    mine = write(spec_dir, "mine", case("other") + case("same-id"))
    bad = write(spec_dir, "bad", case("same-id", "seed: 1}", "seed: 7}"))
    return line_of(mine, "- id: same-id"), line_of(bad, "- id: same-id")


def _twin_errors(mine, bad) -> list[str]:
    return [f"spec/cases/bad.yaml:{bad}: case 'same-id': duplicate case id (also at "
            f"spec/cases/mine.yaml:{mine}): neither case runs until one is renamed",
            f"spec/cases/mine.yaml:{mine}: case 'same-id': duplicate case id (also at "
            f"spec/cases/bad.yaml:{bad}): neither case runs until one is renamed"]


@pytest.mark.parametrize("cached", [False, True])
def test_a_duplicate_case_id_runs_neither_case(spec_dir, tmp_path, monkeypatch, cached):
    """The loader cannot know which of two cases of one id is the newcomer: neither wins,
    each is reported naming the other, on a cold load and on one from the spec cache."""
    monkeypatch.setenv("ATTENTION_CONFORMANCE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ATTENTION_CONFORMANCE_CACHE_KEY", str(tmp_path / "cache-key"))
    mine, bad = _write_twins(spec_dir)
    if cached:
        load_spec(spec_dir / "cases", cache=True)
    spec = load_spec(spec_dir / "cases", cache=cached)
    assert [c.id for c in spec.cases] == ["other"]
    assert sorted(map(str, spec.errors)) == _twin_errors(mine, bad)


def test_a_case_id_twice_in_one_file_runs_neither(spec_dir):
    text = write(spec_dir, "twins", case("twin") + case("twin", "seed: 1}", "seed: 7}"))
    first, second = (line_of(text, "- id: twin", n) for n in (0, 1))
    spec = load_spec(spec_dir / "cases")
    assert spec.cases == []
    assert [str(e) for e in spec.errors] == [
        f"spec/cases/twins.yaml:{first}: case 'twin': duplicate case id (also at "
        f"spec/cases/twins.yaml:{second}): neither case runs until one is renamed",
        f"spec/cases/twins.yaml:{second}: case 'twin': duplicate case id (also at "
        f"spec/cases/twins.yaml:{first}): neither case runs until one is renamed"]


def test_the_plugin_runs_neither_case_of_a_duplicate_id(spec_dir, pytester):
    mine, bad = _write_twins(spec_dir)
    result = pytester.runpytest_inprocess(
        str(spec_dir / "cases"), "--backend", "numpy", "-p", "no:cacheprovider",
        "--spec-dir", str(spec_dir / "cases"), "-q")
    result.assert_outcomes(passed=1, failed=2)          # 'other'; a spec error in each file
    result.stdout.fnmatch_lines([f"*{line}*" for line in _twin_errors(mine, bad)],
                                consecutive=False)
    assert "same-id[float64]" not in result.stdout.str()


def test_a_case_the_schema_refuses_has_its_non_finite_numbers_reported_too(spec_dir):
    """A NaN std beside a scale the schema refuses: both in one run, each at its line;
    a NaN the schema itself names (an integer seed) is reported once."""
    text = write(spec_dir, "two", case("two-problems", "seed: 1}", "seed: 1, std: .nan}")
                 .replace("    dtypes:", "    params: {scale: 1e999}\n    dtypes:")
                 + case("nan-seed", "seed: 2}", "seed: .nan}"))
    errors = load_spec(spec_dir / "cases").errors
    assert [(e.line, e.case_id) for e in errors] == [
        (line_of(text, "std: .nan"), "two-problems"), (line_of(text, "1e999"), "two-problems"),
        (line_of(text, "seed: .nan"), "nan-seed")], "\n".join(map(str, errors))
    assert "inputs/q/normal/std must be a finite number, not nan" in errors[0].message
    assert "schema: at cases/0/params/scale" in errors[1].message
    assert "schema: at cases/1/inputs/k/normal/seed" in errors[2].message


def test_validate_reports_every_problem_in_one_run(spec_dir):
    texts = {name: write(spec_dir, name, cases_text)
             for name, (cases_text, _, _) in SCENARIOS.items()}
    write(spec_dir, "zz_good", case("good-one"))
    done = subprocess.run([sys.executable, "-m", "attention_conformance", "--spec-dir",
                           str(spec_dir / "cases"), "validate"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for name, text in texts.items():
        start = expected_location(name, text)
        assert any(line.startswith(start) and SCENARIOS[name][2] in line for line in lines), \
            f"{name}: no line starting {start!r}\n{done.stdout}"
    # the valid case: good-one
    assert lines[-1].startswith("1 valid cases") and f"{len(SCENARIOS)} problems" in lines[-1]
    assert not (spec_dir / "pwned").exists()


def test_the_plugin_fails_a_bad_case_and_runs_the_good_ones(spec_dir, pytester):
    text = write(spec_dir, "mixed", case("good-one") + case("bad-op", "op: sdpa", "op: sdpaa"))
    result = pytester.runpytest_inprocess(
        str(spec_dir / "cases"), "--backend", "numpy", "-p", "no:cacheprovider",
        "--spec-dir", str(spec_dir / "cases"), "-q")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([f"*spec/cases/mixed.yaml:{line_of(text, 'sdpaa')}: case 'bad-op':"
                                 " schema: at cases/1/op: unknown op 'sdpaa'*"])


def bad_line(name, good_before):
    """The line of a scenario's fault when `good_before` and the header precede it."""
    cases_text, needle, _ = SCENARIOS[name]
    rows = cases_text.splitlines()
    within = [n for n, row in enumerate(rows, 1) if needle in row][-1] if needle else 1
    return 2 + good_before.count("\n") + within


@pytest.mark.parametrize("name", GOOD_AROUND)
def test_the_good_cases_around_a_bad_one_still_load(spec_dir, name):
    before, after = case("good-before"), case("good-after")
    write(spec_dir, name, before + SCENARIOS[name][0] + after)
    tracemalloc.start()         # NumPy reports its arrays: at most one case's worth is made
    try:
        spec = load_spec(spec_dir / "cases")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MAX_CASE_ELEMENTS * 8, f"loading took {peak / 2**20:.0f} MiB at its peak"
    assert [c.id for c in spec.cases] == ["good-before", "good-after"], spec.errors
    [error] = spec.errors
    case_id = SCENARIOS[name][0].split("- id: ")[-1].split("\n")[0]
    assert (error.file, error.line, error.case_id) == \
        (f"spec/cases/{name}.yaml", bad_line(name, before), case_id), str(error)
    assert SCENARIOS[name][2] in error.message, error.message


def _distinct_nodes(text) -> int:
    """The YAML nodes of a text, each alias the one node it names (none expanded)."""
    seen, todo = set(), [yaml.compose(text)]
    while todo:
        node = todo.pop()
        if id(node) not in seen:
            seen.add(id(node))
            todo.extend(child for child, _ in yaml_reader._children(node))
    return len(seen)


def test_an_alias_bomb_is_refused_without_expanding_it(spec_dir, monkeypatch):
    """The loader measures the bomb memoized: it looks at each node of the file a few
    times (once per measure of the graph), never once per alias expanded."""
    levels, width = 9, 9
    text = write(spec_dir, "bomb", case("bomb", "    dtypes:", bomb(levels, width) + "    dtypes:"))
    looked, own_problem = [], yaml_reader._own_problem
    monkeypatch.setattr(yaml_reader, "_own_problem",
                        lambda *a: looked.append(1) or own_problem(*a))
    [error] = load_spec(spec_dir / "cases").errors
    nodes = _distinct_nodes(text)
    assert nodes < 200 and len(looked) <= 5 * nodes, \
        f"{len(looked):,} nodes looked at for a file of {nodes} ({width} ** {levels} expanded)"
    innermost = 1 + width                       # a0: a list of `width` strings
    for _ in range(1, levels):
        innermost = 1 + width * innermost       # a_i: a list of `width` a_(i-1)
    count = int(error.message.split(" expands to ")[1].split(" ")[0].replace(",", ""))
    assert count > innermost > 200_000, error.message


def test_the_plugin_fails_each_refused_case_and_runs_the_good_one(spec_dir, pytester):
    names = ("alias_bomb", "binary_property_argument", "nan_std", "num_heads_float")
    text = write(spec_dir, "mixed", case("good-one") + "".join(SCENARIOS[n][0] for n in names))
    result = pytester.runpytest_inprocess(
        str(spec_dir / "cases"), "--backend", "numpy", "-p", "no:cacheprovider",
        "--spec-dir", str(spec_dir / "cases"), "-q")
    result.assert_outcomes(passed=1, failed=len(names))
    for name in names:
        cases_text, needle, message = SCENARIOS[name]
        case_id = cases_text.split("- id: ")[-1].split("\n")[0]
        offset = text.index(cases_text)
        line = text[:offset].count("\n") + (bad_line(name, "") - 2)
        result.stdout.fnmatch_lines([f"*spec/cases/mixed.yaml:{line}: case '{case_id}':*"
                                     f"{message[:40]}*"])


def file_error(spec_dir, name, text):
    """The one error of a file written as is; a good file beside it still loads."""
    (spec_dir / "cases" / name).write_text(text)
    write(spec_dir, "zz_good", case("good-one"))
    spec = load_spec(spec_dir / "cases")
    assert [c.id for c in spec.cases] == ["good-one"]
    [error] = spec.errors
    return error


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(spec_dir):
    text = f"topic: big\n# {'x' * MAX_FILE_BYTES}\ncases:\n{case('in-a-big-file')}"
    error = file_error(spec_dir, "big.yaml", text)
    assert str(error) == (f"spec/cases/big.yaml:1: the file has {len(text):,} bytes "
                          f"(at most {MAX_FILE_BYTES:,}: split it)")


def test_a_bomb_outside_every_case_refuses_the_file(spec_dir):
    text = "topic: bomb\ndescription:\n" + bomb().replace("    note:\n", "").replace(
        "      a", "  a") + f"cases:\n{case('fine')}"
    error = file_error(spec_dir, "bomb.yaml", text)
    assert error.line == 1 and error.case_id is None
    assert "the file expands to" in error.message and "(at most 200,000)" in error.message


def test_a_topic_with_a_newline_is_refused(spec_dir):
    text = f'topic: "newline\\n"\ncases:\n{case("fine")}'
    error = file_error(spec_dir, "newline.yaml", text)
    assert str(error) == ("spec/cases/newline.yaml:1: schema: at topic: 'newline\\n' does not "
                          "match '^[a-z0-9][a-z0-9_-]*$'")


def test_a_topic_that_is_not_the_file_name_is_refused(spec_dir):
    error = file_error(spec_dir, "named.yaml", f"topic: other\ncases:\n{case('fine')}")
    assert str(error) == "spec/cases/named.yaml:1: topic 'other' is not the file's name 'named'"


def test_an_id_with_a_newline_is_refused(spec_dir):
    text = write(spec_dir, "ids", case("good-one") + case('"bad-id\\n"'))
    spec = load_spec(spec_dir / "cases")
    assert [c.id for c in spec.cases] == ["good-one"]
    [error] = spec.errors
    assert str(error) == (f"spec/cases/ids.yaml:{line_of(text, 'bad-id')}: case 'bad-id\\n': "
                          "schema: at cases/1/id: 'bad-id\\n' does not match "
                          "'^[a-z0-9][a-z0-9._-]*$'")


def test_the_patterns_of_validation_are_the_schemas():
    schema = json.loads((ROOT / "spec" / "schema.json").read_text())
    assert schema["properties"]["topic"]["pattern"] == f"^{TOPIC_PATTERN}$"
    assert schema["$defs"]["case"]["properties"]["id"]["pattern"] == f"^{ID_PATTERN}$"


def test_nan_and_infinities_are_kept_where_they_are_allowed(spec_dir):
    """Input values, set values and exact values may be NaN or infinite."""
    write(spec_dir, "words", case("nan-where-allowed", "v: {normal: {shape: [3, 4], seed: 3}}",
                                  "v: {values: [[.nan, 1, 2, 3], [.inf, 0, 0, 0], [1, 2, 3, 4]], "
                                  "set: [{at: '[2]', value: -.inf}]}")
          .replace("{properties: [finite]}", "{exact: {\"[...]\": .nan}}"))
    spec = load_spec(spec_dir / "cases")
    assert not spec.errors and [c.id for c in spec.cases] == ["nan-where-allowed"], spec.errors


def test_a_file_whose_cases_pass_the_file_limit(spec_dir):
    """Each case is within the case limits; the one that takes the file past its limit
    of elements is refused, the cases before it load."""
    big = (case("x", "{normal: {shape: [2, 4], seed: 1}}", "{full: {shape: [1, 4], value: 1.0}}")
           .replace("{normal: {shape: [3, 4], seed: 2}}", "{full: {shape: [2097152, 4], value: 0.5}}")
           .replace("{normal: {shape: [3, 4], seed: 3}}", "{full: {shape: [2097152, 1], value: 2.0}}"))
    per_case = 2097152 * 4 + 2097152 + 4 + 1            # k, v, q and the output
    assert per_case <= MAX_CASE_ELEMENTS
    count = MAX_FILE_ELEMENTS // per_case + 1
    text = write(spec_dir, "heavy", "".join(big.replace("id: x", f"id: big-{n}") for n in range(count)))
    spec = load_spec(spec_dir / "cases")
    assert [c.id for c in spec.cases] == [f"big-{n}" for n in range(count - 1)]
    [error] = spec.errors
    assert str(error) == (f"spec/cases/heavy.yaml:{line_of(text, f'id: big-{count - 1}')}: case "
                          f"'big-{count - 1}': with this case, the inputs and outputs of the "
                          f"file's cases pass {MAX_FILE_ELEMENTS:,} elements (at most that per "
                          "file: split the file)")


def test_a_stray_yml_file_is_one_error_and_the_good_cases_load(spec_dir):
    error = file_error(spec_dir, "stray.yml", f"topic: stray\ncases:\n{case('in-a-yml')}")
    assert str(error) == ("spec/cases/stray.yml: case files end in .yaml: this file is not "
                          "loaded (rename it stray.yaml)")


def test_the_plugin_fails_a_stray_yml_as_one_item_and_runs_the_good_cases(spec_dir, pytester):
    """One failing item naming the file (a usage error before: exit 4, no case ran); a
    file of another kind (notes) is not the spec's, and is left alone."""
    write(spec_dir, "good", case("good-one"))
    (spec_dir / "cases" / "stray.yml").write_text(f"topic: stray\ncases:\n{case('in-a-yml')}")
    (spec_dir / "cases" / "notes.txt").write_text("not a case file\n")
    result = pytester.runpytest_inprocess(
        str(spec_dir / "cases"), "--backend", "numpy", "-p", "no:cacheprovider",
        "--spec-dir", str(spec_dir / "cases"), "-q")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*invalid spec: spec/cases/stray.yml: case files end in .yaml:"
                                 " this file is not loaded (rename it stray.yaml)*"])
    assert "notes.txt" not in result.stdout.str()


TOLERANCES = "multiplier: 4\nproperty_roundings: 4\ndtypes:\n  float64: {unit_roundoff: 1.0e-16}\n"

#: a broken tolerances.yaml -> (its text, the line at fault, the message)
BAD_TOLERANCES = {
    "dtypes_a_list": (TOLERANCES.replace("dtypes:\n  float64: {unit_roundoff: 1.0e-16}",
                                         "dtypes: [float64]"),
                      3, "dtypes maps each dtype to {unit_roundoff: NUMBER}"),
    "multiplier_a_word": (TOLERANCES.replace("multiplier: 4", "multiplier: four"), 1,
                          "multiplier must be a positive number, not 'four'"),
    "no_property_roundings": (TOLERANCES.replace("property_roundings: 4\n", ""), 1,
                              "property_roundings must be a positive number, not None"),
    "unit_roundoff_missing": (TOLERANCES.replace("{unit_roundoff: 1.0e-16}", "{}"), 4,
                              "dtypes/float64/unit_roundoff must be a positive number"),
    "unknown_dtype": (TOLERANCES + "  float8: {unit_roundoff: 0.1}\n", 5,
                      "dtypes: 'float8' is not a dtype (known: float64, float32"),
    "plain_error_from_unknown": (TOLERANCES.replace("1.0e-16}", "1.0e-16, plain_error_from: "
                                                                "float32}"), 4,
                                 "dtypes/float64/plain_error_from: 'float32' has no tolerance"),
    "malformed_yaml": (TOLERANCES.replace("1.0e-16}", "[1.0e-16}"), 4, "invalid YAML: expected"),
    "not_a_mapping": ("- 4\n", 1, "the file is a mapping with multiplier, property_roundings"),
}


@pytest.mark.parametrize("name", BAD_TOLERANCES)
def test_a_broken_tolerances_file_is_one_error_naming_file_line_and_key(spec_dir, name):
    text, line, message = BAD_TOLERANCES[name]
    (spec_dir / "tolerances.yaml").write_text(text)
    write(spec_dir, "good", case("good-one"))
    spec = load_spec(spec_dir / "cases")
    assert [str(e) for e in spec.errors] == [f"spec/tolerances.yaml:{line}: "
                                             f"{spec.errors[0].message}"] and not spec.cases
    assert spec.errors[0].message.startswith(message), spec.errors[0].message


def test_validate_and_the_plugin_give_a_broken_tolerances_file_one_line(spec_dir, pytester):
    (spec_dir / "tolerances.yaml").write_text(BAD_TOLERANCES["dtypes_a_list"][0])
    write(spec_dir, "good", case("good-one"))
    done = subprocess.run([sys.executable, "-m", "attention_conformance", "--spec-dir",
                           str(spec_dir / "cases"), "validate"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 1 and not done.stderr, done.stderr
    assert done.stdout.splitlines()[0] == ("spec/tolerances.yaml:3: dtypes maps each dtype to "
                                           "{unit_roundoff: NUMBER}")
    # refused at configure: Hypothesis' plugin, kept out, would never see its session start
    result = pytester.runpytest_inprocess(
        str(spec_dir / "cases"), "--backend", "numpy", "-p", "no:cacheprovider",
        "-p", "no:hypothesispytest", "--spec-dir", str(spec_dir / "cases"), "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.strip()]
    assert errors == [f"ERROR: {spec_dir.resolve() / 'tolerances.yaml'}:3: dtypes maps each "
                      "dtype to {unit_roundoff: NUMBER}"], errors


def test_an_empty_cases_folder_is_one_problem_naming_it(tmp_path, pytester, capsys):
    """A folder with no case file ran nothing ('no tests ran', exit 5) and validated as
    0 cases with no problem; it is refused as a missing folder is, in one line."""
    from attention_conformance.cli import main

    empty = tmp_path / "spec" / "cases"
    empty.mkdir(parents=True)
    assert [str(e) for e in load_spec(empty).errors] == \
        [f"{empty}: no case files (*.yaml) in this folder"]
    assert main(["--spec-dir", str(empty), "validate"]) == 1
    assert capsys.readouterr().out.splitlines()[0] == \
        f"{empty}: no case files (*.yaml) in this folder"
    assert _plugin_refusal(pytester, empty, empty) == \
        [f"ERROR: {empty}: no case files (*.yaml) in this folder"]
    (empty / "old.yml").write_text("topic: old\ncases: []\n")   # a misnamed file: its hint
    assert [e.message for e in load_spec(empty).errors] == \
        ["case files end in .yaml: this file is not loaded (rename it old.yaml)"]


def test_certify_refuses_a_missing_folder_at_the_root_with_one_line():
    """Its parent is / (where certify's settings file, /dev/null, lies): still the one
    true line, not a complaint about pytest settings inside the spec."""
    missing = f"/attention-conformance-no-such-spec-{os.getpid()}"
    result = cli("certify", "numpy", "--spec-dir", missing, "-q")
    assert result.returncode == 4, result.stdout + result.stderr
    assert result.stderr.strip() == f"ERROR: {missing}: no such folder of case files"


def test_the_plugin_refuses_a_missing_cases_folder_with_one_line(tmp_path, pytester):
    missing = tmp_path / "nowhere" / "cases"
    assert _plugin_refusal(pytester, tmp_path, missing) == \
        [f"ERROR: {missing}: no such folder of case files"]


def _plugin_refusal(pytester, collected, spec_dir) -> list[str]:
    """The error lines of a plugin run refused as a usage error (refused at configure:
    Hypothesis' plugin, kept out, would never see its session start)."""
    result = pytester.runpytest_inprocess(str(collected), "--backend", "numpy", "--spec-dir",
                                          str(spec_dir), "-q", "-p", "no:cacheprovider",
                                          "-p", "no:hypothesispytest")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    return [line for line in result.errlines if line.strip()]
