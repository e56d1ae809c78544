"""Framing between the manager, the fork server and sandboxes: 4-byte length + body.

Invariant: whatever a sandbox (or anything running in one) sends is JSON only (never pickle or
marshal), so a compromised sandbox can at worst send a bad frame, which the manager treats as a
broken sandbox. Requests from the manager to a sandbox's init, and only those, are `marshal`
(`encode_request` / `read_request_fd`): the init trusts the manager, and marshal decodes with
fewer objects than json (~30 fewer copy-on-write faults in a freshly forked init). Nothing ever
unmarshals a frame a sandbox wrote. Frames are capped at `MAX_FRAME` bytes.
"""

from __future__ import annotations

import json
import marshal
import os
import struct
from typing import Any

MAX_FRAME = 256 << 20
_HDR = struct.Struct(">I")


def encode(msg: dict[str, Any]) -> bytes:
    body = json.dumps(msg, separators=(",", ":")).encode()
    return _HDR.pack(len(body)) + body


def _read_exact(fd: int, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        b = os.read(fd, n - got)
        if not b:
            raise EOFError("peer closed")
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def read_frame_fd(fd: int) -> dict[str, Any]:
    (n,) = _HDR.unpack(_read_exact(fd, 4))
    if n > MAX_FRAME:
        raise ValueError(f"frame too large: {n}")
    return json.loads(_read_exact(fd, n))


def write_frame_fd(fd: int, msg: dict[str, Any]) -> None:
    data = memoryview(encode(msg))
    while data:
        n = os.write(fd, data)
        data = data[n:]


def encode_request(msg: dict[str, Any]) -> bytes:
    """A manager -> sandbox-init request frame (plain data: dict, list, str, int, float, None)."""
    # version 0: no string is marked interned, so the init does not look each key up in (and
    # write to) the interpreter's table of interned strings: ~5 fewer copy-on-write faults
    body = marshal.dumps(msg, 0)
    return _HDR.pack(len(body)) + body


def read_request_fd(fd: int) -> dict[str, Any]:
    """(In a sandbox's init.) The next request frame from the manager."""
    (n,) = _HDR.unpack(_read_exact(fd, 4))
    if n > MAX_FRAME:
        raise ValueError(f"frame too large: {n}")
    msg = marshal.loads(_read_exact(fd, n))
    if not isinstance(msg, dict):
        raise ValueError("request is not an object")
    return msg
