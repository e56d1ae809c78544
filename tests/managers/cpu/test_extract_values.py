"""The extractor's values, exactly (issue 35, mutation run on images/extract.py): owners, modes
and times on disk for every kind of entry, every codec, whiteouts as overlay wants them, which
links are kept, the free-space floor and the budget's and the ratio's boundaries."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import lzma
import os
import stat
import tarfile

import pytest

from arl_tangram.core.errors import ImageError, ImageTooLarge
from arl_tangram.managers.cpu.images.extract import (
    Budget,
    Counted,
    ImageLimits,
    Ratio,
    link_inside,
    unpack,
)

pytestmark = pytest.mark.needs_root  # (owners)


def _tar(entries: list[dict]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for e in entries:
            ti = tarfile.TarInfo(e["name"])
            ti.mode, ti.uid, ti.gid = e.get("mode", 0o644), e.get("uid", 0), e.get("gid", 0)
            ti.mtime = e.get("mtime", 1_000_000)
            kind = e.get("kind", "file")
            if kind == "file":
                data = e.get("data", b"")
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
                continue
            ti.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE,
                       "hard": tarfile.LNKTYPE}[kind]
            ti.linkname = e.get("target", "")
            tf.addfile(ti)
    return buf.getvalue()


def _unpack(tmp_path, data: bytes, limits: ImageLimits | None = None,
            expect: str | None = None) -> str:
    (tmp_path / "tmp").mkdir(exist_ok=True)
    target = str(tmp_path / "layer")
    budget = Budget(limits or ImageLimits(min_free_bytes=0, min_free_inodes=0),
                    str(tmp_path / "tmp"))
    unpack(io.BytesIO(data), str(tmp_path / "tmp"), target, "L", expect, budget)
    assert os.listdir(tmp_path / "tmp") == []
    return target


def test_owners_modes_and_times_of_every_kind_are_kept_exactly(tmp_path) -> None:
    big = os.urandom(3 << 20 | 12345)  # past one copy chunk
    layer = _unpack(tmp_path, _tar([
        {"name": "d", "kind": "dir", "mode": 0o751, "uid": 42, "gid": 43, "mtime": 2_000_000},
        {"name": "d/f", "data": b"hello", "mode": 0o640, "uid": 1234, "gid": 5678,
         "mtime": 1_500_000},
        {"name": "d/big", "data": big, "mode": 0o600},
        {"name": "d/sticky", "mode": 0o1755}, {"name": "d/suid", "mode": 0o6755},
        {"name": "d/l", "kind": "sym", "target": "f", "uid": 7, "gid": 8, "mtime": 3_000_000},
        {"name": "h", "kind": "hard", "target": "d/f"},
        {"name": "ro", "kind": "dir", "mode": 0o555},
        {"name": "ro/inside", "data": b"x", "mode": 0o444},
    ]))
    st = os.lstat(os.path.join(layer, "d"))
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), st.st_mtime) == \
        (42, 43, 0o751, 2_000_000)  # set after its entries were written into it
    st = os.lstat(os.path.join(layer, "d/f"))
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), st.st_mtime, st.st_size) == \
        (1234, 5678, 0o640, 1_500_000, 5)
    with open(os.path.join(layer, "d/big"), "rb") as f:
        assert hashlib.sha256(f.read()).digest() == hashlib.sha256(big).digest()
    assert stat.S_IMODE(os.lstat(os.path.join(layer, "d/sticky")).st_mode) == 0o1755
    assert stat.S_IMODE(os.lstat(os.path.join(layer, "d/suid")).st_mode) == 0o755
    st = os.lstat(os.path.join(layer, "d/l"))
    assert stat.S_ISLNK(st.st_mode) and os.readlink(os.path.join(layer, "d/l")) == "f"
    assert (st.st_uid, st.st_gid, st.st_mtime) == (7, 8, 3_000_000)
    h, f = os.lstat(os.path.join(layer, "h")), os.lstat(os.path.join(layer, "d/f"))
    assert h.st_ino == f.st_ino and f.st_nlink == 2
    assert stat.S_IMODE(os.lstat(os.path.join(layer, "ro")).st_mode) == 0o555
    assert stat.S_IMODE(os.lstat(os.path.join(layer, "ro/inside")).st_mode) == 0o444
    assert stat.S_IMODE(os.lstat(layer).st_mode) == 0o755  # the layer's root


def test_implicit_parents_are_made_0755(tmp_path) -> None:
    layer = _unpack(tmp_path, _tar([{"name": "a/b/c/f", "data": b"1"}]))
    for d in ("a", "a/b", "a/b/c"):
        assert stat.S_IMODE(os.lstat(os.path.join(layer, d)).st_mode) == 0o755


@pytest.mark.parametrize("codec", ["plain", "gzip", "bzip2", "xz"])
def test_every_codec_unpacks_the_same(tmp_path, codec: str) -> None:
    raw = _tar([{"name": "etc/os", "data": b"ID=x\n"}])
    data = {"plain": raw, "gzip": gzip.compress(raw), "bzip2": bz2.compress(raw),
            "xz": lzma.compress(raw)}[codec]
    layer = _unpack(tmp_path, data)
    with open(os.path.join(layer, "etc/os"), "rb") as f:
        assert f.read() == b"ID=x\n"


def test_zstd_and_garbage_say_what_they_are(tmp_path) -> None:
    with pytest.raises(ImageError, match=r"^zstd-compressed layers are not supported here$"):
        _unpack(tmp_path, b"\x28\xb5\x2f\xfd" + b"\0" * 100)
    with pytest.raises(ImageError, match=r"^L: (not a readable tar layer|truncated or corrupt)"):
        _unpack(tmp_path, b"garbage" * 100)
    assert not os.path.exists(tmp_path / "layer")


def test_a_digest_is_checked_over_the_whole_stream(tmp_path) -> None:
    data = gzip.compress(_tar([{"name": "f", "data": b"1"}]))
    good = "sha256:" + hashlib.sha256(data).hexdigest()
    assert os.path.isdir(_unpack(tmp_path, data, expect=good))
    bad = "sha256:" + "0" * 64
    with pytest.raises(ImageError, match=rf"^L2: digest mismatch: got {good} \(truncated or "
                                         r"altered blob\)$"):
        (tmp_path / "tmp").mkdir(exist_ok=True)
        unpack(io.BytesIO(data), str(tmp_path / "tmp"), str(tmp_path / "l2"), "L2", bad,
               Budget(ImageLimits(min_free_bytes=0), str(tmp_path / "tmp")))
    assert not os.path.exists(tmp_path / "l2") and os.listdir(tmp_path / "tmp") == []


def test_a_member_cut_short_is_refused(tmp_path) -> None:
    raw = _tar([{"name": "f", "data": b"x" * 5000}])
    with pytest.raises(ImageError, match=r"^L: truncated or corrupt"):
        _unpack(tmp_path, raw[:512 + 2000])


def test_whiteouts_are_0_0_character_devices_with_no_mode(tmp_path) -> None:
    layer = _unpack(tmp_path, _tar([
        {"name": "a/x", "data": b"gone"}, {"name": "a/.wh.x"},  # over an entry of this layer
        {"name": "t/sub/f", "data": b"1"}, {"name": ".wh.t"},  # over a tree
        {"name": "new/deep/.wh.y"},  # parents made
    ]))
    for rel in ("a/x", "t", "new/deep/y"):
        st = os.lstat(os.path.join(layer, rel))
        assert stat.S_ISCHR(st.st_mode) and st.st_rdev == 0 and stat.S_IMODE(st.st_mode) == 0
    assert sorted(os.listdir(os.path.join(layer, "a"))) == ["x"]
    assert stat.S_IMODE(os.lstat(os.path.join(layer, "new/deep")).st_mode) == 0o755


def test_opaque_directories_get_the_overlay_xattr(tmp_path) -> None:
    layer = _unpack(tmp_path, _tar([{"name": "o/keep", "data": b"k"},
                                    {"name": "o/.wh..wh..opq"}, {"name": "p/q/.wh..wh..opq"},
                                    {"name": ".wh..wh..opq"}]))
    for d in ("o", "p/q", ""):
        assert os.getxattr(os.path.join(layer, d), "trusted.overlay.opaque") == b"y"
    assert os.listdir(os.path.join(layer, "o")) == ["keep"]
    assert not os.path.lexists(os.path.join(layer, "o/.wh..wh..opq"))


@pytest.mark.parametrize("name", [".wh.", "a/.wh.", "a/.wh..", "a/.wh..."])
def test_a_whiteout_of_nothing_is_refused(tmp_path, name: str) -> None:
    with pytest.raises(ImageError, match=rf"^L: whiteout '{name}' names nothing$"):
        _unpack(tmp_path, _tar([{"name": "a/f", "data": b"1"}, {"name": name}]))
    assert not os.path.exists(tmp_path / "layer")


def test_links_kept_and_refused(tmp_path) -> None:
    layer = _unpack(tmp_path, _tar([
        {"name": "a/b/up", "kind": "sym", "target": "../../x"},  # to the root: inside
        {"name": "a/abs", "kind": "sym", "target": "/usr/../etc"},
        {"name": "a/dot", "kind": "sym", "target": "./b/../b"},
    ]))
    assert os.readlink(os.path.join(layer, "a/b/up")) == "../../x"
    for i, target in enumerate(("../../x", "../../../x", "/../x")):
        with pytest.raises(ImageError, match=rf"^L: symlink 'a/l' -> '{target}' points "
                                             r"outside the image$"):
            (tmp_path / str(i)).mkdir()
            _unpack(tmp_path / str(i), _tar([{"name": "a/l", "kind": "sym", "target": target}]))
    assert link_inside("a/b/l", "../x") and link_inside("a/l", "..") and \
        not link_inside("l", "..") and link_inside("l", "/x/..") and \
        not link_inside("l", "/x/../..") and link_inside("l", "./.")


@pytest.mark.parametrize(("entries", "why"), [
    ([{"name": "d", "kind": "dir"}, {"name": "h", "kind": "hard", "target": "d"}],
     "hard link 'h' -> 'd' names no regular file of this layer"),
    ([{"name": "f"}, {"name": "s", "kind": "sym", "target": "f"},
      {"name": "h", "kind": "hard", "target": "s"}],
     "hard link 'h' -> 's' names no regular file of this layer"),
    ([{"name": "h", "kind": "hard", "target": "no/such"}],
     "hard link 'h' -> 'no/such' names no regular file of this layer"),
    ([{"name": "h", "kind": "hard", "target": "."}],
     "hard link 'h' -> '.' names no regular file of this layer"),
    ([{"name": "f", "data": b"1"}, {"name": "f/g", "data": b"2"}],
     "entry 'f/g' is under a non-directory 'f'"),
    ([{"name": "f", "data": b"1"}, {"name": "h", "kind": "hard", "target": "f/x"}],
     "entry 'f/x' is under a non-directory 'f'"),
    ([{"name": "a", "kind": "dir"}, {"name": "a/b", "kind": "sym", "target": "/etc"},
      {"name": "a/b/c", "data": b"1"}],
     "entry 'a/b/c' would be written through the symlink 'a/b'"),
    ([{"name": "a/b/c/.wh..wh..opq"}, {"name": "a/b", "kind": "sym", "target": "/etc"}],
     "entry 'a/b/c/.wh..wh..opq' would be written through the symlink 'a/b'"),
])
def test_bad_links_and_parents_name_the_entry(tmp_path, entries, why) -> None:
    with pytest.raises(ImageError, match="^L: " + why.replace(".", r"\.") + "$"):
        _unpack(tmp_path, _tar(entries))
    assert not os.path.exists(tmp_path / "layer")


def test_the_free_space_floors(tmp_path) -> None:
    data = _tar([{"name": "f", "data": b"1"}])
    st = os.statvfs(str(tmp_path))
    huge = st.f_bavail * st.f_frsize + (1 << 40)
    with pytest.raises(ImageTooLarge, match=rf"^L: the image cache's file system is nearly "
                                            rf"full \(it keeps {huge >> 20} MiB free\)$"):
        _unpack(tmp_path, data, ImageLimits(min_free_bytes=huge, min_free_inodes=0))
    with pytest.raises(ImageTooLarge, match=r"^L: the image cache's file system is nearly out "
                                            r"of inodes \(it keeps 10000000000 free\)$"):
        _unpack(tmp_path, data, ImageLimits(min_free_bytes=0, min_free_inodes=10**10))
    assert os.path.isdir(_unpack(tmp_path, data, ImageLimits(min_free_bytes=0,
                                                              min_free_inodes=0)))


def test_the_budget_at_its_edges(tmp_path) -> None:
    lim = ImageLimits(max_bytes=100, max_files=3, min_free_bytes=0, min_free_inodes=0)
    b = Budget(lim, str(tmp_path))
    b.charge(60, 1, "w")
    b.charge(40, 2, "w")  # exactly to both limits
    assert (b.bytes_left, b.files_left) == (0, 0)
    with pytest.raises(ImageTooLarge, match=r"^w: the image unpacks to more than it may "
                                            r"\(image_max_mb: 0 MiB\)$"):
        b.charge(1, 0, "w")
    with pytest.raises(ImageTooLarge, match=r"^w: the image has more entries than it may "
                                            r"\(image_max_files: 3\)$"):
        b.charge(0, 1, "w")
    assert Budget(lim, str(tmp_path), max_bytes=10).bytes_left == 10
    assert Budget(lim, str(tmp_path), max_bytes=1000).bytes_left == 100
    # the free space is looked at again after every 64 MiB (bytes + 16 KiB an entry) charged
    full = ImageLimits(min_free_bytes=1 << 60)
    b = Budget(full, str(tmp_path))
    b.charge((64 << 20) - 16384 - 1, 1, "w")
    with pytest.raises(ImageTooLarge, match="nearly full"):
        b.charge(1, 0, "w")


def test_the_ratio_at_its_edges() -> None:
    lim = ImageLimits(max_ratio=4, ratio_slack=1000)
    packed = Counted(io.BytesIO(b"p" * 10))
    packed.read(10)
    r = Ratio(io.BytesIO(b"u" * 2000), packed, lim, "w")
    assert len(r.read(1000)) == 1000  # within the slack
    with pytest.raises(ImageTooLarge, match=r"^w: the layer expands more than 4 times its "
                                            r"packed size \(a decompression bomb\?\)$"):
        r.read(1)  # 1001 > slack and > 4 x 10
    r = Ratio(io.BytesIO(b"u" * 2000), Counted(io.BytesIO(b"")), lim, "w")
    r.read(1000)
    with pytest.raises(ImageTooLarge):
        r.read(1)  # nothing packed read: counted as 1 byte
    packed = Counted(io.BytesIO(b"p" * 300))
    packed.read(300)
    r = Ratio(io.BytesIO(b"u" * 1200), packed, lim, "w")
    assert len(r.read(1200)) == 1200  # exactly 4 x 300: allowed
    assert (packed.n, r.n) == (300, 1200)


@pytest.mark.parametrize(("kw", "why"), [
    ({"max_files": -1}, "max_files must be an integer >= 0, got -1"),
    ({"max_bytes": True}, "max_bytes must be an integer >= 0, got True"),
    ({"ratio_slack": 1.5}, "ratio_slack must be an integer >= 0, got 1.5"),
    ({"max_ratio": 0.99}, "max_ratio must be a number >= 1, got 0.99"),
    ({"max_ratio": "5"}, "max_ratio must be a number >= 1, got '5'"),
])
def test_limits_name_a_bad_value(kw, why) -> None:
    with pytest.raises(ValueError, match="^image limit " + why.replace(".", r"\.") + "$"):
        ImageLimits(**kw)
    assert ImageLimits(max_ratio=1, max_files=0).max_files == 0


def test_what_an_unpack_charges_exactly(tmp_path) -> None:
    """Every entry made costs one (implicit parents, directories, links, whiteouts, opaque
    directories made), only regular files cost bytes, a leading './' stops nothing."""
    data = _tar([{"name": "./", "kind": "dir"},  # as `tar -C dir -cf x .` writes first
                 {"name": "a/b/f", "data": b"12345"},  # +a, +a/b (implicit), +f
                 {"name": "d", "kind": "dir"}, {"name": "l", "kind": "sym", "target": "a"},
                 {"name": "h", "kind": "hard", "target": "a/b/f"},
                 {"name": "w/x/.wh.gone"},  # +w, +w/x, +gone
                 {"name": "o/p/.wh..wh..opq"},  # +o, +o/p
                 {"name": "g", "data": b"xy"}])
    (tmp_path / "tmp").mkdir()
    lim = ImageLimits(max_bytes=1000, max_files=100, min_free_bytes=0, min_free_inodes=0)
    b = Budget(lim, str(tmp_path / "tmp"))
    unpack(io.BytesIO(data), str(tmp_path / "tmp"), str(tmp_path / "layer"), "L", None, b)
    assert (1000 - b.bytes_left, 100 - b.files_left) == (7, 12)
    assert os.path.isfile(tmp_path / "layer/g")  # entries after './' were extracted
    (tmp_path / "x").mkdir()
    exact = ImageLimits(max_files=12, min_free_bytes=0, min_free_inodes=0)
    assert os.path.isdir(_unpack(tmp_path / "x", data, exact))
    (tmp_path / "y").mkdir()
    with pytest.raises(ImageTooLarge, match=r"^L: the image has more entries than it may "
                                            r"\(image_max_files: 11\)$"):
        _unpack(tmp_path / "y", data, ImageLimits(max_files=11, min_free_bytes=0,
                                                  min_free_inodes=0))
    (tmp_path / "z").mkdir()
    with pytest.raises(ImageTooLarge, match=r"^L: the image unpacks to more than it may"):
        _unpack(tmp_path / "z", data, ImageLimits(max_bytes=6, min_free_bytes=0,
                                                  min_free_inodes=0))


def test_an_unpack_that_cannot_rename_says_why_without_a_path(tmp_path) -> None:
    (tmp_path / "tmp").mkdir()
    (tmp_path / "layer").write_text("a file where the layer goes")
    with pytest.raises(ImageError, match=r"^L: cannot unpack: Not a directory$"):
        unpack(io.BytesIO(_tar([{"name": "f"}])), str(tmp_path / "tmp"),
               str(tmp_path / "layer"), "L", None,
               Budget(ImageLimits(min_free_bytes=0), str(tmp_path / "tmp")))
    assert os.listdir(tmp_path / "tmp") == []


def test_names_and_types(tmp_path) -> None:
    from arl_tangram.managers.cpu.images.extract import safe_rel

    assert safe_rel("./a//./b/", "w") == "a/b" and safe_rel(".", "w") == ""
    with pytest.raises(ImageError, match=r"^w: entry 'a\\x00b' has a NUL byte$"):
        safe_rel("a\x00b", "w")
    assert not link_inside("a/l", "./../..") and link_inside("a/l", "./..")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        ti = tarfile.TarInfo("v")
        ti.type = b"V"  # a volume header: no file of an image
        tf.addfile(ti)
    with pytest.raises(ImageError, match=r"^L: entry 'v' has an unsupported type b'V'$"):
        _unpack(tmp_path, buf.getvalue())


def test_the_packed_count_is_the_sum_of_reads_and_an_empty_one_counts_as_one() -> None:
    packed = Counted(io.BytesIO(b"p" * 10))
    packed.read(4)
    packed.read(6)
    assert packed.n == 10
    lim = ImageLimits(max_ratio=4, ratio_slack=0)
    r = Ratio(io.BytesIO(b"u" * 100), Counted(io.BytesIO(b"")), lim, "w")
    assert len(r.read(4)) == 4  # 4 x max(0, 1)
    with pytest.raises(ImageTooLarge):
        r.read(1)


def test_the_free_space_is_checked_again_and_again(tmp_path) -> None:
    b = Budget(ImageLimits(min_free_bytes=0, min_free_inodes=0), str(tmp_path))
    for _ in range(3):  # three periodic checks, each after 64 MiB
        b.charge(64 << 20, 0, "w")
    assert b.bytes_left == (16 << 30) - (192 << 20)
    b = Budget(ImageLimits(min_free_bytes=1 << 60), str(tmp_path))
    with pytest.raises(ImageTooLarge, match=r"^w: the image cache's file system is nearly full"):
        b.charge(64 << 20, 0, "w")


@pytest.mark.parametrize(("entries", "files"), [
    ([{"name": "f"}, {"name": "h", "kind": "hard", "target": "f"}], 1),  # at the hard link
    ([{"name": "f"}, {"name": "d", "kind": "dir"}], 1),  # at a directory
    ([{"name": "f"}, {"name": "s", "kind": "sym", "target": "f"}], 1),  # at a symlink
    ([{"name": "f"}, {"name": ".wh.g"}], 1),  # at a whiteout
])
def test_the_entry_past_max_files_is_named_by_its_archive(tmp_path, entries, files) -> None:
    with pytest.raises(ImageTooLarge, match=rf"^L: the image has more entries than it may "
                                            rf"\(image_max_files: {files}\)$"):
        _unpack(tmp_path, _tar(entries), ImageLimits(max_files=files, min_free_bytes=0,
                                                     min_free_inodes=0))
