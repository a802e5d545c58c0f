"""The bytes between two processes of a run: each message (protocol.py) is one frame, a
magic number, its length, a JSON header (its kind, its fields, the spans of its arrays)
and every array as a raw buffer beside it.
Nothing is unpickled, so a message from an adapter's process carries data and nothing
else; an array arrives as a base ndarray of a known dtype.

A Channel reads and writes frames on a socket under a deadline: bytes that are not a
frame (an adapter writing on the suite's socket), a frame over the size limit, a peer
that sends nothing or stops reading are each an error at once or at the deadline, never
a read that waits forever.

A channel given a spill folder (spill.py: the judge's, towards the backend's process)
sends an array of spill.SPILL_BYTES or more as a file there, named in the frame, so
that no frame carries it; the other end, given the same folder, reads and deletes it.
"""

from __future__ import annotations

import json
import math
import select
import socket
import struct
import time

import numpy as np

from ..model.dtypes import NUMPY_DTYPES
from . import protocol
from .spill import SPILL_BYTES, SpillError, SpillFolder

#: the dtypes an array may have on the wire: the spec's, bool, and integers
WIRE_DTYPES = {**NUMPY_DTYPES, "bool": np.dtype(bool), "int64": np.dtype(np.int64),
               "int32": np.dtype(np.int32)}
_NAMES = {dtype: name for name, dtype in WIRE_DTYPES.items()}
#: a message is a tree of plain values made here: nothing to check for cycles
_JSON = json.JSONEncoder(allow_nan=True, check_circular=False, separators=(",", ":"))
MAGIC = b"ACW2"
_HEAD = struct.Struct("<4sQI")          # magic, frame length after the head, header length
#: the most an answer's arrays may hold (a backend's larger outputs are "too large"),
#: and the largest frame read (anything larger is refused before it is read)
MAX_ANSWER_BYTES = 1 << 30
MAX_FRAME_BYTES = MAX_ANSWER_BYTES + (16 << 20)
_CHUNK = 1 << 16


class WireError(Exception):
    """Bytes that are not a message of the protocol."""


class WireTimeout(Exception):
    """No whole message (or no room to write one) by the deadline."""


_LEAVES = frozenset((str, int, float, bool, type(None)))


def _encode(value, buffers: list, spill: SpillFolder | None = None):
    """A value as JSON: a dict with str keys as an object; anything else but a leaf as a
    list whose first item says what it is ("l" a list, "t" a tuple, "a" an array in the
    buffers, "f" an array in a file, "o" an object of which only the type crosses), so
    that no dict, whatever its keys, reads as anything but a dict."""
    kind = type(value)
    if kind in _LEAVES:                 # most of a message: its leaves, first
        return value
    if kind is dict and all(type(k) is str for k in value):
        return {k: _encode(v, buffers, spill) for k, v in value.items()}
    if kind is list or kind is tuple:
        return ["l" if kind is list else "t", *[_encode(v, buffers, spill) for v in value]]
    if kind is np.ndarray:
        name = _NAMES.get(value.dtype)
        if name is None:
            return ["o", f"numpy.ndarray of dtype {value.dtype}", False]
        if spill is not None and value.nbytes >= SPILL_BYTES:
            return ["f", spill.write(value), name, list(value.shape)]
        buffers.append(np.ascontiguousarray(value).reshape(-1).view(np.uint8).data)
        return ["a", len(buffers) - 1, name, list(value.shape)]
    return ["o", f"{kind.__module__}.{kind.__name__}", isinstance(value, np.ndarray)]


class Foreign:
    """What an adapter returned that is not plain data: only its type's name crosses."""

    def __init__(self, type_name: str, subclass: bool = False):
        self.type_name, self.subclass = type_name, subclass

    def __repr__(self):
        return f"<{self.type_name}>"


def _decode(value, buffers: list, spill: SpillFolder | None = None):
    kind = type(value)
    if kind is dict:
        return {k: _decode(v, buffers, spill) for k, v in value.items()}
    if kind is not list:
        return value
    tag = value[0] if value else None
    if tag == "l":
        return [_decode(v, buffers, spill) for v in value[1:]]
    if tag == "t":
        return tuple(_decode(v, buffers, spill) for v in value[1:])
    if tag == "a":
        return _array(value, buffers)
    if tag == "f":
        return _spilled(value, spill)
    if tag == "o" and len(value) == 3:
        return Foreign(str(value[1]), bool(value[2]))
    raise WireError(f"unknown message part: {value!r}"[:200])


def _array(value: list, buffers: list) -> np.ndarray:
    """An array sent in the frame's buffers, copied out of them."""
    _, index, dtype, shape = value if len(value) == 4 else (None, None, None, None)
    dtype = WIRE_DTYPES.get(dtype) if isinstance(dtype, str) else None
    if dtype is None or not isinstance(index, int) or not 0 <= index < len(buffers) \
            or not isinstance(shape, list):
        raise WireError(f"bad array in message: {value!r}"[:200])
    try:
        return np.frombuffer(buffers[index], dtype=dtype).reshape(shape).copy()
    except (ValueError, TypeError) as exc:
        raise WireError(f"bad array in message: {exc}") from None


def _spilled(value: list, spill: SpillFolder | None) -> np.ndarray:
    """An array sent as a file (spill.py), read and deleted."""
    _, name, dtype, shape = value if len(value) == 4 else (None, None, None, None)
    dtype = WIRE_DTYPES.get(dtype) if isinstance(dtype, str) else None
    if spill is None or dtype is None or not isinstance(shape, list) \
            or not all(type(n) is int and n >= 0 for n in shape):
        raise WireError(f"bad spilled array in message: {value!r}"[:200])
    try:
        return spill.read(name, dtype, shape)
    except SpillError as exc:
        raise WireError(str(exc)) from None


def frame(msg, spill: SpillFolder | None = None) -> bytes:
    """One message as the bytes of its frame (its large arrays written to spill): its
    kind, its fields and the spans of its buffers as the JSON header, then the buffers."""
    buffers: list = []
    fields = _encode(protocol.fields_of(msg), buffers, spill)
    spans, offset = [], 0
    for buffer in buffers:
        spans.append([offset, len(buffer)])
        offset += len(buffer)
    header = _JSON.encode({"kind": msg.KIND, "fields": fields, "buffers": spans}).encode()
    return b"".join([_HEAD.pack(MAGIC, 4 + len(header) + offset, len(header)), header, *buffers])


def array_bytes(value) -> int:
    """The bytes of every ndarray in a tree of plain values (an answer's outputs)."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, (list, tuple)):
        return sum(array_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(array_bytes(v) for v in value.values())
    return 0


def _parse(data: memoryview, spill: SpillFolder | None = None):
    size = _HEAD.size
    _, length, header_size = _HEAD.unpack(data[:size])
    try:
        header = json.loads(data[size:size + header_size].tobytes())
        spans, kind, fields = header["buffers"], header["kind"], header["fields"]
    except (ValueError, KeyError, TypeError) as exc:
        raise WireError(f"a message header that is not the protocol's: {exc}") from None
    payload = data[size + header_size:4 + 8 + length]
    buffers = []
    for span in spans:
        if not (type(span) is list and len(span) == 2 and all(type(v) is int for v in span)
                and 0 <= span[0] and 0 <= span[1] and span[0] + span[1] <= len(payload)):
            raise WireError(f"bad buffer span {span!r}"[:200])
        buffers.append(payload[span[0]:span[0] + span[1]])
    try:
        return protocol.decode(kind, _decode(fields, buffers, spill))
    except protocol.ProtocolError as exc:
        raise WireError(str(exc)) from None


class Channel:
    """One end of a socket pair, carrying frames. spill_to: the folder this end writes
    its large arrays to; spill_from: the folder it reads them from (spill.py)."""

    def __init__(self, sock: socket.socket, spill_to: str | None = None,
                 spill_from: str | None = None):
        self.sock = sock
        self._spill_to = SpillFolder(spill_to) if spill_to else None
        self._spill_from = SpillFolder(spill_from) if spill_from else None
        self._in = bytearray()
        self._readable = False      # ready() saw bytes (or the end) that are not read yet
        self._poll = None
        if hasattr(select, "poll"):
            self._poll = select.poll()
            self._poll.register(sock.fileno(), select.POLLIN)

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self):
        """Close the socket; delete the arrays written that the other end did not take."""
        self.sock.close()
        for folder in (self._spill_to, self._spill_from):
            if folder is not None:
                folder.clear()

    # --- writing -------------------------------------------------------------------------
    def send(self, *messages, deadline: float | None = None) -> None:
        """Write the messages' frames in one write (a sleeping reader wakes once for them
        all); WireTimeout if the reader has not taken them by the deadline (monotonic),
        OSError if it is gone."""
        data = memoryview(b"".join(frame(m, self._spill_to) for m in messages))
        if deadline is None:
            self.sock.sendall(data)
            return
        while data:
            try:
                data = data[self.sock.send(data, socket.MSG_DONTWAIT):]
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not select.select([], [self.sock], [], remaining)[1]:
                    raise WireTimeout("the other process took no bytes by the deadline") from None

    # --- reading -------------------------------------------------------------------------
    def ready(self, timeout: float | None = None) -> bool:
        """Is a message (or the end) there to read within timeout seconds (None: wait)?"""
        if self._whole() is not None:
            return True
        if not self._readable:
            if self._poll is None:                      # Windows
                self._readable = bool(select.select([self.sock], [], [], timeout)[0])
            else:
                wait = None if timeout is None else max(0, math.ceil(timeout * 1000))
                self._readable = bool(self._poll.poll(wait))
        return self._readable

    def receive(self, deadline: float | None = None):
        """The next message; EOFError if the other side is gone, WireTimeout at the
        deadline (monotonic), WireError for bytes that are no message."""
        while True:
            end = self._whole()
            if end is not None:
                data = self._in[:end]       # one copy (its arrays are copied out again)
                del self._in[:end]
                return _parse(memoryview(data), self._spill_from)
            self._fill(deadline)

    def _whole(self) -> int | None:
        """The end of the first frame buffered, if it is whole (WireError if the bytes
        buffered cannot begin a frame)."""
        if len(self._in) < _HEAD.size:
            if self._in and not MAGIC.startswith(bytes(self._in[:4])):
                raise WireError(f"bytes that are no message: {bytes(self._in[:60])!r}")
            return None
        magic, length, header_size = _HEAD.unpack_from(self._in)
        if magic != MAGIC:
            raise WireError(f"bytes that are no message: {bytes(self._in[:60])!r}")
        if length > MAX_FRAME_BYTES or header_size > length:
            raise WireError(f"a message of {length} bytes, over the limit of {MAX_FRAME_BYTES}")
        end = 12 + length
        return end if len(self._in) >= end else None

    def _fill(self, deadline: float | None) -> None:
        """Read what the socket holds, waiting for it until the deadline: not again when
        ready() has seen it already (the judge asks before every answer it takes)."""
        if not self.ready(None if deadline is None else deadline - time.monotonic()):
            raise WireTimeout("no message by the deadline")
        self._readable = False
        chunk = self.sock.recv(max(_CHUNK, self._missing()))
        if not chunk:
            raise EOFError("the other process closed its end")
        self._in += chunk

    def _missing(self) -> int:
        if len(self._in) < _HEAD.size:
            return 0
        return 12 + _HEAD.unpack_from(self._in)[1] - len(self._in)
