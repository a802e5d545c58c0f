"""A rank killed in a collective makes its peer raise first (a gloo error): the death is
the test's status. A killed rank's files (its sentinel, its sockets) close before it can
be reaped, so the group waits for the reaping, not for the closing alone."""

from __future__ import annotations

import os

import pytest

from attention_conformance.backend import distributed
from attention_conformance.backend.distributed import RankCrashed


class Silent:
    """A rank's end of the answer pipe with nothing in it."""

    def poll(self):
        return False


class ClosedNotReaped:
    """A rank whose files are closed (its sentinel ready) but whose exit status comes only
    once it is waited for: what the kernel shows between a SIGKILL's closing and reaping."""

    def __init__(self):
        self.sentinel, write = os.pipe()
        os.close(write)
        self.exitcode = None

    def join(self, timeout=None):
        self.exitcode = -9

    def is_alive(self):
        return self.exitcode is None


def test_a_peers_error_gives_way_to_a_rank_whose_death_is_not_yet_reaped():
    dying = ClosedNotReaped()
    answers = [("raised", "RuntimeError", "gloo: connection closed by peer"), None]
    with pytest.raises(RankCrashed, match=r"rank 1 of 2 died during sdpa_lse \(killed by "
                                          r"signal SIGKILL\)"):
        distributed._crash_behind([(None, Silent()), (dying, Silent())], answers,
                                  "sdpa_lse", 2)
    os.close(dying.sentinel)


def test_a_group_that_cannot_form_is_the_suites_error_not_the_backends():
    """A rank that fails in the rendezvous (before the method runs) answers 'unformed':
    the group is started again once by invoke_sharded, then the test is the suite's error."""
    from attention_conformance.backend.distributed import GroupUnformed, _result

    with pytest.raises(GroupUnformed, match="rank 0 of 4 could not join its group: "
                                            "RuntimeError: Gloo connectFullMesh failed"):
        _result("sdpa", {}, 0, 4, ("unformed", "RuntimeError: Gloo connectFullMesh failed", ""))
