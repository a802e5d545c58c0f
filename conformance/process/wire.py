"""Messages between the runner and a backend's own process: a JSON header, and every
array as a raw buffer beside it. Nothing is unpickled, so a message from an adapter can
carry data and nothing else; an array arrives as a base ndarray of a known dtype."""

from __future__ import annotations

import json
import math
import select
import struct

import numpy as np

from ..model.dtypes import NUMPY_DTYPES

#: the dtypes an array may have on the wire: the spec's, bool, and integers
WIRE_DTYPES = {**NUMPY_DTYPES, "bool": np.dtype(bool), "int64": np.dtype(np.int64),
               "int32": np.dtype(np.int32)}
_NAMES = {dtype: name for name, dtype in WIRE_DTYPES.items()}
#: a message is a tree of plain values made here: nothing to check for cycles
_JSON = json.JSONEncoder(allow_nan=True, check_circular=False, separators=(",", ":"))


class WireError(Exception):
    """A message that is not what the protocol says."""


_LEAVES = frozenset((str, int, float, bool, type(None)))


def _encode(value, buffers: list):
    kind = type(value)
    if kind in _LEAVES:                 # most of a message: its leaves, first
        return value
    if kind is dict and all(type(k) is str for k in value):
        return {"__dict__": {k: _encode(v, buffers) for k, v in value.items()}}
    if kind is list or kind is tuple:
        return {"__tuple__" if kind is tuple else "__list__": [_encode(v, buffers) for v in value]}
    if kind is np.ndarray:
        name = _NAMES.get(value.dtype)
        if name is None:
            return {"__object__": f"numpy.ndarray of dtype {value.dtype}"}
        buffers.append(np.ascontiguousarray(value).tobytes())
        return {"__array__": len(buffers) - 1, "dtype": name, "shape": list(value.shape)}
    if isinstance(value, np.ndarray):          # a subclass: refused by the runner
        return {"__object__": f"{kind.__module__}.{kind.__name__}", "subclass": True}
    return {"__object__": f"{kind.__module__}.{kind.__name__}"}


class Foreign:
    """What an adapter returned that is not plain data: only its type's name crosses."""

    def __init__(self, type_name: str, subclass: bool = False):
        self.type_name, self.subclass = type_name, subclass

    def __repr__(self):
        return f"<{self.type_name}>"


def _decode(value, buffers: list):
    if isinstance(value, dict):
        if "__array__" in value:
            dtype = WIRE_DTYPES.get(value.get("dtype"))
            index, shape = value["__array__"], value.get("shape")
            if dtype is None or not isinstance(index, int) or not 0 <= index < len(buffers) \
                    or not isinstance(shape, list):
                raise WireError(f"bad array in message: {value!r}"[:200])
            array = np.frombuffer(buffers[index], dtype=dtype).reshape(shape)
            return array.copy()
        if "__tuple__" in value:
            return tuple(_decode(v, buffers) for v in value["__tuple__"])
        if "__list__" in value:
            return [_decode(v, buffers) for v in value["__list__"]]
        if "__dict__" in value:
            return {str(k): _decode(v, buffers) for k, v in value["__dict__"].items()}
        if "__object__" in value:
            return Foreign(str(value["__object__"]), bool(value.get("subclass")))
        raise WireError(f"unknown message part: {sorted(value)}")
    return value


def send(conn, message) -> None:
    """One write: the header's length, the JSON header, then every buffer end to end."""
    buffers: list[bytes] = []
    body = _encode(message, buffers)
    spans, offset = [], 0
    for buffer in buffers:
        spans.append([offset, len(buffer)])
        offset += len(buffer)
    header = _JSON.encode({"body": body, "buffers": spans}).encode()
    conn.send_bytes(b"".join([struct.pack("<I", len(header)), header, *buffers]))


_POLLERS: dict = {}


def ready(conn, timeout: float | None = None) -> bool:
    """Has conn a message (or its end) to read within timeout seconds (None: wait)? What
    conn.poll(timeout) answers, without building a selector at every call (~20 us, and
    every message is polled for); OSError once conn is closed."""
    if not hasattr(select, "poll"):                 # Windows
        return conn.poll(timeout)
    fd = conn.fileno()
    poller = _POLLERS.get(fd)
    if poller is None:          # a file descriptor reused by a new connection: the same
        poller = _POLLERS[fd] = select.poll()
        poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else max(0, math.ceil(timeout * 1000))))


def receive(conn, limit: int = 1 << 31):
    """The next message (EOFError if the other side is gone)."""
    data = conn.recv_bytes(limit)
    if len(data) < 4:
        raise WireError("truncated message")
    size = struct.unpack("<I", data[:4])[0]
    try:
        header = json.loads(data[4:4 + size])
        spans, body = header["buffers"], header["body"]
    except (ValueError, KeyError, TypeError) as exc:
        raise WireError(f"message header is not what the protocol says: {exc}") from None
    payload = memoryview(data)[4 + size:]
    buffers = []
    for span in spans:
        if not (isinstance(span, list) and len(span) == 2 and all(isinstance(v, int) for v in span)
                and 0 <= span[0] and 0 <= span[1] and span[0] + span[1] <= len(payload)):
            raise WireError(f"bad buffer span {span!r}"[:200])
        buffers.append(payload[span[0]:span[0] + span[1]])
    return _decode(body, buffers)
