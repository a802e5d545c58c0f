"""One table of a certification's options (conformance/options.py): the pytest plugin and
the command line's certify both build from it, and certify forwards what it declares."""

from __future__ import annotations

import argparse

import pytest

from attention_conformance import options, plugin
from attention_conformance.cli import build_parser, certify_argv
from attention_conformance.model.dtypes import DTYPES
from attention_conformance.options import FORWARDED, OPTIONS, OWN, PASSTHROUGH, rows


def _certify_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["certify"]


def _plugin_parser() -> pytest.Parser:
    parser = pytest.Parser(_ispytest=True)
    plugin.pytest_addoption(parser)
    return parser


def test_the_plugin_declares_every_row_with_its_default():
    defaults = vars(_plugin_parser().parse_known_args([]))
    assert {o.dest: o.default for o in OPTIONS} == {o.dest: defaults[o.dest] for o in OPTIONS}
    group = _plugin_parser().getgroup("attention-conformance")
    helps = {opt.names()[0]: opt.attrs()["help"] for opt in group.options}
    assert helps == {o.flag: o.help for o in OPTIONS}


def test_certify_declares_the_forwarded_rows_as_the_plugin_does():
    declared = {a.option_strings[0]: a for a in _certify_parser()._actions if a.option_strings}
    for option in rows(FORWARDED) + rows(PASSTHROUGH):
        assert (option.flag in declared) == (option.certify == FORWARDED), option.flag
    for option in rows(FORWARDED):
        action = declared[option.flag]
        assert (action.help, action.choices, action.metavar, action.type) == \
            (option.help, option.choices, option.metavar, option.type), option.flag
        assert action.default in (None, False), option.flag     # given or not forwarded

def test_certify_forwards_every_forwarded_row_to_pytest():
    given = {"--device": ["cuda:1"], "--profile": ["long"], "--dtype": ["float16", "bfloat16"],
             "--expected-failures": ["a.yaml", "b.yaml"], "--report": ["out"]}
    assert set(given) == {o.flag for o in rows(FORWARDED)}
    command = ["certify", "numpy"] + [w for flag, values in given.items()
                                      for v in values for w in (flag, v)]
    args, unknown = build_parser().parse_known_args(command)
    argv = certify_argv(args, unknown)
    for flag, values in given.items():
        pairs = [argv[i + 1] for i, word in enumerate(argv) if word == flag]
        assert pairs == values, flag
    bare = certify_argv(*build_parser().parse_known_args(["certify", "numpy"]))
    assert not set(bare) & set(given)             # nothing given, nothing forwarded


def test_the_other_rows_reach_pytest_untouched():
    """PASSTHROUGH rows are left to pytest, and certify's help names each of them."""
    passthrough = ["--case-timeout", "5", "--in-process", "--restart-every", "3"]
    args, unknown = build_parser().parse_known_args(["certify", "numpy", *passthrough])
    assert certify_argv(args, unknown)[-5:] == passthrough
    epilog = _certify_parser().epilog
    assert all(o.flag in epilog for o in rows(PASSTHROUGH)) and rows(PASSTHROUGH)
    assert {o.flag for o in rows(OWN)} == {"--backend", "--spec-dir"}


def test_the_dtype_names_are_the_specs():
    assert options.DTYPE_NAMES == DTYPES
