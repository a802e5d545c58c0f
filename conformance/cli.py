"""The command line: attention-conformance (also python -m conformance)."""

from __future__ import annotations

import argparse
import sys

from . import golden
from .paths import CASES_DIR, GOLDEN_DIR
from .spec import load_spec


def _validate(args) -> int:
    spec = load_spec(args.spec_dir or CASES_DIR)
    for error in spec.errors:
        print(error)
    variants = sum(len(c.variants) * len(c.dtypes) for c in spec.cases)
    print(f"{len(spec.cases)} valid cases ({variants} tests per backend), "
          f"{len(spec.errors)} problems")
    return 1 if spec.errors else 0


def _golden(args) -> int:
    spec = load_spec(args.spec_dir or CASES_DIR)
    for error in spec.errors:
        print(error, file=sys.stderr)
    if spec.errors:
        print("fix the spec first: golden data are only made from valid cases", file=sys.stderr)
        return 1
    directory = GOLDEN_DIR if not args.spec_dir else golden.Path(args.spec_dir).parent / "golden"
    if args.action == "regenerate":
        changes = golden.regenerate(spec.cases, directory)
        for key, what in changes:
            print(f"{key}: {what}")
        print(f"{len(changes)} golden arrays changed")
        return 0
    problems = golden.check(spec.cases, directory)
    for problem in problems:
        print(problem)
    print("golden data match the reference" if not problems else f"{len(problems)} problems")
    return 1 if problems else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attention-conformance", description=__doc__)
    parser.add_argument("--spec-dir", default=None, help="case files (default spec/cases)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("validate", help="check every spec file against the schema")
    g = sub.add_parser("golden", help="check or regenerate the golden data")
    g.add_argument("action", choices=("check", "regenerate"))
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {"validate": _validate, "golden": _golden}
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
