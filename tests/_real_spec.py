"""The package's own spec, validated in full once per test process.

Validating the real spec costs seconds; the tests that only read its cases share this
one load (never mutate it). A test of loading or of the spec cache calls load_spec
itself."""

from __future__ import annotations

import functools

from attention_conformance.specs.loader import load_spec


@functools.cache
def real_spec():
    return load_spec()
