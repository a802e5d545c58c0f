"""The slow tests of the distributed backends (a fresh certification run with its ranks,
every sharded case on a known-bad or example ring) run where their tox environment asks
for them (`tox -e torch-ring` sets ATTENTION_CONFORMANCE_RING_TESTS=1), not in the
suite's own quick run; the quick ones (a rank killed in-process, the plumbing) run there."""

import os

import pytest

RING_TESTS = "ATTENTION_CONFORMANCE_RING_TESTS"

#: a test that takes more than a few seconds of a certification's ranks
slow_ring = pytest.mark.skipif(not os.environ.get(RING_TESTS),
                               reason=f"slow: tox -e torch-ring runs it ({RING_TESTS}=1)")
