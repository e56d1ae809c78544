"""More exact values of the image kit (`images/imagekit.py`, issue 43): the inode bomb's gzip
level byte for byte; the docker-archive writers' work directory ``OUT.d`` (one already there is
used, then removed; a removal that fails is ignored); the sparse archive's `tar` run with
check=True (helper-58: the hostile archives' mutants the first run left unrun or unapplied)."""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import tarfile
import zlib

import pytest

from arl_tangram.managers.cpu.images import imagekit


def _deflate_body(data: bytes) -> bytes:
    """The raw deflate stream of a one-member gzip file (RFC 1952: header, body, 8-byte tail)."""
    assert data[:3] == b"\x1f\x8b\x08"
    flags, pos = data[3], 10
    assert flags & ~0x08 == 0  # at most FNAME
    if flags & 0x08:
        pos = data.index(b"\0", pos) + 1
    return data[pos:-8]


def test_inode_bomb_is_gzip_level_6(tmp_path) -> None:
    out = imagekit.inode_bomb(str(tmp_path / "i.tgz"), 40)
    with open(out, "rb") as f:
        data = f.read()
    assert data[8] == 0  # XFL: neither the fastest (4) nor the best (2) compression
    raw = gzip.decompress(data)
    want = io.BytesIO()
    with tarfile.open(fileobj=want, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for i in range(40):
            ti = tarfile.TarInfo(f"f/{i}")
            ti.mode = 0o644
            tf.addfile(ti)
    assert raw == want.getvalue()
    z = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS, 8, 0)
    assert _deflate_body(data) == z.compress(raw) + z.flush()
    z9 = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS, 8, 0)
    assert _deflate_body(data) != z9.compress(raw) + z9.flush()  # (the default level differs)


def test_sparse_docker_archive_works_in_out_d_and_removes_it(tmp_path) -> None:
    # its work directory is OUT + ".d": one already there is used (what is in it is archived
    # too) and removed afterwards
    out = str(tmp_path / "s.tar")
    os.makedirs(out + ".d")
    with open(os.path.join(out + ".d", "zz"), "w") as f:
        f.write("left")
    assert imagekit.sparse_docker_archive(out, "layer", 0.001) == out
    assert not os.path.exists(out + ".d")
    assert sorted(os.listdir(tmp_path)) == ["s.tar"]
    with tarfile.open(out) as tf:
        assert tf.getnames() == ["config.json", "layer.tar", "manifest.json", "zz"]
        assert tf.extractfile("zz").read() == b"left"


def test_a_work_directory_that_cannot_be_removed_does_not_fail_an_archive(
    tmp_path, monkeypatch
) -> None:
    # both docker-archive writers remove OUT + ".d" with ignore_errors=True: a removal that
    # fails (here: one that raises unless told to ignore errors) leaves the archive written
    real = imagekit.shutil.rmtree
    tried = []

    def rmtree(path, ignore_errors=False, **kw):
        tried.append(path)
        if not ignore_errors:
            raise PermissionError(13, "busy", path)
        real(path, ignore_errors=True)

    monkeypatch.setattr(imagekit.shutil, "rmtree", rmtree)
    layer = tmp_path / "l.tar"
    layer.write_bytes(b"x")
    out = str(tmp_path / "d.tar")
    assert imagekit.write_docker_archive(out, [str(layer)]) == out
    out2 = str(tmp_path / "s.tar")
    assert imagekit.sparse_docker_archive(out2, "layer", 0.001) == out2
    assert tried == [out + ".d", out2 + ".d"]
    with tarfile.open(out) as tf:
        assert "manifest.json" in tf.getnames()


def test_a_sparse_archive_tar_cannot_write_raises(tmp_path) -> None:
    # `tar` runs with check=True: OUT a directory, tar fails, the error is raised (not an
    # archive path returned), and the work directory is removed all the same
    out = tmp_path / "d"
    out.mkdir()
    with pytest.raises(subprocess.CalledProcessError) as e:
        imagekit.sparse_docker_archive(str(out), "layer", 0.001)
    assert e.value.cmd[:5] == ["tar", "--sparse", "--format=gnu", "-cf", str(out)]
    assert e.value.returncode == 2
    assert sorted(os.listdir(tmp_path)) == ["d"] and os.listdir(out) == []
