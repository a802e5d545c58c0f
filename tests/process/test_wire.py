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


# --------------------------------------------------------------- arrays sent as files


@pytest.fixture
def small_limits(monkeypatch):
    """A frame limit of 64 KiB and arrays of 16 KiB or more sent as files: a call larger
    than the limit, made of a few hundred KiB."""
    monkeypatch.setattr(wire, "MAX_FRAME_BYTES", 64 << 10)
    monkeypatch.setattr(wire, "SPILL_BYTES", 16 << 10)


def spill_files(folder) -> list:
    return sorted(p.name for p in folder.iterdir())


def test_an_array_past_the_frame_limit_crosses_as_a_file_that_is_then_removed(
        small_limits, tmp_path):
    """A mask four times the frame limit goes as a file in the run's folder, arrives as
    a base ndarray of its bytes, and the file is gone once it is read; the arrays below
    the threshold go in the frame as before. Without a folder the same call is refused
    for its size."""
    ours, theirs = socket.socketpair()
    sender, receiver = wire.Channel(ours, spill_to=str(tmp_path)), \
        wire.Channel(theirs, spill_from=str(tmp_path))
    mask = np.random.default_rng(0).standard_normal((4, 256, 256)) > 0      # 256 KiB
    small = np.arange(12.0).reshape(3, 4)
    try:
        sender.send(protocol.Call(1, "sdpa", {"mask": mask, "q": small}, {}))
        assert [n.startswith("spill-") for n in spill_files(tmp_path)] == [True]
        got = receiver.receive(time.monotonic() + 30)
        assert got.arrays["mask"].dtype == bool and got.arrays["mask"].base is None
        np.testing.assert_array_equal(got.arrays["mask"], mask)
        np.testing.assert_array_equal(got.arrays["q"], small)
        assert spill_files(tmp_path) == []
        whole = wire.frame(protocol.Call(2, "sdpa", {"mask": mask}, {}))     # in the frame
        assert len(whole) > wire.MAX_FRAME_BYTES
        theirs.sendall(whole[:4096])
        with pytest.raises(wire.WireError, match="over the limit"):
            wire.Channel(ours).receive(time.monotonic() + 30)
    finally:
        sender.close()
        receiver.close()


def test_a_file_the_other_end_never_read_is_removed_when_its_channel_closes(
        small_limits, tmp_path):
    """A backend's process that dies before it reads its call (or never reads it) leaves
    nothing: the judge's end deletes what it wrote when it ends that process."""
    ours, theirs = socket.socketpair()
    sender = wire.Channel(ours, spill_to=str(tmp_path))
    sender.send(protocol.Call(1, "softmax", {"x": np.zeros((64, 64))}, {}))   # 32 KiB
    sender.send(protocol.Call(2, "softmax", {"x": np.ones((64, 64))}, {}))
    assert len(spill_files(tmp_path)) == 2
    theirs.close()
    sender.close()
    assert spill_files(tmp_path) == []


def test_no_array_is_written_through_a_link_nor_read_from_a_name_it_did_not_make(
        small_limits, tmp_path):
    """The folder is opened without following a link: a folder that is a link is never
    written through; a receiver reads only a spilled array's name, a regular file of
    the size its message says, in its own folder."""
    target, link = tmp_path / "elsewhere", tmp_path / "link"
    target.mkdir()
    link.symlink_to(target)
    ours, theirs = socket.socketpair()
    with pytest.raises(OSError):
        wire.Channel(ours, spill_to=str(link)).send(
            protocol.Call(1, "softmax", {"x": np.zeros((64, 64))}, {}))
    assert spill_files(target) == []
    receiver = wire.Channel(theirs, spill_from=str(target))
    (target / ("spill-" + "0" * 32 + ".bin")).write_bytes(b"\0" * 4)
    for name, error in (("../link/x", "not a spilled array's name"),
                        ("spill-" + "0" * 32 + ".bin", "holds 4 bytes, not the 8")):
        ours.sendall(_frame_naming(name))
        with pytest.raises(wire.WireError, match=error):
            receiver.receive(time.monotonic() + 30)
    ours.close()
    receiver.close()


def _frame_naming(name: str) -> bytes:
    """A call whose array x is said to be the spilled file `name` (one float64)."""
    fields = {"id": 1, "op": "softmax", "params": {}, "arrays": {"x": ["f", name, "float64", [1]]}}
    header = wire._JSON.encode({"kind": "call", "fields": fields, "buffers": []}).encode()
    return struct.pack("<4sQI", wire.MAGIC, 4 + len(header), len(header)) + header
