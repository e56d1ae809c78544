"""The node's image cache (issue 17): import from every format, layers shared by digest, OCI
whiteouts, and bad archives rejected with a clear error and nothing written outside the cache."""

from __future__ import annotations

import io
import os
import shutil
import stat
import tarfile

import pytest

from arl_tangram.managers.cpu.images import imagekit
from arl_tangram.managers.cpu.images.store import ImageError, ImageInUse, ImageStore

needs_root = pytest.mark.needs_root  # (layers keep owners and whiteouts)


@pytest.fixture()
def work(tmp_path):
    root = tmp_path / "rootfs"
    imagekit.host_rootfs(str(root), tools=("bash", "cat"))
    imagekit.pack_layer(str(root), str(tmp_path / "base.tar"))
    top = tmp_path / "top"
    (top / "etc").mkdir(parents=True)
    (top / "etc" / "added").write_text("hi\n")
    imagekit.pack_layer(str(top), str(tmp_path / "top.tar.gz"), gzip_it=True,
                        extra=[("etc/.wh.os-release", None), ("srv/data/.wh..wh..opq", None)])
    return tmp_path


@needs_root
def test_import_every_format_and_share_layers(work) -> None:
    store = ImageStore(str(work / "cache"))
    layers = [str(work / "base.tar"), str(work / "top.tar.gz")]
    imagekit.write_oci_layout(str(work / "oci"), layers, {"Env": ["A=1"], "WorkingDir": "/w"})
    imagekit.write_oci_archive(str(work / "oci"), str(work / "oci.tar"))
    imagekit.write_docker_archive(str(work / "docker.tar"), layers)
    got = {}
    for name, path in [("dir", work / "rootfs"), ("tar", work / "base.tar"),
                       ("oci", work / "oci"), ("ociar", work / "oci.tar"),
                       ("docker", work / "docker.tar")]:
        got[name] = store.import_path(str(path), name)
    assert [got[n].fmt for n in got] == ["rootfs-dir", "rootfs-tar", "oci-dir", "oci-archive",
                                         "docker-archive"]
    assert len(got["oci"].layers) == len(got["docker"].layers) == 2
    assert got["oci"].config == {"Env": ["A=1"], "WorkingDir": "/w"}
    # one copy of a layer whatever imported it: the plain base tar is the same blob everywhere
    assert got["tar"].layers[0] == got["oci"].layers[0] == got["docker"].layers[0]
    assert got["oci"].layers == got["ociar"].layers
    assert len(os.listdir(store.layers_dir)) == 4  # dir-base, base, oci top (gz), docker top
    top = store.layer_paths(got["oci"])[0]
    st = os.lstat(os.path.join(top, "etc/os-release"))  # OCI whiteout -> overlay whiteout
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == 0
    assert os.getxattr(os.path.join(top, "srv/data"), "trusted.overlay.opaque") == b"y"
    assert {i.name for i in store.list_images()} == set(got)
    # removing one image keeps layers others use
    store.remove("tar")
    assert os.path.isdir(store.layer_path(got["oci"].layers[0]))
    for n in ("dir", "oci", "ociar", "docker"):
        store.remove(n)
    assert os.listdir(store.layers_dir) == []
    assert os.listdir(store.tmp_dir) == []


@needs_root
def test_remove_in_use_is_refused(work) -> None:
    store = ImageStore(str(work / "cache"))
    store.import_path(str(work / "base.tar"), "a")
    store.acquire("a")
    with pytest.raises(ImageInUse, match="in use by 1"):
        store.remove("a")
    with pytest.raises(ImageInUse):
        store.import_path(str(work / "base.tar"), "a")  # nor replaced
    store.release("a")
    store.remove("a")
    with pytest.raises(ImageError, match="no image 'a'"):
        store.remove("a")
    with pytest.raises(ImageError, match="not valid"):
        store.import_path(str(work / "base.tar"), "../evil")


def _tar(entries) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for kind, name, arg in entries:
            ti = tarfile.TarInfo(name)
            ti.mode = 0o644
            if kind == "file":
                ti.size = len(arg)
                tf.addfile(ti, io.BytesIO(arg))
                continue
            if kind == "dir":
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
            elif kind == "sym":
                ti.type, ti.linkname = tarfile.SYMTYPE, arg
            elif kind == "hard":
                ti.type, ti.linkname = tarfile.LNKTYPE, arg
            elif kind == "chr":
                ti.type, ti.devmajor, ti.devminor = tarfile.CHRTYPE, 1, 3
            elif kind == "fifo":
                ti.type = tarfile.FIFOTYPE
            tf.addfile(ti)
    return buf.getvalue()


def _snapshot(path) -> set[str]:
    """Everything under ``path`` but the cache itself."""
    out = set()
    for top, dirs, files in os.walk(path):
        for n in dirs + files:
            rel = os.path.relpath(os.path.join(top, n), path)
            if rel != "cache" and not rel.startswith("cache/"):
                out.add(rel)
    return out


BAD = {
    "dotdot": ([("file", "ok", b"1"), ("file", "../../outside-dotdot", b"x")],
               "path traversal"),
    "absolute": ([("file", "/tmp/outside-abs", b"x")], "absolute path"),
    "symlink-out": ([("sym", "a/link", "../../../outside")], "points outside"),
    "abs-symlink-write": ([("sym", "etc", "/tmp/outside-dir"), ("file", "etc/passwd", b"x")],
                          "through the symlink"),
    "device": ([("chr", "dev/null", None)], "device node"),
    "fifo": ([("fifo", "p", None)], "FIFO"),
    "hardlink-out": ([("hard", "h", "/etc/shadow")], "absolute path"),
    "hardlink-missing": ([("hard", "h", "nothere")], "hard link"),
}


@needs_root
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_archives_are_rejected_and_write_nothing_outside(tmp_path, case: str) -> None:
    entries, why = BAD[case]
    outside = tmp_path / "outside-dir"
    outside.mkdir()
    (tmp_path / "tmp").mkdir()
    arc = tmp_path / "bad.tar"
    arc.write_bytes(_tar(entries))
    store = ImageStore(str(tmp_path / "cache"))
    before = _snapshot(tmp_path)
    with pytest.raises(ImageError, match=why) as ei:
        store.import_path(str(arc), "bad")
    assert str(arc) in str(ei.value)  # the message names the archive
    after = _snapshot(tmp_path)
    assert after == before, after ^ before
    assert os.listdir(store.tmp_dir) == [] and os.listdir(store.layers_dir) == []
    assert not store.has("bad")
    assert not os.path.exists("/tmp/outside-abs") and not os.path.exists("/tmp/outside-dir")


@needs_root
def test_truncated_archives_are_rejected(work, tmp_path) -> None:
    store = ImageStore(str(tmp_path / "cache"))
    data = (work / "base.tar").read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[: len(data) // 2 + 100])
    with pytest.raises(ImageError, match=r"truncated or corrupt|not a readable"):
        store.import_path(str(cut), "cut")
    gz = (work / "top.tar.gz").read_bytes()
    cutgz = tmp_path / "cut.tar.gz"
    cutgz.write_bytes(gz[: len(gz) - 20])
    with pytest.raises(ImageError, match=r"truncated or corrupt|not a readable"):
        store.import_path(str(cutgz), "cutgz")
    # an OCI blob cut short: its digest does not match
    imagekit.write_oci_layout(str(tmp_path / "oci"), [str(work / "base.tar")])
    man_blobs = tmp_path / "oci" / "blobs" / "sha256"
    big = max(man_blobs.iterdir(), key=lambda p: p.stat().st_size)
    big.write_bytes(big.read_bytes()[: big.stat().st_size - 4096])
    with pytest.raises(ImageError, match=r"digest mismatch|truncated"):
        store.import_path(str(tmp_path / "oci"), "cutoci")
    assert os.listdir(store.tmp_dir) == [] and os.listdir(store.layers_dir) == []
    shutil.rmtree(tmp_path / "oci")


@needs_root
def test_absolute_symlinks_inside_the_image_are_kept(tmp_path) -> None:
    """Debian's rootfs has absolute links (/etc/alternatives/...): they name paths of the
    image itself (resolved in the sandbox's root), so they are kept, never followed here."""
    arc = tmp_path / "ok.tar"
    arc.write_bytes(_tar([("dir", "usr/bin", None), ("file", "usr/bin/mawk", b"#!x"),
                          ("sym", "etc/alternatives/awk", "/usr/bin/mawk"),
                          ("sym", "usr/bin/awk", "/etc/alternatives/awk")]))
    store = ImageStore(str(tmp_path / "cache"))
    img = store.import_path(str(arc), "ok")
    layer = store.layer_paths(img)[0]
    assert os.readlink(os.path.join(layer, "usr/bin/awk")) == "/etc/alternatives/awk"
