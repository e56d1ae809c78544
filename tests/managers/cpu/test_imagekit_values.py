"""Exact values of the image kit (`images/imagekit.py`, issue 43): the root file system it makes
(directories, modes, /etc files), the libraries `ldd` names, the host Python's copy, the layer
tars (members, modes, PAX, gzip), the OCI layout's and docker-archive's JSON byte for byte, and
the hostile archives' shapes."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
from types import SimpleNamespace

import pytest

from arl_tangram.managers.cpu.images import imagekit


def _rb(p) -> bytes:
    with open(p, "rb") as f:
        return f.read()


def _rt(p) -> str:
    with open(p) as f:
        return f.read()


def test_libs_reads_the_paths_ldd_prints(monkeypatch) -> None:
    out = (
        "\tlinux-vdso.so.1 (0x00007ffd)\n"
        "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f01)\n"
        "\t/lib64/ld-linux-x86-64.so.2 (0x00007f02)\n"
        "\tlibm.so.6 => not found\n"
        "\tlibx.so => /opt/x lib/libx.so (0x1)\n"
    )  # (a space in a path: its tail)
    seen = []

    def run(argv, **kw):
        seen.append((argv, kw))
        return SimpleNamespace(stdout=out)

    monkeypatch.setattr(imagekit.subprocess, "run", run)
    assert imagekit._libs("/bin/true") == {
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib64/ld-linux-x86-64.so.2",
        "/libx.so",
    }
    assert seen == [(["ldd", "/bin/true"], {"capture_output": True, "text": True})]


def test_copy_follows_links_and_keeps_what_is_there(tmp_path) -> None:
    src = tmp_path / "s"
    src.mkdir()
    (src / "real").write_text("r")
    os.chmod(src / "real", 0o751)
    os.symlink("real", src / "ln")
    root = str(tmp_path / "root")
    imagekit._copy(str(src / "ln"), root)
    dst = root + str(src / "ln")
    assert not os.path.islink(dst) and _rt(dst) == "r"
    assert stat.S_IMODE(os.stat(dst).st_mode) == 0o751  # (copy2: mode kept)
    (src / "real").write_text("changed")
    imagekit._copy(str(src / "ln"), root)
    assert _rt(dst) == "r"  # already there: not copied again


def test_host_rootfs_layout_and_modes(tmp_path) -> None:
    root = str(tmp_path / "r")
    assert imagekit.host_rootfs(root, tools=("cat", "no-such-tool-t53")) == root
    for d in ("bin", "etc", "tmp", "workdir", "proc", "dev", "usr/bin", "root", "srv/data"):
        assert os.path.isdir(os.path.join(root, d)), d
    mode = lambda p: stat.S_IMODE(os.stat(os.path.join(root, p)).st_mode)  # noqa: E731
    assert mode("tmp") == 0o1777 and mode("workdir") == 0o777 and mode("srv/data") == 0o777
    assert mode("srv/data/orig") == 0o666
    rd = lambda p: _rt(os.path.join(root, p))  # noqa: E731
    assert rd("etc/passwd") == (
        "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/:/bin/sh\n"
    )
    assert rd("etc/group") == "root:x:0:\nnogroup:x:65534:\n"
    assert rd("etc/os-release") == "ID=tangram-mini\n"
    assert rd("srv/data/orig") == "original\n"
    cat = shutil.which("cat")
    assert os.path.isfile(root + cat)
    for p in ("/bin/cat", "/usr/bin/cat"):
        if os.path.exists(p):
            assert os.path.isfile(root + p)
    for lib in imagekit._libs(os.path.realpath(cat)):
        assert os.path.isfile(root + lib), lib
    loader = [lib for lib in imagekit._libs(os.path.realpath(cat)) if "/ld-linux" in lib]
    for lib in loader:
        for d in ("/lib64", "/lib/x86_64-linux-gnu"):
            cand = os.path.join(d, os.path.basename(lib))
            if os.path.exists(cand):
                assert os.path.isfile(root + cand)
    assert not os.path.exists(os.path.join(root, "usr/bin/no-such-tool-t53"))


def test_host_rootfs_defaults() -> None:
    assert imagekit.DEFAULT_TOOLS[:4] == ("bash", "sh", "cat", "ls")
    assert len(imagekit.DEFAULT_TOOLS) == 31 and imagekit.DEFAULT_TOOLS[-1] == "sync"


def test_host_rootfs_takes_the_default_tools(tmp_path, monkeypatch) -> None:
    asked = []
    monkeypatch.setattr(imagekit.shutil, "which", lambda t: asked.append(t))
    imagekit.host_rootfs(str(tmp_path / "r"))
    assert tuple(asked) == imagekit.DEFAULT_TOOLS


def test_add_host_python_refuses_what_is_not_a_system_interpreter(tmp_path, monkeypatch) -> None:
    root = str(tmp_path / "r")
    assert imagekit.add_host_python(root, str(tmp_path / "absent")) is None
    fake = tmp_path / "py"
    for body in (
        "echo /usr/lib/python3; echo False",
        "echo one",
        "exit 3",
        "echo /usr/lib/python3; echo True; echo extra",
    ):
        fake.write_text(f"#!/bin/sh\n{body}\n")
        os.chmod(fake, 0o755)
        assert imagekit.add_host_python(root, str(fake)) is None, body
    assert not os.path.exists(root)


def test_add_host_python_copies_the_stdlib_without_the_skipped_parts(tmp_path, monkeypatch) -> None:
    py = "/usr/bin/python3"
    if not os.access(py, os.X_OK):
        pytest.skip("no system python3")
    calls = []

    def copytree(src, dst, **kw):
        calls.append((src, dst, kw.get("symlinks")))
        ign = kw["ignore"]
        assert ign(
            "/x",
            [
                "test",
                "json",
                "config-3.11-x86_64-linux-gnu",
                "asyncio",
                "re",
                "site-packages",
                "__pycache__",
                "email",
            ],
        ) == {
            "test",
            "config-3.11-x86_64-linux-gnu",
            "asyncio",
            "site-packages",
            "__pycache__",
            "email",
        }
        os.makedirs(dst)
        return dst

    monkeypatch.setattr(imagekit.shutil, "copytree", copytree)
    root = str(tmp_path / "r")
    link = imagekit.add_host_python(root, py)
    assert link == os.path.join(root, "usr/bin/python3")
    assert os.readlink(link) == os.path.realpath(py)
    real_py = os.path.realpath(py)
    assert os.path.isfile(root + real_py)
    for lib in imagekit._libs(real_py):
        if "/ld-linux" in lib:  # the loader, also where the other layout looks for it
            cand = os.path.join("/lib/x86_64-linux-gnu", os.path.basename(lib))
            if os.path.exists(cand):
                assert os.path.isfile(root + cand), cand
    ((src, dst, links),) = calls
    assert dst == root + src and links is True and src.startswith("/usr/lib/python3")
    assert imagekit.add_host_python(root, py) == link  # again: the stdlib and link are there
    assert len(calls) == 1
    root2 = str(tmp_path / "r2")
    assert imagekit.add_host_python(root2) == os.path.join(root2, "usr/bin/python3")  # the default
    assert {
        "test",
        "idlelib",
        "tkinter",
        "unittest",
        "asyncio",
        "email",
        "xml",
        "http",
        "urllib",
        "sqlite3",
        "venv",
        "distutils",
        "config-3",
    } <= imagekit._PY_SKIP
    assert len(imagekit._PY_SKIP) == 26


def test_pack_layer_members_modes_and_extras(tmp_path) -> None:
    src = tmp_path / "s"
    (src / "b" / "c").mkdir(parents=True)
    (src / "a").write_bytes(b"AAA")
    (src / "b" / "z").write_bytes(b"Z")
    os.symlink("a", src / "ln")
    os.chmod(src / "a", 0o640)
    out = imagekit.pack_layer(
        str(src), str(tmp_path / "l.tar"), extra=[("x/.wh.y", None), ("d", b"data")]
    )
    assert out == str(tmp_path / "l.tar")
    with tarfile.open(out) as tf:
        members = tf.getmembers()
        assert [m.name for m in members] == ["b", "a", "ln", "b/c", "b/z", "x/.wh.y", "d"]
        by = {m.name: m for m in members}
        assert by["a"].isreg() and stat.S_IMODE(by["a"].mode) == 0o640
        assert tf.extractfile("a").read() == b"AAA"
        assert by["ln"].issym() and by["ln"].linkname == "a"
        assert by["b/c"].isdir()
        assert by["x/.wh.y"].size == 0 and by["x/.wh.y"].mode == 0o644
        assert by["d"].size == 4 and tf.extractfile("d").read() == b"data" and by["d"].mode == 0o644
    data = _rb(out)
    assert data[:2] != b"\x1f\x8b"


def test_pack_layer_is_pax(tmp_path) -> None:
    src = tmp_path / "s"
    src.mkdir()
    long = "n" * 120  # past ustar's 100-byte name: PAX writes a header, GNU a ././@LongLink
    (src / long).write_text("x")
    out = imagekit.pack_layer(str(src), str(tmp_path / "l.tar"))
    data = _rb(out)
    assert b"././@LongLink" not in data and b"path=" + long.encode() in data


def test_pack_layer_gzip_is_level_1_without_a_time(tmp_path) -> None:
    src = tmp_path / "s"
    src.mkdir()
    (src / "a").write_bytes(bytes(range(256)) * 64)
    out = imagekit.pack_layer(str(src), str(tmp_path / "l.tgz"), gzip_it=True)
    data = _rb(out)
    assert data[:2] == b"\x1f\x8b"
    assert data[4:8] == bytes(4)  # mtime 0
    assert data[8] == 4  # XFL 4: the fastest level
    raw = imagekit.pack_layer(str(src), str(tmp_path / "l.tar"))
    assert gzip.decompress(data) == _rb(raw)


def test_pack_layer_of_extras_only(tmp_path) -> None:
    out = imagekit.pack_layer("", str(tmp_path / "e.tar"), extra=[("f", b"1")])
    with tarfile.open(out) as tf:
        assert tf.getnames() == ["f"]


def test_oci_layout_bytes(tmp_path) -> None:
    l1 = tmp_path / "l1.tar"
    l1.write_bytes(b"plain-layer")
    l2 = tmp_path / "l2.tar.gz"
    l2.write_bytes(gzip.compress(b"gz-layer", mtime=0))
    lay = str(tmp_path / "oci")
    os.mkdir(lay)  # (already there: fine)
    assert imagekit.write_oci_layout(lay, [str(l1), str(l2)], {"Env": ["A=1"]}, ref="v1") == lay
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    blob = lambda d: _rb(os.path.join(lay, "blobs", "sha256", d.split(":")[1]))  # noqa: E731
    index = json.loads(_rt(os.path.join(lay, "index.json")))
    assert json.loads(_rt(os.path.join(lay, "oci-layout"))) == {"imageLayoutVersion": "1.0.0"}
    (m,) = index["manifests"]
    assert index["schemaVersion"] == 2
    assert m["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert m["annotations"] == {"org.opencontainers.image.ref.name": "v1"}
    man_b = blob(m["digest"])
    assert m["size"] == len(man_b) and m["digest"] == "sha256:" + sha(man_b)
    man = json.loads(man_b)
    assert man["schemaVersion"] == 2
    assert man["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert man["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    cfg_b = blob(man["config"]["digest"])
    assert man["config"]["size"] == len(cfg_b)
    assert json.loads(cfg_b) == {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["A=1"]},
        "rootfs": {
            "type": "layers",
            "diff_ids": ["sha256:" + sha(b"plain-layer"), "sha256:" + sha(b"gz-layer")],
        },
    }
    assert man["layers"] == [
        {
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": "sha256:" + sha(b"plain-layer"),
            "size": 11,
        },
        {
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": "sha256:" + sha(l2.read_bytes()),
            "size": len(l2.read_bytes()),
        },
    ]
    assert sorted(os.listdir(os.path.join(lay, "blobs", "sha256"))) == sorted(
        [sha(b"plain-layer"), sha(l2.read_bytes()), sha(cfg_b), sha(man_b)]
    )
    imagekit.write_oci_layout(str(tmp_path / "oci2"), [str(l1)])
    idx2 = json.loads(_rt(tmp_path / "oci2" / "index.json"))
    assert idx2["manifests"][0]["annotations"] == {"org.opencontainers.image.ref.name": "latest"}
    man2 = json.loads(
        _rb(tmp_path / "oci2" / "blobs" / "sha256" / idx2["manifests"][0]["digest"][7:])
    )
    cfg2 = json.loads(_rb(tmp_path / "oci2" / "blobs" / "sha256" / man2["config"]["digest"][7:]))
    assert cfg2["config"] == {}


def test_oci_archive_is_the_layout_as_one_tar(tmp_path) -> None:
    l1 = tmp_path / "l1.tar"
    l1.write_bytes(b"x")
    lay = imagekit.write_oci_layout(str(tmp_path / "oci"), [str(l1)])
    out = imagekit.write_oci_archive(lay, str(tmp_path / "o.tar"))
    assert out == str(tmp_path / "o.tar")
    with tarfile.open(out) as tf:
        names = tf.getnames()
        assert names[:3] == ["blobs", "blobs/sha256", names[2]] and "index.json" in names
        assert names.index("index.json") < names.index("oci-layout")
        assert tf.format == tarfile.PAX_FORMAT


def test_docker_archive_bytes(tmp_path) -> None:
    l1 = tmp_path / "l1.tar"
    l1.write_bytes(b"plain")
    l2 = tmp_path / "l2.tgz"
    l2.write_bytes(gzip.compress(b"zipped"))
    os.mkdir(tmp_path / "d.tar.d")  # (left by an earlier run: fine, and removed)
    out = imagekit.write_docker_archive(
        str(tmp_path / "d.tar"), [str(l1), str(l2)], {"User": "1"}, tag="x:y"
    )
    assert out == str(tmp_path / "d.tar") and not os.path.exists(out + ".d")
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    with tarfile.open(out) as tf:
        assert tf.format == tarfile.PAX_FORMAT
        (man,) = json.load(tf.extractfile("manifest.json"))
        assert man["RepoTags"] == ["x:y"]
        assert man["Layers"] == [f"{sha(b'plain')}/layer.tar", f"{sha(b'zipped')}/layer.tar"]
        assert tf.extractfile(man["Layers"][1]).read() == b"zipped"  # stored unzipped
        cfg_b = tf.extractfile(man["Config"]).read()
        assert man["Config"] == f"{sha(cfg_b)}.json"
        assert json.loads(cfg_b) == {
            "architecture": "amd64",
            "os": "linux",
            "config": {"User": "1"},
            "rootfs": {
                "type": "layers",
                "diff_ids": ["sha256:" + sha(b"plain"), "sha256:" + sha(b"zipped")],
            },
        }
    out2 = imagekit.write_docker_archive(str(tmp_path / "e.tar"), [str(l1)])
    with tarfile.open(out2) as tf:
        (man,) = json.load(tf.extractfile("manifest.json"))
        assert man["RepoTags"] == ["img:latest"]
        assert json.loads(tf.extractfile(man["Config"]).read())["config"] == {}


def test_gzip_bomb_shape(tmp_path) -> None:
    out = imagekit.gzip_bomb(str(tmp_path / "b.gz"), 0.0078125)  # 8 MiB
    data = _rb(out)
    assert len(data) < 64 << 10
    raw = gzip.decompress(data)
    assert len(raw) == 512 + (8 << 20) + 1024
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        (m,) = tf.getmembers()
        assert (m.name, m.size, m.mode) == ("zeros", 8 << 20, 0o644)
    assert raw[512:] == bytes((8 << 20) + 1024)
    mib = gzip.compress(b"\0" * (1 << 20), 9)
    assert data.count(mib[10:]) == 8  # (level 9; the header's time aside)
    # a fraction of a MiB is dropped
    raw = gzip.decompress(_rb(imagekit.gzip_bomb(str(tmp_path / "c.gz"), 0.0015)))
    assert len(raw) == 512 + (1 << 20) + 1024


def test_inode_bomb_shape(tmp_path) -> None:
    out = imagekit.inode_bomb(str(tmp_path / "i.tgz"), 5)
    data = _rb(out)
    assert data[:2] == b"\x1f\x8b"
    with tarfile.open(out) as tf:
        ms = tf.getmembers()
        assert [m.name for m in ms] == [f"f/{i}" for i in range(5)]
        assert all(m.mode == 0o644 and m.size == 0 and m.isreg() for m in ms)
    raw = gzip.decompress(data)
    assert raw[257:265] == b"ustar  \x00"  # GNU format


@pytest.mark.parametrize("member", ["layer", "manifest.json"])
def test_sparse_docker_archive_shape(tmp_path, member: str) -> None:
    out = imagekit.sparse_docker_archive(str(tmp_path / "s.tar"), member, 0.5)
    assert not os.path.exists(out + ".d")
    with tarfile.open(out) as tf:
        by = {m.name: m for m in tf.getmembers()}
        assert json.load(tf.extractfile("config.json")) == {
            "architecture": "amd64",
            "os": "linux",
            "config": {},
        }
        if member == "layer":
            assert sorted(by) == ["config.json", "layer.tar", "manifest.json"]
            assert json.load(tf.extractfile("manifest.json")) == [
                {"Config": "config.json", "RepoTags": [], "Layers": ["layer.tar"]}
            ]
            big = by["layer.tar"]
        else:
            assert sorted(by) == ["config.json", "manifest.json"]
            big = by["manifest.json"]
        assert big.size == 1 << 29 and big.issparse()
        head = tf.extractfile(big).read(1)
        assert head == (b"[" if member == "manifest.json" else b"\0")
    assert os.path.getsize(out) < 64 << 10


def test_docker_archive_of_one_layer_twice(tmp_path) -> None:
    l1 = tmp_path / "l1.tar"
    l1.write_bytes(b"same")
    out = imagekit.write_docker_archive(str(tmp_path / "d.tar"), [str(l1), str(l1)])
    with tarfile.open(out) as tf:
        (man,) = json.loads(tf.extractfile("manifest.json").read())
        h = hashlib.sha256(b"same").hexdigest()
        assert man["Layers"] == [f"{h}/layer.tar", f"{h}/layer.tar"]


def test_host_rootfs_without_tools_and_again(tmp_path) -> None:
    root = str(tmp_path / "r")
    imagekit.host_rootfs(root, tools=())
    assert sorted(os.listdir(root)) == [
        "bin",
        "dev",
        "etc",
        "proc",
        "root",
        "srv",
        "tmp",
        "usr",
        "workdir",
    ]
    assert os.listdir(os.path.join(root, "usr")) == ["bin"]
    assert (
        os.listdir(os.path.join(root, "bin")) == []
        and os.listdir(os.path.join(root, "usr/bin")) == []
    )
    imagekit.host_rootfs(root, tools=())  # again on the same root: fine
    assert _rt(os.path.join(root, "etc/os-release")) == "ID=tangram-mini\n"
