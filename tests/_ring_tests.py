"""The slow tests of the distributed backends (a fresh certification run with its ranks,
every sharded case on a known-bad or example ring) run where their tox environment asks
for them (`tox -e torch-ring` sets ATTENTION_CONFORMANCE_RING_TESTS=1), not in the
suite's own quick run; the quick ones (a rank killed in-process, the plumbing) run there."""

import os

import pytest

RING_TESTS = "ATTENTION_CONFORMANCE_RING_TESTS"

#: a test that takes more than a few seconds of a certification's ranks
slow_ring = pytest.mark.skipif(not os.environ.get(RING_TESTS),
                               reason=f"slow: tox -e torch-ring or jax-ring runs it "
                                      f"({RING_TESTS}=1)")


def children() -> set[int]:
    """The ids of this process's child processes (a rank left behind would be one)."""
    me = str(os.getpid())
    found = set()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if fields[1].decode() == me:
                found.add(int(entry))
        except (OSError, ValueError, IndexError):
            pass
    return found
