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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

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


def encode_request(msg: Mapping[str, Any]) -> bytes:
    """A manager -> sandbox-init request frame (plain data: dict, list, str, int, float, None)."""
    # version 0: no string is marked interned, so the init does not look each key up in (and
    # write to) the interpreter's table of interned strings: ~5 fewer copy-on-write faults
    body = marshal.dumps(msg, 0)  # type: ignore[arg-type]  # (a dict at run time: a TypedDict)
    return _HDR.pack(len(body)) + body


# A compact direct request (`encode_direct`): this magic (a marshal body never starts with a NUL
# byte), then uid, gid, cpu_s, fsize, nofile, cpus, the tmpfs size in MiB (0: as mounted; else the
# sandbox's /workdir + /tmp is remounted to it first, `payload.tmpfs_mb`), and the lengths of the
# main file's name, the code and stdin (UTF-8), followed by those three. Read by the compiled
# `_fastpath.direct_take`.
DIRECT_MAGIC = b"\0TGD"
DIRECT = struct.Struct("<4sqqqqqdIIII")


def encode_direct(req: Mapping[str, Any], base_env: dict[str, str] | None) -> bytes | None:
    """The compact frame of a direct request (see `direct.eligible`) that has no extra files
    and runs with the sandbox's own environment (``base_env``: what the fork server holds); None
    where the request needs the general form (`encode_request`)."""
    lang, lim = req["lang"], req["limits"]
    name = str(lang["file"])
    if (req.get("files") or "/" in name or not name or lang["name"] == "java"
            or base_env is None or req["env"] != base_env):
        return None
    try:
        nm, code, stdin = name.encode(), req["code"].encode(), (req.get("stdin") or "").encode()
    except UnicodeEncodeError:  # (lone surrogates: the general form carries them)
        return None
    body = b"".join((DIRECT.pack(DIRECT_MAGIC, lim["uid"], lim["gid"], lim["cpu_s"], lim["fsize"],
                                 lim["nofile"], float(lim["cpus"]), int(req.get("tmpfs_mb") or 0),
                                 len(nm), len(code),
                                 len(stdin)), nm, code, stdin))
    if len(body) > MAX_FRAME:
        return None
    return _HDR.pack(len(body)) + body


def read_request_fd(fd: int) -> dict[str, Any]:
    """(In a sandbox's init.) The next request frame from the manager."""
    (n,) = _HDR.unpack(_read_exact(fd, 4))
    if n > MAX_FRAME:
        raise ValueError(f"frame too large: {n}")
    return request_from(_read_exact(fd, n))


def request_from(body: bytes) -> dict[str, Any]:
    """A request frame's body (the general form) as the request."""
    msg = marshal.loads(body)
    if not isinstance(msg, dict):
        raise ValueError("request is not an object")
    return msg
