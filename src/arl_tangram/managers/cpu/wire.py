"""Framing between the manager, the fork server and sandboxes: 4-byte length + JSON.

Invariant: frames are JSON only (never pickle), so a compromised sandbox can at worst send a bad
frame, which the manager treats as a broken sandbox. Frames are capped at `MAX_FRAME` bytes.
"""

from __future__ import annotations

import json
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
