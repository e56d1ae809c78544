"""The frames between the manager, the fork server and sandboxes (`managers/cpu/wire.py`), their
bytes and fields asserted exactly (issue 43).

- `encode` / `read_frame_fd` / `write_frame_fd`: a 4-byte big-endian length, then compact JSON;
  a frame read in pieces (short reads) and written in pieces (short writes) whole, two frames
  back to back read one at a time; a header past `MAX_FRAME` (256 MiB) refused with its size,
  one of exactly `MAX_FRAME` read; a peer gone mid-frame: EOFError("peer closed");
- `encode_request` / `read_request_fd` / `request_from`: marshal version 0 behind the same
  header; a body that is not an object refused;
- `encode_direct`: magic ``\\0TGD`` then the limits (``<4sqqqqqdIIII``) and name, code, stdin;
  None for each request that needs the general form.
"""

from __future__ import annotations

import marshal
import os
import struct
import sys

import pytest

from arl_tangram.managers.cpu import wire


def _pipe_with(data: bytes, close: bool = True) -> tuple[int, int]:
    r, w = os.pipe()
    os.write(w, data)
    if close:
        os.close(w)
        w = -1
    return r, w


def _close(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            os.close(fd)


def test_constants():
    assert wire.MAX_FRAME == 268435456
    assert wire.DIRECT_MAGIC == b"\x00TGD"
    assert wire.DIRECT.format == "<4sqqqqqdIIII"
    assert wire.DIRECT.size == 68


def test_encode_exact_bytes():
    assert wire.encode({"a": 1, "b": [1, "x", None]}) == b'\x00\x00\x00\x18{"a":1,"b":[1,"x",null]}'
    assert wire.encode({}) == b"\x00\x00\x00\x02{}"


def test_read_two_frames_back_to_back():
    r, _ = _pipe_with(wire.encode({"a": 1}) + wire.encode({"b": "two"}))
    try:
        assert wire.read_frame_fd(r) == {"a": 1}
        assert wire.read_frame_fd(r) == {"b": "two"}
        with pytest.raises(EOFError, match=r"^peer closed$"):
            wire.read_frame_fd(r)
    finally:
        _close(r)


def test_read_in_short_reads(monkeypatch):
    real = os.read
    calls = []

    def one_byte(fd, n):
        calls.append(n)
        return real(fd, 1)

    monkeypatch.setattr(wire.os, "read", one_byte)
    r, _ = _pipe_with(wire.encode({"k": "vv"}) + b"XYZ")
    try:
        assert wire.read_frame_fd(r) == {"k": "vv"}
        # the header asks for 4, then 3, 2, 1; the body for its 10 bytes down to 1
        assert calls == [4, 3, 2, 1, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1]
        assert real(r, 10) == b"XYZ"  # nothing past the frame was taken
    finally:
        _close(r)


def test_read_exact_eof_mid_body():
    r, _ = _pipe_with(b"\x00\x00\x00\x05{}")
    try:
        with pytest.raises(EOFError, match=r"^peer closed$"):
            wire.read_frame_fd(r)
    finally:
        _close(r)
    r, _ = _pipe_with(b"\x00\x00")
    try:
        with pytest.raises(EOFError, match=r"^peer closed$"):
            wire._read_exact(r, 4)
    finally:
        _close(r)


def test_read_exact_joins_chunks():
    r, _ = _pipe_with(b"abcdef")
    try:
        assert wire._read_exact(r, 0) == b""
        assert wire._read_exact(r, 6) == b"abcdef"
    finally:
        _close(r)


@pytest.mark.parametrize("reader", [wire.read_frame_fd, wire.read_request_fd])
def test_frame_size_cap(reader):
    r, _ = _pipe_with(struct.pack(">I", (256 << 20) + 1))
    try:
        with pytest.raises(ValueError, match=r"^frame too large: 268435457$"):
            reader(r)
    finally:
        _close(r)
    # exactly MAX_FRAME is allowed: it goes on to read the body (the peer closed: EOF)
    r, _ = _pipe_with(struct.pack(">I", 256 << 20) + b"{")
    try:
        with pytest.raises(EOFError, match=r"^peer closed$"):
            reader(r)
    finally:
        _close(r)


def test_write_in_short_writes(monkeypatch):
    real = os.write
    sizes = []

    def three(fd, data):
        sizes.append(len(data))
        return real(fd, bytes(data[:3]))

    monkeypatch.setattr(wire.os, "write", three)
    r, w = os.pipe()
    try:
        wire.write_frame_fd(w, {"a": 12})
        assert sizes == [12, 9, 6, 3]
        assert os.read(r, 100) == b'\x00\x00\x00\x08{"a":12}'
    finally:
        _close(r, w)


def test_encode_request_marshal_v0():
    key = sys.intern("".join(["ke", "y"]))
    msg = {key: [1, "x", None, 2.5]}
    body = marshal.dumps(msg, 0)
    assert (
        body
        == b"{u\x03\x00\x00\x00key[\x04\x00\x00\x00i\x01\x00\x00\x00u\x01\x00\x00\x00xNf\x032.50"
    )
    assert wire.encode_request(msg) == struct.pack(">I", len(body)) + body
    r, _ = _pipe_with(wire.encode_request(msg) + wire.encode_request({"b": 2}))
    try:
        assert wire.read_request_fd(r) == msg
        assert wire.read_request_fd(r) == {"b": 2}
    finally:
        _close(r)


def test_request_from_refuses_non_object():
    assert wire.request_from(marshal.dumps({"op": "run"})) == {"op": "run"}
    with pytest.raises(ValueError, match=r"^request is not an object$"):
        wire.request_from(marshal.dumps([1, 2]))
    r, _ = _pipe_with(wire.encode_request([1]))  # type: ignore[arg-type]
    try:
        with pytest.raises(ValueError, match=r"^request is not an object$"):
            wire.read_request_fd(r)
    finally:
        _close(r)


ENV = {"PATH": "/usr/bin", "HOME": "/workdir"}


def _req(**kw):
    req = {
        "lang": {"name": "python", "file": "main.py"},
        "limits": {
            "uid": 70001,
            "gid": 70002,
            "cpu_s": 11,
            "fsize": 1 << 20,
            "nofile": 64,
            "cpus": 2,
        },
        "code": "print(1)",
        "stdin": "in\n",
        "env": dict(ENV),
        "tmpfs_mb": 48,
    }
    req.update(kw)
    return req


def test_encode_direct_exact_bytes():
    frame = wire.encode_direct(_req(), dict(ENV))
    body = (
        b"\x00TGD"
        + struct.pack("<qqqqqdIIII", 70001, 70002, 11, 1 << 20, 64, 2.0, 48, 7, 8, 3)
        + b"main.py"
        + b"print(1)"
        + b"in\n"
    )
    assert frame == struct.pack(">I", 86) + body
    assert len(body) == 86
    magic, uid, gid, cpu_s, fsize, nofile, cpus, tmpfs, ln, lc, ls = wire.DIRECT.unpack(body[:68])
    assert (magic, uid, gid, cpu_s, fsize, nofile, cpus, tmpfs, ln, lc, ls) == (
        b"\x00TGD",
        70001,
        70002,
        11,
        1048576,
        64,
        2.0,
        48,
        7,
        8,
        3,
    )


def test_encode_direct_defaults_and_utf8():
    req = _req(stdin=None, tmpfs_mb=None, code="é", lang={"name": "python", "file": "ü.py"})
    del req["tmpfs_mb"]
    req.pop("stdin")
    frame = wire.encode_direct(req, dict(ENV))
    body = frame[4:]
    fields = wire.DIRECT.unpack(body[:68])
    assert fields[7:] == (0, 5, 2, 0)
    assert body[68:] == "ü.py".encode() + "é".encode()
    assert frame[:4] == struct.pack(">I", 75)
    req = _req(stdin=None, tmpfs_mb=0)
    assert wire.DIRECT.unpack(wire.encode_direct(req, dict(ENV))[4:72])[7:] == (0, 7, 8, 0)
    # files present but empty: still the compact form
    assert wire.encode_direct(_req(files={}), dict(ENV)) == wire.encode_direct(_req(), dict(ENV))


@pytest.mark.parametrize(
    "kw,env",
    [
        ({"files": {"a.txt": "x"}}, ENV),
        ({"lang": {"name": "python", "file": "d/main.py"}}, ENV),
        ({"lang": {"name": "python", "file": ""}}, ENV),
        ({"lang": {"name": "java", "file": "Main.java"}}, ENV),
        ({}, None),
        ({"env": {"PATH": "/usr/bin"}}, ENV),
        ({"code": "\ud800"}, ENV),
        ({"stdin": "\udc00"}, ENV),
        ({"lang": {"name": "python", "file": "\ud800.py"}}, ENV),
    ],
)
def test_encode_direct_general_form(kw, env):
    assert wire.encode_direct(_req(**kw), None if env is None else dict(env)) is None


def test_encode_direct_other_language_compact():
    frame = wire.encode_direct(_req(lang={"name": "cpp", "file": "a.cpp"}), dict(ENV))
    assert frame is not None and frame[4:8] == b"\x00TGD"


def test_encode_direct_frame_cap(monkeypatch):
    size = len(wire.encode_direct(_req(), dict(ENV))) - 4
    monkeypatch.setattr(wire, "MAX_FRAME", size)
    assert wire.encode_direct(_req(), dict(ENV)) is not None
    monkeypatch.setattr(wire, "MAX_FRAME", size - 1)
    assert wire.encode_direct(_req(), dict(ENV)) is None
