"""The image archive readers, exact (issue 43 item 2): `managers/cpu/images/archives.py` over a
recording sink (no store, no extractor, no root): which format each source is read as, which
layer streams are handed over under which key, ``where`` and expected digest, the runtime config,
and each refusal word for word.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import json
import lzma
import os
import tarfile
from types import SimpleNamespace
from typing import Any

import pytest

from arl_tangram.core.errors import ImageError, ImageTooLarge
from arl_tangram.managers.cpu.images import archives as A


class Sink:
    def __init__(
        self,
        tmp_dir: str,
        *,
        have: tuple[str, ...] = (),
        bytes_left: int = 1 << 30,
        slack: int = 0,
        max_meta: int = 1 << 20,
    ) -> None:
        self.tmp_dir = tmp_dir
        self.budget = SimpleNamespace(
            bytes_left=bytes_left,
            limits=SimpleNamespace(ratio_slack=slack, max_meta_bytes=max_meta),
        )
        self.have = set(have)
        self.got: list[tuple[str, str, str | None, bytes]] = []

    def has_layer(self, key: str) -> bool:
        return key in self.have

    def unpack_layer(self, f: Any, key: str, where: str, expect: str | None = None) -> None:
        self.got.append((key, where, expect, f.read()))


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def tar_bytes(entries: list[tuple[str, Any]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """``(name, bytes)`` a file, ``(name, ("sym", target))`` a link, ``(name, None)`` a dir."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for name, what in entries:
            ti = tarfile.TarInfo(name)
            if isinstance(what, bytes):
                ti.size = len(what)
                tf.addfile(ti, io.BytesIO(what))
            elif what is None:
                ti.type = tarfile.DIRTYPE
                tf.addfile(ti)
            else:
                ti.type, ti.linkname = tarfile.SYMTYPE, what[1]
                tf.addfile(ti)
    return buf.getvalue()


def write(path: Any, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


# ---- an OCI layout -----------------------------------------------------------------------------


def oci(
    layers: list[bytes],
    config: Any = None,
    *,
    nest: int = 0,
    index_extra: list[dict] | None = None,
    layout: Any = None,
) -> dict[str, bytes]:
    """The files of an OCI layout: name -> bytes."""
    files: dict[str, bytes] = {}

    def blob(b: bytes) -> str:
        files[f"blobs/sha256/{sha(b)}"] = b
        return "sha256:" + sha(b)

    cfg = blob(json.dumps(config if config is not None else {"config": {}}).encode())
    man = {"config": {"digest": cfg}, "layers": [{"digest": blob(x)} for x in layers]}
    desc = {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": blob(json.dumps(man).encode()),
    }
    for i in range(nest):
        media = A._MEDIA_INDEX[i % 2]
        desc = {"mediaType": media, "digest": blob(json.dumps({"manifests": [desc]}).encode())}
    files["index.json"] = json.dumps({"manifests": [*(index_extra or []), desc]}).encode()
    files["oci-layout"] = json.dumps(
        {"imageLayoutVersion": "1.0.0"} if layout is None else layout
    ).encode()
    return files


def to_dir(root: Any, files: dict[str, bytes]) -> str:
    for rel, b in files.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        write(p, b)
    return str(root)


def test_an_oci_directory_hands_each_missing_layer_over_with_its_digest(tmp_path) -> None:
    l1, l2 = tar_bytes([("a", b"1")]), tar_bytes([("b", b"2")])
    cfg = {
        "config": {
            "Env": ["A=1"],
            "WorkingDir": "/w",
            "User": "",
            "Cmd": ["x"],
            "Entrypoint": None,
            "Labels": {"k": "v"},
        }
    }
    d = to_dir(tmp_path / "img", oci([l1, l2], cfg))
    sink = Sink(str(tmp_path), have=("sha256-" + sha(l2),))
    fmt, (keys, rc) = A.read(d, sink)
    assert fmt == "oci-dir"
    assert keys == ["sha256-" + sha(l1), "sha256-" + sha(l2)]
    assert rc == {"Env": ["A=1"], "WorkingDir": "/w", "Cmd": ["x"]}
    assert sink.got == [("sha256-" + sha(l1), f"{d}:sha256:{sha(l1)}", "sha256:" + sha(l1), l1)]


def test_nested_indexes_are_followed_up_to_four(tmp_path) -> None:
    l1 = tar_bytes([("a", b"1")])
    for n in (1, 4):
        d = to_dir(tmp_path / f"n{n}", oci([l1], nest=n))
        _fmt, (keys, _rc) = A.read(d, Sink(str(tmp_path)))
        assert keys == ["sha256-" + sha(l1)]
    d = to_dir(tmp_path / "n5", oci([l1], nest=5))
    with pytest.raises(KeyError):  # (the fifth index read as a manifest: no "config")
        A.read(d, Sink(str(tmp_path)))


def test_a_manifest_without_layers_and_a_config_without_config(tmp_path) -> None:
    for cfg in ({}, {"config": None}, [1]):
        files = oci([], cfg)
        d = to_dir(tmp_path / f"c{len(os.listdir(tmp_path))}", files)
        assert A.read(d, Sink(str(tmp_path))) == ("oci-dir", ([], {}))


def test_oci_layout_refusals(tmp_path) -> None:
    l1 = tar_bytes([("a", b"1")])
    d = to_dir(tmp_path / "v", oci([l1], layout={"version": 1}))
    with pytest.raises(ImageError) as e:
        A.read(d, Sink(str(tmp_path)))
    assert str(e.value) == f"{d}: oci-layout has no imageLayoutVersion"
    d = to_dir(tmp_path / "l", oci([l1], layout=["imageLayoutVersion"]))
    with pytest.raises(ImageError, match="oci-layout has no imageLayoutVersion"):
        A.read(d, Sink(str(tmp_path)))
    files = oci([l1])
    files["index.json"] = b"{not json"
    d = to_dir(tmp_path / "j", files)
    with pytest.raises(ImageError) as e:
        A.read(d, Sink(str(tmp_path)))
    assert str(e.value).startswith(f"{d}: not an OCI image layout: Expecting property name")
    files = oci([l1])
    files["oci-layout"] = b"nope"
    d = to_dir(tmp_path / "k", files)
    with pytest.raises(ImageError, match=": not an OCI image layout: Expecting value"):
        A.read(d, Sink(str(tmp_path)))
    files = oci([l1])
    files["index.json"] = json.dumps({"manifests": []}).encode()
    d = to_dir(tmp_path / "e", files)
    with pytest.raises(ImageError) as e:
        A.read(d, Sink(str(tmp_path)))
    assert str(e.value) == f"{d}: index lists no manifest"
    # a blob whose bytes are not its digest
    files = oci([l1])
    man = json.loads(files["index.json"])["manifests"][0]["digest"]
    files[f"blobs/sha256/{man.split(':')[1]}"] = b'{"config": {}, "layers": []}'
    d = to_dir(tmp_path / "m", files)
    with pytest.raises(ImageError) as e:
        A.read(d, Sink(str(tmp_path)))
    assert str(e.value) == f"{d}: blob {man} does not match its digest"


def test_a_directory_source_opens_no_link_and_names_what_is_missing(tmp_path) -> None:
    l1 = tar_bytes([("a", b"1")])
    files = oci([l1])
    d = to_dir(tmp_path / "img", files)
    os.rename(os.path.join(d, "index.json"), os.path.join(d, "real.json"))
    os.symlink("real.json", os.path.join(d, "index.json"))
    src = A._DirSource(d, Sink(str(tmp_path)))
    assert (src.where, src.path, src.max_meta) == (d, d, 1 << 20)
    with pytest.raises(ImageError) as e:
        src.read("index.json")
    assert str(e.value) == f"{d}: index.json: Too many levels of symbolic links"
    with pytest.raises(ImageError) as e:
        src.read("gone")
    assert str(e.value) == f"{d}: gone: No such file or directory"
    with pytest.raises(ImageError) as e:
        A.read(d, Sink(str(tmp_path)))
    assert "not an OCI image layout" not in str(e.value)


def test_metadata_is_read_up_to_max_meta_bytes(tmp_path) -> None:
    d = to_dir(tmp_path / "img", {"x": b"12345", "oci-layout": b"{}"})
    assert A._DirSource(d, Sink(str(tmp_path), max_meta=5)).read("x") == b"12345"
    with pytest.raises(ImageTooLarge) as e:
        A._DirSource(d, Sink(str(tmp_path), max_meta=4)).read("x")
    assert str(e.value) == f"{d}: x is larger than 4 bytes (images.max_meta_bytes)"
    blob = b"abc"
    dig = "sha256:" + sha(blob)
    to_dir(tmp_path / "img", {f"blobs/sha256/{sha(blob)}": blob})
    src = A._DirSource(d, Sink(str(tmp_path), max_meta=2))
    with pytest.raises(ImageTooLarge) as e:
        src.blob(dig)
    assert str(e.value) == f"{d}: blob {dig} is larger than 2 bytes (images.max_meta_bytes)"
    src = A._DirSource(d, Sink(str(tmp_path), max_meta=3))
    assert src.blob(dig, verify=True) == b"abc"
    with pytest.raises(ImageError):
        src.blob("sha256:" + sha(b"other"), verify=True)
    to_dir(tmp_path / "img", {f"blobs/sha256/{sha(b'other')}": b"abc"})
    assert src.blob("sha256:" + sha(b"other")) == b"abc"  # (not verified)


def test_digests() -> None:
    h = "0123456789abcdef" * 4
    assert A._blob_rel("sha256:" + h) == f"blobs/sha256/{h}"
    assert A._key("sha256:" + h) == "sha256-" + h
    for bad in (
        "sha512:" + h,
        "sha256:" + h.upper(),
        "sha256:" + h[:63],
        "sha256:" + h + "0",
        h,
        "sha256:../" + h[3:],
    ):
        with pytest.raises(ImageError) as e:
            A._blob_rel(bad)
        assert str(e.value) == f"unsupported or malformed digest {bad!r}"
    with pytest.raises(ImageError):
        A._key("sha1:" + h)


def test_pick_prefers_linux_amd64() -> None:
    arm = {"digest": "a", "platform": {"os": "linux", "architecture": "arm64"}}
    win = {"digest": "w", "platform": {"os": "windows", "architecture": "amd64"}}
    amd = {"digest": "x", "platform": {"os": "linux", "architecture": "amd64"}}
    bare = {"digest": "b"}
    assert A._pick({"manifests": [arm, win, amd]}, "w") == amd
    assert A._pick({"manifests": [arm, win]}, "w") == arm
    assert A._pick({"manifests": [arm, bare]}, "w") == bare
    assert (
        A._pick({"manifests": [{"digest": "o", "platform": {"os": "linux"}}]}, "w")["digest"] == "o"
    )
    assert (
        A._pick({"manifests": [arm, {"digest": "p", "platform": {"architecture": "amd64"}}]}, "w")[
            "digest"
        ]
        == "p"
    )
    assert A._pick({"manifests": [arm, {"digest": "n", "platform": None}]}, "w")["digest"] == "n"
    got = A._pick({"manifests": [amd]}, "w")
    assert got == amd and got is not amd
    got = A._pick({"manifests": [arm]}, "w")
    assert got is not arm
    for idx in ({}, {"manifests": None}, [amd], None):
        with pytest.raises(ImageError) as e:
            A._pick(idx, "W")
        assert str(e.value) == "W: index lists no manifest"


def test_runtime_config() -> None:
    assert A._runtime_config(None) == {}
    assert A._runtime_config([1]) == {}
    assert A._runtime_config({"config": None}) == {}
    assert A._runtime_config(
        {"config": {"User": "u", "Env": [], "Entrypoint": ["/e"], "Shell": ["sh"]}}
    ) == {"User": "u", "Entrypoint": ["/e"]}


def test_member_names() -> None:
    assert A._norm_member("./././a/b/") == "a/b"
    assert A._norm_member("a/./") == "a/."
    assert A._norm_member(".a") == ".a"
    assert A._norm_member("manifest.json") == "manifest.json"


# ---- files -------------------------------------------------------------------------------------


def test_compressed_files_are_root_file_systems(tmp_path) -> None:
    raw = tar_bytes([("manifest.json", b"[]")])
    for name, data in (
        ("g", gzip.compress(raw)),
        ("b", bz2.compress(raw)),
        ("x", lzma.compress(raw)),
    ):
        p = write(tmp_path / name, data)
        assert A._plain_tar(p) is False
        sink = Sink(str(tmp_path))
        assert A.read(p, sink) == ("rootfs-tar", (["sha256-" + sha(data)], {}))
        assert sink.got == [("sha256-" + sha(data), p, None, data)]
    for head in (b"\x1f\x8a", b"BZ", b"\xfd7zXZ\x01", b"\x1f", b""):
        assert A._plain_tar(write(tmp_path / "h", head + b"\0" * 10)) is True
    assert A._plain_tar(write(tmp_path / "h", b"\x1f\x8b")) is False
    assert A._plain_tar(write(tmp_path / "h", b"BZh")) is False


def test_a_rootfs_tar_already_held_is_not_unpacked_again(tmp_path) -> None:
    raw = tar_bytes([("etc/x", b"1")])
    p = write(tmp_path / "r.tar", raw)
    sink = Sink(str(tmp_path), have=("sha256-" + sha(raw),))
    assert A.read(p, sink) == ("rootfs-tar", (["sha256-" + sha(raw)], {}))
    assert sink.got == []
    big = os.urandom((1 << 20) + 17)
    p = write(tmp_path / "big", big)
    assert A.from_rootfs_tar(p, Sink(str(tmp_path)))[0] == ["sha256-" + sha(big)]


def test_an_unreadable_plain_file_is_refused(tmp_path) -> None:
    p = write(tmp_path / "junk", b"this is no tar at all" * 40)
    with pytest.raises(ImageError) as e:
        A.read(p, Sink(str(tmp_path)))
    assert str(e.value).startswith(f"{p}: not a readable tar archive: ")
    with tarfile.open(fileobj=io.BytesIO(tar_bytes([("a", b"1"), ("b", b"2")]))) as tf:
        assert [m.name for m in A._archive_members(tf)] == ["a", "b"]


def test_oci_and_docker_archives_by_their_markers(tmp_path) -> None:
    l1 = tar_bytes([("a", b"1")])
    files = oci([l1], {"config": {"Cmd": ["c"]}})
    p = write(tmp_path / "o.tar", tar_bytes([("./" + n, b) for n, b in files.items()]))
    sink = Sink(str(tmp_path))
    assert A.read(p, sink) == ("oci-archive", (["sha256-" + sha(l1)], {"Cmd": ["c"]}))
    assert sink.got == [("sha256-" + sha(l1), f"{p}:sha256:{sha(l1)}", "sha256:" + sha(l1), l1)]
    # an oci-layout without its index.json: a root file system
    only = {k: v for k, v in files.items() if k != "index.json"}
    p = write(tmp_path / "n.tar", tar_bytes(list(only.items())))
    assert A.read(p, Sink(str(tmp_path)))[0] == "rootfs-tar"
    p = write(tmp_path / "i.tar", tar_bytes([("index.json", files["index.json"])]))
    assert A.read(p, Sink(str(tmp_path)))[0] == "rootfs-tar"


def docker(
    layers: list[bytes], config: Any = None, *, manifest: Any = None, link: bool = False
) -> bytes:
    entries: list[tuple[str, Any]] = []
    paths = []
    for i, b in enumerate(layers):
        entries.append((f"blobs/{i}.tar", b))
        if link:
            entries.append((f"l{i}.tar", ("sym", f"blobs/{i}.tar")))
            paths.append(f"l{i}.tar")
        else:
            paths.append(f"blobs/{i}.tar")
    entries.append(("c.json", json.dumps(config if config is not None else {}).encode()))
    man = manifest if manifest is not None else [{"Config": "c.json", "Layers": paths}]
    entries.append(("manifest.json", json.dumps(man).encode()))
    return tar_bytes(entries)


def test_a_docker_archive_spools_each_layer_under_its_diff_id(tmp_path) -> None:
    l1, l2 = tar_bytes([("a", b"1")]), tar_bytes([("b", b"2" * 3000)])
    p = write(tmp_path / "d.tar", docker([l1, l2], {"config": {"Env": ["E=1"]}}, link=True))
    sink = Sink(str(tmp_path), have=("sha256-" + sha(l1),))
    fmt, (keys, rc) = A.read(p, sink)
    assert fmt == "docker-archive"
    assert keys == ["sha256-" + sha(l1), "sha256-" + sha(l2)]
    assert rc == {"Env": ["E=1"]}
    assert sink.got == [("sha256-" + sha(l2), f"{p}:l1.tar", None, l2)]
    man = [{"Config": "c.json", "Layers": None}]
    p = write(tmp_path / "e.tar", docker([l1], manifest=man))
    assert A.read(p, Sink(str(tmp_path))) == ("docker-archive", ([], {}))


def test_a_docker_layer_linked_from_another_layer_s_directory_is_read(tmp_path) -> None:
    # `docker save` (before 25) writes a layer that two images share once and links the
    # other's `<id2>/layer.tar` to `../<id>/layer.tar`
    l1 = tar_bytes([("a", b"1")])
    entries = [
        ("id1", None),
        ("id1/layer.tar", l1),
        ("id2", None),
        ("id2/layer.tar", ("sym", "../id1/layer.tar")),
        ("c.json", b"{}"),
        ("manifest.json", json.dumps([{"Config": "c.json", "Layers": ["id2/layer.tar"]}]).encode()),
    ]
    p = write(tmp_path / "d.tar", tar_bytes(entries))
    assert A.read(p, Sink(str(tmp_path)))[1][0] == ["sha256-" + sha(l1)]


@pytest.mark.parametrize(
    "link", ["../../id1/layer.tar", "/id1/layer.tar", "..", "../x/../../id1/layer.tar"]
)
def test_a_docker_layer_link_out_of_the_archive_is_missing(tmp_path, link: str) -> None:
    """A link resolved lexically inside the archive: an absolute one or one above its root
    names no member (even where a member of that name exists)."""
    l1 = tar_bytes([("a", b"1")])
    entries = [
        ("id1", None),
        ("id1/layer.tar", l1),
        ("id2", None),
        ("id2/layer.tar", ("sym", link)),
        ("c.json", b"{}"),
        ("manifest.json", json.dumps([{"Config": "c.json", "Layers": ["id2/layer.tar"]}]).encode()),
    ]
    p = write(tmp_path / "d.tar", tar_bytes(entries))
    with pytest.raises(ImageError, match=r"id2/layer.tar missing from the archive$"):
        A.read(p, Sink(str(tmp_path)))


def test_a_docker_layer_past_the_budget_is_refused(tmp_path) -> None:
    l1 = tar_bytes([("b", b"2" * 3000)])
    n = len(l1)
    assert n == 10240
    p = write(tmp_path / "d.tar", docker([l1]))
    assert A.read(p, Sink(str(tmp_path), bytes_left=n - 120, slack=120))[1][0] == [
        "sha256-" + sha(l1)
    ]
    with pytest.raises(ImageTooLarge) as e:
        A.read(p, Sink(str(tmp_path), bytes_left=n - 120, slack=119))
    assert str(e.value) == f"{p}:blobs/0.tar: the layer is larger than the image may unpack to"
    assert [n for n in os.listdir(tmp_path) if n not in ("d.tar",)] == []


@pytest.mark.parametrize(
    ("manifest", "why"),
    [
        ([], "list index out of range"),
        ({"Config": "c.json"}, "0"),
        ([{"Layers": []}], "'Config'"),
        ([{"Config": "nope.json"}], None),
        ("x", None),
    ],
)
def test_bad_docker_manifests(tmp_path, manifest: Any, why: str | None) -> None:
    p = write(tmp_path / "d.tar", docker([], manifest=manifest))
    with pytest.raises(ImageError) as e:
        A.read(p, Sink(str(tmp_path)))
    if why is not None:
        assert str(e.value) == f"{p}: bad docker-archive manifest.json: {why}"
    else:
        assert str(e.value).startswith(f"{p}: ")


def test_bad_docker_manifest_json(tmp_path) -> None:
    p = write(tmp_path / "d.tar", tar_bytes([("manifest.json", b"[")]))
    with pytest.raises(ImageError, match=r"bad docker-archive manifest\.json: Expecting value"):
        A.read(p, Sink(str(tmp_path)))


def test_tar_members_links_and_refusals(tmp_path) -> None:
    chain = [("f", b"data")] + [(f"s{i}", ("sym", f"s{i - 1}" if i else "f")) for i in range(10)]
    chain += [("d", None), ("dl", ("sym", "d")), ("dang", ("sym", "zz")), ("./x/y/", None)]
    p = write(tmp_path / "t.tar", tar_bytes(chain))
    with tarfile.open(p) as tf:
        src = A._TarSource(tf.getmembers(), tf, p, Sink(str(tmp_path), max_meta=99))
        assert (src.where, src.max_meta) == (p, 99)
        assert "x/y" in src.by_name
        assert src.read("./f") == b"data"
        assert src.read("s7") == b"data"  # (8 links)
        for rel in ("s8", "s9", "d", "dl", "dang", "missing"):
            with pytest.raises(ImageError) as e:
                src.open_member(rel)
            assert str(e.value) == f"{p}: {rel} missing from the archive"


def test_a_sparse_member_is_refused_unread(tmp_path) -> None:
    from arl_tangram.managers.cpu.images import imagekit

    p = imagekit.sparse_docker_archive(str(tmp_path / "s.tar"), "layer", 0.001)
    with tarfile.open(p) as tf:
        members = tf.getmembers()
        src = A._TarSource(members, tf, p, Sink(str(tmp_path)))
        sparse = [m for m in members if m.issparse()]
        assert sparse
        with pytest.raises(ImageTooLarge) as e:
            src.open_member(sparse[0].name)
    assert str(e.value) == (
        f"{p}: {sparse[0].name} is a sparse member of {sparse[0].size} "
        "bytes (refused: it would expand past what the archive holds)"
    )


def test_a_tar_of_many_members_is_a_root_file_system(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(A, "_MAX_ARCHIVE_MEMBERS", 3)
    files = oci([], {})
    entries = list(files.items())
    assert len(entries) == 4
    p = write(tmp_path / "o.tar", tar_bytes(entries))
    assert A.read(p, Sink(str(tmp_path)))[0] == "rootfs-tar"
    monkeypatch.setattr(A, "_MAX_ARCHIVE_MEMBERS", 4)
    p = write(tmp_path / "o4.tar", tar_bytes(entries))
    assert A.read(p, Sink(str(tmp_path)))[0] == "oci-archive"
    assert A._MAX_ARCHIVE_MEMBERS == 4
    monkeypatch.undo()
    assert A._MAX_ARCHIVE_MEMBERS == 4096


def test_a_truncated_tar_is_read_as_a_root_file_system(tmp_path) -> None:
    raw = tar_bytes([("manifest.json", b"[]" * 400), ("b", b"x" * 2000)])
    p = write(tmp_path / "t.tar", raw[:1200])
    sink = Sink(str(tmp_path))
    assert A.read(p, sink) == ("rootfs-tar", (["sha256-" + sha(raw[:1200])], {}))


# ---- directories -------------------------------------------------------------------------------


def test_a_directory_is_packed_sorted_with_links_kept(tmp_path) -> None:
    root = tmp_path / "root"
    (root / "b").mkdir(parents=True)
    (root / "a").mkdir()
    (root / "b" / "f").write_bytes(b"hello")
    (root / "z").write_bytes(b"zz")
    (root / "a" / "y").write_bytes(b"")
    os.symlink("/etc/passwd", root / "link")
    os.utime(root / "z", (1.0, 12345.75))
    cache = tmp_path / "cache"
    cache.mkdir()
    sink = Sink(str(cache))
    fmt, (keys, rc) = A.read(str(root), sink)
    assert fmt == "rootfs-dir" and rc == {}
    [(key, where, expect, data)] = sink.got
    assert key == keys[0] == "sha256-" + sha(data) and expect is None
    assert where.startswith(str(cache) + "/dir-") and where.endswith(".tar")
    assert os.listdir(cache) == []  # (the packed tar removed)
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        ms = tf.getmembers()
        assert [m.name for m in ms] == ["a", "b", "link", "z", "a/y", "b/f"]
        assert tf.format == tarfile.PAX_FORMAT
        by = {m.name: m for m in ms}
        assert by["link"].issym() and by["link"].linkname == "/etc/passwd"
        assert by["z"].mtime == 12345 and isinstance(by["z"].mtime, int)
        assert tf.extractfile(by["b/f"]).read() == b"hello"
        assert by["a"].isdir()
    again = Sink(str(cache), have=(key,))
    assert A.read(str(root), again) == ("rootfs-dir", ([key], {})) and again.got == []


# ---- helper-46: the survivors of the 28dfb88 run -----------------------------------------------


def test_a_plain_file_tarfile_would_read_only_through_a_decompressor_is_refused(tmp_path) -> None:
    # (an lzma "alone" stream passes `_plain_tar`; read as a plain tar it is no tar)
    raw = tar_bytes([("manifest.json", b"[]")])
    p = write(tmp_path / "t.lzma", lzma.compress(raw, format=lzma.FORMAT_ALONE))
    assert A._plain_tar(p) is True
    with pytest.raises(ImageError, match="not a readable tar archive"):
        A.read(p, Sink(str(tmp_path)))


def test_a_packed_directory_already_gone_is_no_error(tmp_path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "f").write_bytes(b"x")
    cache = tmp_path / "cache"
    cache.mkdir()

    class Taking(Sink):
        def unpack_layer(self, f: Any, key: str, where: str, expect: str | None = None) -> None:
            super().unpack_layer(f, key, where, expect)
            os.unlink(where)

    sink = Taking(str(cache))
    assert A.read(str(root), sink)[0] == "rootfs-dir" and len(sink.got) == 1


def test_nested_indexes_and_the_config_are_verified(tmp_path) -> None:
    l1 = tar_bytes([("a", b"1")])
    for what in ("index", "config"):
        files = oci([l1], nest=1)
        top = json.loads(files["index.json"])["manifests"][0]["digest"]
        inner = json.loads(files[f"blobs/sha256/{top.split(':')[1]}"])
        man_d = inner["manifests"][0]["digest"]
        man = json.loads(files[f"blobs/sha256/{man_d.split(':')[1]}"])
        cfg = man["config"]["digest"]
        dig = top if what == "index" else cfg
        rel = f"blobs/sha256/{dig.split(':')[1]}"
        files[rel] = files[rel] + b" "  # (still JSON, no longer its digest)
        d = to_dir(tmp_path / what, files)
        with pytest.raises(ImageError) as e:
            A.read(d, Sink(str(tmp_path)))
        assert str(e.value) == f"{d}: blob {dig} does not match its digest"


def test_a_nested_index_without_manifests_names_the_layout(tmp_path) -> None:
    files = oci([], nest=1)
    top = json.loads(files["index.json"])["manifests"][0]["digest"]
    empty = json.dumps({"manifests": []}).encode()
    files.pop(f"blobs/sha256/{top.split(':')[1]}")
    files[f"blobs/sha256/{sha(empty)}"] = empty
    files["index.json"] = json.dumps(
        {"manifests": [{"mediaType": A._MEDIA_INDEX[0], "digest": "sha256:" + sha(empty)}]}
    ).encode()
    d = to_dir(tmp_path / "n", files)
    with pytest.raises(ImageError) as e:
        A.read(d, Sink(str(tmp_path)))
    assert str(e.value) == f"{d}: index lists no manifest"


def test_a_docker_layer_is_spooled_in_the_sink_s_tmp_dir_read_in_chunks(
    tmp_path, monkeypatch
) -> None:
    l1 = tar_bytes([("b", b"2" * 3000)])
    p = write(tmp_path / "d.tar", docker([l1]))
    spool_dir = tmp_path / "spools"
    spool_dir.mkdir()
    where: list[str] = []
    sizes: list[Any] = []

    class Seeing(Sink):
        def unpack_layer(self, f: Any, key: str, where_: str, expect: str | None = None) -> None:
            where.append(os.readlink(f"/proc/self/fd/{f.fileno()}"))
            super().unpack_layer(f, key, where_, expect)

    real = A._TarSource.open_member

    def spying(self: Any, rel: str) -> Any:
        f = real(self, rel)
        read = f.read

        def sized(n: Any = -1) -> bytes:
            sizes.append(n)
            return read(n)

        f.read = sized
        return f

    monkeypatch.setattr(A._TarSource, "open_member", spying)
    assert A.read(p, Seeing(str(spool_dir)))[1][0] == ["sha256-" + sha(l1)]
    assert len(where) == 1 and where[0].startswith(str(spool_dir) + "/")
    assert A.CHUNK in sizes and None not in sizes and -1 not in sizes


def test_a_docker_layer_counts_every_chunk_against_the_budget(tmp_path) -> None:
    l1 = tar_bytes([("big", b"\0" * (3 << 19))])  # 1.5 MiB: two chunks
    p = write(tmp_path / "d.tar", docker([l1]))
    with pytest.raises(ImageTooLarge, match="the layer is larger than the image may unpack to"):
        A.read(p, Sink(str(tmp_path), bytes_left=(1 << 20) + 1000))


def test_metadata_is_never_read_past_max_meta_bytes_plus_one() -> None:
    asked: list[Any] = []

    class F:
        def read(self, n: Any = -1) -> bytes:
            asked.append(n)
            return b"x" * 10 if n in (None, -1) else b"x" * min(n, 10)

    src = A._Source()
    src.max_meta, src.where = 4, "w"
    with pytest.raises(ImageTooLarge):
        src._capped(F(), "x")
    assert asked == [5]


def test_a_tar_member_too_large_to_read_is_named(tmp_path) -> None:
    p = write(tmp_path / "t.tar", tar_bytes([("index.json", b"123456")]))
    with tarfile.open(p) as tf:
        src = A._TarSource(tf.getmembers(), tf, p, Sink(str(tmp_path), max_meta=5))
        with pytest.raises(ImageTooLarge) as e:
            src.read("index.json")
    assert str(e.value) == f"{p}: index.json is larger than 5 bytes (images.max_meta_bytes)"


def test_a_link_is_relative_to_its_own_directory(tmp_path) -> None:
    l1 = tar_bytes([("a", b"1")])
    entries = [
        ("d", None),
        ("d/x.tar", l1),
        ("d/l.tar", ("sym", "x.tar")),
        ("c.json", b"{}"),
        ("manifest.json", json.dumps([{"Config": "c.json", "Layers": ["d/l.tar"]}]).encode()),
    ]
    p = write(tmp_path / "d.tar", tar_bytes(entries))
    assert A.read(p, Sink(str(tmp_path)))[1][0] == ["sha256-" + sha(l1)]


def test_only_slashes_are_stripped_from_a_member_name() -> None:
    assert A._norm_member("a/X") == "a/X"
    assert A._norm_member("./layerXX//") == "layerXX"


@pytest.mark.parametrize(
    "link", ["../../id1/layer.tar", "/id1/layer.tar", "../..", "../x/../../id1/layer.tar"]
)
def test_a_link_out_of_the_archive_misses_even_a_member_of_that_very_name(
    tmp_path, link: str
) -> None:
    # (a hostile archive may hold members named "../id1/layer.tar", "/id1/layer.tar", "..")
    l1 = tar_bytes([("a", b"1")])
    entries = [(n, l1) for n in ("id1/layer.tar", "../id1/layer.tar", "/id1/layer.tar", "..")]
    entries += [
        ("id2/layer.tar", ("sym", link)),
        ("c.json", b"{}"),
        ("manifest.json", json.dumps([{"Config": "c.json", "Layers": ["id2/layer.tar"]}]).encode()),
    ]
    p = write(tmp_path / "d.tar", tar_bytes(entries))
    with tarfile.open(p) as tf:
        names = {m.name for m in tf.getmembers()}
    assert {"../id1/layer.tar", "/id1/layer.tar", ".."} <= names
    with pytest.raises(ImageError, match=r"id2/layer.tar missing from the archive$"):
        A.read(p, Sink(str(tmp_path)))
