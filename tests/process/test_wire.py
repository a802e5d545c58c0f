"""The bytes between the run's processes (process/wire.py): a message arrives as it was
sent, arrays as base ndarrays of their dtype; bytes that are no message, a message over
the size limit or a peer that sends nothing are an error at once or at the deadline,
never a read that waits forever."""

from __future__ import annotations

import socket
import struct
import time

import numpy as np
import pytest

from attention_conformance.process import protocol, wire


@pytest.fixture
def pair():
    ours, theirs = socket.socketpair()
    yield wire.Channel(ours), theirs
    ours.close()
    theirs.close()


def test_a_message_arrives_as_sent_with_its_arrays(pair):
    channel, theirs = pair
    arrays = {"q": np.arange(6, dtype=np.float16).reshape(2, 3), "mask": np.eye(2, dtype=bool)}
    sent = protocol.Call(3, "sdpa", arrays, {"window": [1, None], "scale": 0.5})
    theirs.sendall(wire.frame(sent) + wire.frame(protocol.Run(["a", "b"])))
    got = channel.receive(time.monotonic() + 5)
    assert (got.id, got.op, got.params) == (3, "sdpa", {"window": [1, None], "scale": 0.5})
    for name, array in arrays.items():
        assert got.arrays[name].dtype == array.dtype and got.arrays[name].base is None
        np.testing.assert_array_equal(got.arrays[name], array)
    assert channel.receive(time.monotonic() + 5) == protocol.Run(["a", "b"])    # same read


def test_bytes_that_are_no_message_are_an_error_at_once(pair):
    channel, theirs = pair
    theirs.sendall(b"hello from the adapter\n")
    with pytest.raises(wire.WireError, match="bytes that are no message: b'hello"):
        channel.receive(time.monotonic() + 60)


def test_a_message_over_the_limit_is_refused_before_it_is_read(pair):
    channel, theirs = pair
    theirs.sendall(struct.pack("<4sQI", wire.MAGIC, wire.MAX_FRAME_BYTES + 1, 10))
    with pytest.raises(wire.WireError, match="over the limit"):
        channel.receive(time.monotonic() + 60)


@pytest.mark.parametrize("partial", [b"", wire.MAGIC, wire.frame(protocol.Run(["a"]))[:-1]])
def test_nothing_or_part_of_a_message_by_the_deadline_is_a_timeout(pair, partial):
    channel, theirs = pair
    theirs.sendall(partial)
    started = time.monotonic()
    with pytest.raises(wire.WireTimeout):
        channel.receive(time.monotonic() + 0.5)
    assert time.monotonic() - started < 5


def test_a_message_of_an_unknown_kind_or_field_is_an_error(pair):
    channel, theirs = pair
    good = wire.frame(protocol.Run(["a"]))
    theirs.sendall(good.replace(b'"run"', b'"rum"'))
    with pytest.raises(wire.WireError, match="not a message of this protocol"):
        channel.receive(time.monotonic() + 5)


def test_a_peer_that_takes_no_bytes_is_a_timeout_for_the_writer(pair):
    channel, theirs = pair
    big = protocol.Call(1, "sdpa", {"q": np.zeros(4 << 20)}, {})     # 32 MiB, never read
    with pytest.raises(wire.WireTimeout):
        channel.send(big, deadline=time.monotonic() + 0.5)


def test_the_end_of_the_peer_is_an_end_of_file(pair):
    channel, theirs = pair
    theirs.close()
    with pytest.raises(EOFError):
        channel.receive(time.monotonic() + 5)
