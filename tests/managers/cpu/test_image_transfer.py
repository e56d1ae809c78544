"""Layers between two nodes' image stores (issue 26, item 3), without Ray: a layer packed by one
store (`ImageStore.open_layer`) and received by another (`new_spool`, `finish_layer`) is the
same tree (owners, modes, links, hard links, overlay whiteouts and opaque directories), in
several chunks; a stream altered or cut in transit, or a bad layer key, is refused and leaves
nothing behind; closing a stream half-read stops its packing thread."""

from __future__ import annotations

import hashlib
import os
import stat
import threading

import pytest

from arl_tangram.managers.cpu.images import imagekit
from arl_tangram.managers.cpu.images.store import ImageError, ImageStore

pytestmark = pytest.mark.needs_root  # (owners, whiteout devices, trusted.* xattrs)


def tree(root: str) -> dict[str, tuple]:
    """Every entry under ``root``: type, mode, owner, size/content/target, hard-link group."""
    out: dict[str, tuple] = {}
    inodes: dict[int, str] = {}
    for top, dirs, files in os.walk(root):
        for n in dirs + files:
            full = os.path.join(top, n)
            rel = os.path.relpath(full, root)
            st = os.lstat(full)
            what: object = None
            if stat.S_ISREG(st.st_mode):
                with open(full, "rb") as f:
                    what = hashlib.sha256(f.read()).hexdigest()
                if st.st_nlink > 1:
                    what = (what, inodes.setdefault(st.st_ino, rel))
            elif stat.S_ISLNK(st.st_mode):
                what = os.readlink(full)
            elif stat.S_ISCHR(st.st_mode):
                what = st.st_rdev
            elif stat.S_ISDIR(st.st_mode):
                try:
                    what = os.getxattr(full, "trusted.overlay.opaque", follow_symlinks=False)
                except OSError:
                    what = None
            out[rel] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
                        what)
    return out


@pytest.fixture()
def image(tmp_path):
    """An OCI image of two layers: a base with owners, links and a hard link; a top layer
    with a file over it, a whiteout and an opaque directory."""
    base = tmp_path / "base"
    (base / "etc").mkdir(parents=True)
    (base / "etc" / "os-release").write_text("ID=t\n")
    (base / "srv" / "data").mkdir(parents=True)
    (base / "srv" / "data" / "old").write_text("old\n")
    (base / "opt" / "env").mkdir(parents=True)
    big = base / "opt" / "env" / "big.bin"
    big.write_bytes(os.urandom(300_000))  # several chunks of 64 KiB
    os.link(big, base / "opt" / "env" / "big.link")
    os.symlink("../etc/os-release", base / "srv" / "rel")
    os.chown(base / "opt" / "env", 1234, 5678)
    os.chmod(base / "opt" / "env", 0o750)
    top = tmp_path / "top"
    (top / "etc").mkdir(parents=True)
    (top / "etc" / "added").write_text("hi\n")
    imagekit.pack_layer(str(base), str(tmp_path / "base.tar"))
    imagekit.pack_layer(str(top), str(tmp_path / "top.tar.gz"), gzip_it=True,
                        extra=[("etc/.wh.os-release", None), ("srv/data/.wh..wh..opq", None)])
    return imagekit.write_oci_layout(str(tmp_path / "oci"),
                                     [str(tmp_path / "base.tar"), str(tmp_path / "top.tar.gz")],
                                     {"Env": ["A=1"], "User": "1234"})


def send(a: ImageStore, b: ImageStore, key: str, chunk: int = 1 << 16) -> int:
    """One layer from ``a`` to ``b`` as a pull does it; returns the chunks sent."""
    stream, spool, n = a.open_layer(key, chunk), b.new_spool(), 0
    try:
        while piece := stream.next():
            assert len(piece) <= chunk
            spool.write(piece)
            n += 1
    finally:
        stream.close()
    b.finish_layer(spool, key, stream.digest, f"test:{key}")
    return n


def test_layers_sent_between_stores_are_the_same_trees(tmp_path, image) -> None:
    a, b = ImageStore(str(tmp_path / "a")), ImageStore(str(tmp_path / "b"))
    img = a.import_path(image, "two")
    assert len(img.layers) == 2 and len(img.layer_sizes) == 2 and sum(img.layer_sizes) == img.size
    top = a.layer_path(img.layers[1])
    assert stat.S_ISCHR(os.lstat(os.path.join(top, "etc", "os-release")).st_mode)
    chunks = [send(a, b, k) for k in img.layers]
    assert chunks[0] >= 5  # the base layer went in pieces
    for k in img.layers:
        assert tree(b.layer_path(k)) == tree(a.layer_path(k)), k
    got = b.add_pulled(img.to_dict(), "node a", 0.5)
    assert (got.digest, got.layers, got.config) == (img.digest, img.layers, img.config)
    assert got.source == "node a" and got.import_s == 0.5 and b.has("two")
    assert [i.name for i in b.list_images()] == ["two"]


def test_an_image_is_recorded_only_with_all_its_layers(tmp_path, image) -> None:
    a, b = ImageStore(str(tmp_path / "a")), ImageStore(str(tmp_path / "b"))
    img = a.import_path(image, "two")
    send(a, b, img.layers[0])
    with pytest.raises(ImageError, match="missing"):
        b.add_pulled(img.to_dict(), "node a", 0.1)
    assert not b.has("two")


def test_an_altered_or_cut_stream_is_refused_and_leaves_nothing(tmp_path, image) -> None:
    a, b = ImageStore(str(tmp_path / "a")), ImageStore(str(tmp_path / "b"))
    key = a.import_path(image, "two").layers[0]
    stream = a.open_layer(key, 1 << 16)
    pieces = []
    while piece := stream.next():
        pieces.append(piece)
    flipped = pieces[0][:-1] + bytes([pieces[0][-1] ^ 1])  # (a fixed byte equals it 1 in 256)
    for bad in ([flipped, *pieces[1:]], pieces[:-1]):
        spool = b.new_spool()
        for p in bad:
            spool.write(p)
        with pytest.raises(ImageError, match="altered or cut"):
            b.finish_layer(spool, key, stream.digest, "test")
        assert not b.has_layer(key) and os.listdir(b.tmp_dir) == []
    with pytest.raises(ImageError, match="not a layer key"):
        a.open_layer("../../etc")
    with pytest.raises(ImageError, match="not a layer key"):
        b.finish_layer(b.new_spool(), "sha256-../x", stream.digest, "test")
    with pytest.raises(ImageError, match="no layer"):
        a.open_layer("sha256-" + "0" * 64)


def test_closing_a_stream_half_read_stops_its_thread(tmp_path, image) -> None:
    a = ImageStore(str(tmp_path / "a"))
    key = a.import_path(image, "two").layers[0]
    before = threading.active_count()
    stream = a.open_layer(key, 1 << 16)
    assert stream.next()
    stream.close()
    assert not stream._thread.is_alive() and threading.active_count() == before
