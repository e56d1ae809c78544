"""A layer's tar stream between two nodes' stores, exact (issue 43 item 2):
`managers/cpu/images/transfer.py` alone (no store): the entries a layer directory packs to
(whiteouts, opaque directories, owners), the chunks of a stream, its size and digest, packing
errors and a stopped stream, and the receiving spool's check of the digest, word for word.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import threading
from typing import Any

import pytest

from arl_tangram.core.errors import ImageError
from arl_tangram.managers.cpu.images import transfer as X
from arl_tangram.managers.cpu.images.extract import Budget, ImageLimits

needs_root = pytest.mark.needs_root  # (device nodes, trusted.* xattrs)


def layer(root) -> str:
    (root / "d" / "sub").mkdir(parents=True)
    (root / "d" / "f").write_bytes(b"x" * 1000)
    (root / "a").write_bytes(b"hello")
    os.symlink("a", root / "ln")
    return str(root)


def members(data: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        return tf.getmembers()


def packed(root: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        X.pack_into(root, tf)
    return buf.getvalue()


def test_pack_into_is_sorted_with_numeric_owners(tmp_path) -> None:
    root = layer(tmp_path / "l")
    ms = members(packed(root))
    assert [m.name for m in ms] == ["d", "a", "ln", "d/sub", "d/f"]
    by = {m.name: m for m in ms}
    assert all(m.uname == "" and m.gname == "" for m in ms)
    assert by["ln"].issym() and by["ln"].linkname == "a"
    assert by["a"].isreg() and by["a"].size == 5 and by["d"].isdir()
    with tarfile.open(fileobj=io.BytesIO(packed(root))) as tf:
        assert tf.extractfile("d/f").read() == b"x" * 1000


@needs_root
def test_whiteouts_and_opaque_directories_become_oci_markers(tmp_path) -> None:
    root = tmp_path / "l"
    (root / "o" / "in").mkdir(parents=True)
    (root / "n").mkdir()
    os.mknod(root / "gone", 0o600 | 0o020000, os.makedev(0, 0))
    os.mknod(root / "o" / "gone2", 0o600 | 0o020000, os.makedev(0, 0))
    os.mknod(root / "null", 0o666 | 0o020000, os.makedev(1, 3))
    os.setxattr(root / "o", "trusted.overlay.opaque", b"y")
    os.setxattr(root / "n", "trusted.overlay.opaque", b"n")
    os.setxattr(root, "trusted.overlay.opaque", b"y")
    assert X._opaque(str(root / "o")) is True
    assert X._opaque(str(root / "n")) is False
    assert X._opaque(str(root / "missing")) is False
    os.symlink("o", root / "lo")
    assert X._opaque(str(root / "lo")) is False  # (the link's own, not followed)
    ms = members(packed(str(root)))
    # (a link to a directory is among os.walk's directories: not followed)
    assert [m.name for m in ms] == [
        ".wh..wh..opq",
        "lo",
        "n",
        "o",
        ".wh.gone",
        "null",
        "o/.wh..wh..opq",
        "o/in",
        "o/.wh.gone2",
    ]
    by = {m.name: m for m in ms}
    for n in (".wh..wh..opq", ".wh.gone", "o/.wh..wh..opq", "o/.wh.gone2"):
        m = by[n]
        assert (m.isreg(), m.mode, m.size, m.uid, m.gid) == (True, 0o644, 0, 0, 0), n
    assert by["null"].ischr() and (by["null"].devmajor, by["null"].devminor) == (1, 3)


def test_a_stream_comes_in_chunks_and_ends_with_its_digest(tmp_path) -> None:
    root = tmp_path / "l"
    root.mkdir()
    (root / "big").write_bytes(os.urandom(200_000))
    want = packed(str(root))
    s = X.LayerStream(str(root), 1)
    assert s.chunk == 1 << 16 and s.root == str(root)
    assert (s.size, s.done, s.digest) == (0, False, "sha256:" + hashlib.sha256().hexdigest())
    got = []
    while piece := s.next():
        assert isinstance(piece, bytes)
        got.append(piece)
    assert [len(p) for p in got[:-1]] == [1 << 16] * (len(got) - 1)
    assert 0 < len(got[-1]) <= 1 << 16
    data = b"".join(got)
    assert members(data)[0].name == "big"
    assert len(data) == len(want) and s.size == len(data)
    assert s.digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert s.done and not s._thread.is_alive()
    assert s.next() == b"" and s.size == len(data)
    s.close()
    s2 = X.LayerStream(str(root), (1 << 16) + 0.9)
    assert s2.chunk == (1 << 16) and isinstance(s2.chunk, int)
    s2.close()
    assert X.LayerStream(str(root), 3 << 16).chunk == 3 << 16
    assert X.CHUNK_BYTES == 64 << 20
    s3 = X.LayerStream(str(root))
    assert s3.chunk == 64 << 20
    assert s3.next() == data and s3.next() == b""  # (one chunk: the whole stream)


def test_a_stream_whose_size_is_a_multiple_of_the_chunk(tmp_path) -> None:
    root = tmp_path / "l"
    root.mkdir()
    n = len(packed(str(root)))
    assert n == 10240
    s = X.LayerStream(str(root), 1 << 16)
    assert s.next() == packed(str(root)) and s.next() == b""
    s.close()


def test_no_layer_and_a_layer_that_cannot_be_packed(tmp_path) -> None:
    with pytest.raises(ImageError) as e:
        X.LayerStream(str(tmp_path / "sha256-x"))
    assert str(e.value) == "no layer 'sha256-x' on this node"
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(ImageError, match="no layer 'f' on this node"):
        X.LayerStream(str(tmp_path / "f"))
    bad = tmp_path / "bad"
    bad.mkdir()
    orig = X.pack_into

    def boom(root: str, tf: tarfile.TarFile) -> None:
        raise OSError(5, "I/O error")

    X.pack_into = boom
    try:
        s = X.LayerStream(str(bad))
        with pytest.raises(ImageError) as e:
            s.next()
        assert str(e.value) == "cannot pack layer bad: [Errno 5] I/O error"
        assert s.done and s.next() == b""
    finally:
        X.pack_into = orig
        s.close()


def test_closing_a_stream_stops_the_packing(tmp_path) -> None:
    root = tmp_path / "l"
    root.mkdir()
    (root / "big").write_bytes(os.urandom(1 << 20))
    before = threading.active_count()
    s = X.LayerStream(str(root), 1 << 16)
    assert s._thread.name == "tangram-layer-out" and s._thread.daemon
    assert len(s.next()) == 1 << 16
    s.close()
    assert not s._thread.is_alive() and threading.active_count() == before
    with pytest.raises(X._Stopped):
        s.write(b"x")
    with pytest.raises(X._Stopped):
        s._put(b"x")
    assert s._q.qsize() <= 1


def test_write_hands_over_whole_chunks(tmp_path) -> None:
    s = X.LayerStream.__new__(X.LayerStream)
    s.chunk = 4
    s._buf = bytearray()
    s._stop = threading.Event()
    put: list[bytes] = []
    s._put = put.append  # type: ignore[method-assign]
    assert s.write(b"abc") == 3 and put == [] and bytes(s._buf) == b"abc"
    assert s.write(b"defghijk") == 8
    assert put == [b"abcd", b"efgh"]
    assert bytes(s._buf) == b"ijk"
    assert s.write(b"l") == 1 and put[-1] == b"ijkl" and s._buf == bytearray()


# ---- the receiving side -------------------------------------------------------------------------


def budget(tmp) -> Budget:
    return Budget(ImageLimits(min_free_bytes=0, min_free_inodes=0), str(tmp))


def test_a_spool_checks_the_digest_then_unpacks(tmp_path) -> None:
    root = layer(tmp_path / "l")
    data = packed(root)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    sp = X.LayerSpool(str(tmp))
    name = os.path.basename(sp.path)
    assert os.path.dirname(sp.path) == str(tmp)
    assert name.startswith("pull-") and name.endswith(".tar") and sp.size == 0
    sp.write(data[:100])
    sp.write(data[100:])
    assert sp.size == len(data)
    target = tmp_path / "out"
    sp.finish(str(tmp), str(target), "sha256:" + hashlib.sha256(data).hexdigest(), "w", budget(tmp))
    assert sorted(os.listdir(target)) == ["a", "d", "ln"]
    assert (target / "a").read_bytes() == b"hello" and os.readlink(target / "ln") == "a"
    assert os.listdir(tmp) == []


def test_a_spool_of_an_altered_stream_is_refused_and_removed(tmp_path) -> None:
    data = packed(layer(tmp_path / "l"))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    sp = X.LayerSpool(str(tmp))
    sp.write(data[:-1])
    want = "sha256:" + hashlib.sha256(data).hexdigest()
    got = "sha256:" + hashlib.sha256(data[:-1]).hexdigest()
    with pytest.raises(ImageError) as e:
        sp.finish(str(tmp), str(tmp_path / "out"), want, "peer:k", budget(tmp))
    assert str(e.value) == (
        f"peer:k: the layer stream arrived altered or cut "
        f"({len(data) - 1} bytes, {got}; the sender sent {want})"
    )
    assert os.listdir(tmp) == [] and not (tmp_path / "out").exists()


def test_a_spool_closed_then_discarded(tmp_path) -> None:
    sp = X.LayerSpool(str(tmp_path))
    sp.write(b"abc")
    sp.close()
    with open(sp.path, "rb") as f:
        assert f.read() == b"abc"
    sp.discard()
    assert not os.path.exists(sp.path)
    sp.discard()  # (twice: nothing)
    assert X.__all__ == ["CHUNK_BYTES", "LayerSpool", "LayerStream", "pack_into"]


def test_the_packing_runs_one_chunk_ahead_of_the_reader(tmp_path) -> None:
    import time

    root = tmp_path / "l"
    root.mkdir()
    (root / "big").write_bytes(os.urandom(1 << 20))
    s = X.LayerStream(str(root), 1 << 16)
    try:
        deadline = time.monotonic() + 5
        while s._q.qsize() < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)
        assert s._q.qsize() == 1 and s._q.maxsize == 1 and len(s._buf) < 1 << 16
        assert s._thread.is_alive()
    finally:
        s.close()


# ---- helper-46: the survivors of the ba8a26b run -----------------------------------------------


def test_a_slow_reader_loses_no_chunk(tmp_path) -> None:
    import time

    root = tmp_path / "l"
    root.mkdir()
    (root / "big").write_bytes(os.urandom(1 << 19))
    want = packed(str(root))
    s = X.LayerStream(str(root), 1 << 16)
    try:
        got = [s.next()]
        time.sleep(0.5)  # (the packing thread's puts time out twice meanwhile)
        while piece := s.next():
            got.append(piece)
            time.sleep(0.01)
        assert len(b"".join(got)) == len(want) == s.size
        assert s.digest == "sha256:" + hashlib.sha256(b"".join(got)).hexdigest()
        assert members(b"".join(got))[0].name == "big"
    finally:
        s.close()


def test_a_packing_error_after_close_ends_the_thread_quietly(tmp_path, monkeypatch) -> None:
    root = tmp_path / "l"
    root.mkdir()
    seen: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", seen.append)
    stopped = threading.Event()

    def late(root: str, tf: tarfile.TarFile) -> None:
        stopped.wait(5)
        raise OSError(5, "I/O error")

    monkeypatch.setattr(X, "pack_into", late)
    s = X.LayerStream(str(root))
    s._stop.set()
    stopped.set()
    s._thread.join(5)
    assert not s._thread.is_alive() and seen == []


def test_a_spool_unpacks_through_the_store_s_tmp_dir(tmp_path, monkeypatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(X, "unpack", lambda f, *a: seen.append((f.read(), *a)))
    sp = X.LayerSpool(str(tmp_path))
    sp.write(b"abc")
    b = budget(tmp_path)
    sp.finish("/the/tmp", "/the/target", "sha256:" + hashlib.sha256(b"abc").hexdigest(), "w:k", b)
    assert seen == [(b"abc", "/the/tmp", "/the/target", "w:k", None, b)]
    assert not os.path.exists(sp.path)


def test_discard_ignores_a_failing_close(tmp_path) -> None:
    sp = X.LayerSpool(str(tmp_path))
    real = sp._f

    class Failing:
        def close(self) -> None:
            real.close()
            raise OSError(28, "No space left on device")

    sp._f = Failing()
    sp.discard()
    assert not os.path.exists(sp.path)
