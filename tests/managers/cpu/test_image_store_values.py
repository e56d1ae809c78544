"""Exact values of the node's image cache (`images/store.py`, issue 43): the record's fields,
the cache's directories and modes, users and their flocks, the in-use and missing-layer
messages, the digest of an image, the budgets an import gets (caps and reasons), pulled records,
layer keys and `_du`."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys

import pytest

from arl_tangram.managers.cpu.images import imagekit
from arl_tangram.managers.cpu.images import store as store_mod
from arl_tangram.managers.cpu.images.extract import ImageLimits
from arl_tangram.managers.cpu.images.store import (
    Image,
    ImageError,
    ImageInUse,
    ImageStore,
    check_layer_key,
    owner_of,
)

pytestmark = pytest.mark.needs_root

KEY = "sha256-" + "0" * 64


def _rootfs(tmp_path, name: str, files: dict[str, bytes]) -> str:
    d = tmp_path / name
    d.mkdir()
    for rel, data in files.items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return str(d)


def test_owner_of() -> None:
    assert owner_of("t1+img") == "t1"
    assert owner_of("t1+a+b") == "t1"
    assert owner_of("img") == ""
    assert owner_of("+img") == ""
    assert store_mod.OWNER_SEP == "+"


def test_image_record_round_trip_and_defaults() -> None:
    img = Image(
        "n",
        "sha256:d",
        ["l1", "l2"],
        {"Env": ["A=1"]},
        "/src",
        "oci-dir",
        12,
        imported_at=5.5,
        import_s=0.25,
        layer_sizes=[4, 8],
    )
    d = img.to_dict()
    assert d == {
        "name": "n",
        "digest": "sha256:d",
        "layers": ["l1", "l2"],
        "config": {"Env": ["A=1"]},
        "source": "/src",
        "format": "oci-dir",
        "size": 12,
        "imported_at": 5.5,
        "import_s": 0.25,
        "layer_sizes": [4, 8],
    }
    assert d["layers"] is not img.layers and d["layer_sizes"] is not img.layer_sizes
    back = Image.from_dict(d)
    assert back == img
    bare = Image.from_dict({"name": "m", "digest": "x", "layers": ("a",), "config": None})
    assert (
        bare.name,
        bare.digest,
        bare.layers,
        bare.config,
        bare.source,
        bare.fmt,
        bare.size,
        bare.imported_at,
        bare.import_s,
        bare.layer_sizes,
    ) == ("m", "x", ["a"], {}, "", "", 0, 0.0, 0.0, [])
    typed = Image.from_dict(
        {
            "name": "m",
            "digest": "x",
            "layers": [],
            "size": "7",
            "imported_at": "1",
            "import_s": 2,
            "layer_sizes": ["3"],
        }
    )
    assert (typed.size, typed.imported_at, typed.import_s, typed.layer_sizes) == (7, 1.0, 2.0, [3])
    assert type(typed.imported_at) is float and type(typed.import_s) is float
    fresh = Image("n", "d", [], {}, "", "", 0)
    assert fresh.import_s == 0.0 and fresh.layer_sizes == [] and fresh.imported_at > 1e9


def test_the_cache_is_made_at_the_first_import_with_mode_0700(tmp_path) -> None:
    root = tmp_path / "cache"
    st = ImageStore(str(root))
    assert not root.exists()  # nothing before an import
    assert st.root == os.path.realpath(str(root))
    assert (st.layers_dir, st.images_dir, st.tmp_dir) == tuple(
        os.path.join(st.root, x) for x in ("layers", "images", "tmp")
    )
    assert st.list_images() == []
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    st._ensure()
    for d in (st.root, st.layers_dir, st.images_dir, st.tmp_dir):
        assert os.stat(d).st_mode & 0o7777 == 0o700, d
    assert st.limits == ImageLimits() and st.owner_max_bytes == 0 and st.max_total_bytes == 0


def test_an_import_killed_part_way_leaves_nothing_in_tmp(tmp_path) -> None:
    st = ImageStore(str(tmp_path / "c"))
    st._ensure()
    os.makedirs(os.path.join(st.tmp_dir, "half", "deep"))
    with open(os.path.join(st.tmp_dir, "half", "deep", "f"), "w") as f:
        f.write("x")
    os.makedirs(os.path.join(st.tmp_dir, "other"))
    ImageStore(str(tmp_path / "c"))
    assert os.listdir(st.tmp_dir) == []


def test_import_records_digest_sizes_source_and_format(tmp_path) -> None:
    src = _rootfs(tmp_path, "r", {"a": b"12345", "d/b": b"xy"})
    os.symlink("a", os.path.join(src, "ln"))
    st = ImageStore(str(tmp_path / "c"))
    img = st.import_path(os.path.relpath(src), "im")
    assert img.source == src and img.fmt == "rootfs-dir"
    assert img.size == 7 and img.layer_sizes == [7]
    assert len(img.layers) == 1 and check_layer_key(img.layers[0]) == img.layers[0]
    want = (
        "sha256:"
        + hashlib.sha256(json.dumps([img.layers, img.config], sort_keys=True).encode()).hexdigest()
    )
    assert img.digest == want
    assert 0 <= img.import_s < 30 and round(img.import_s, 6) == img.import_s
    with open(st._record("im")) as f:
        assert json.load(f) == img.to_dict()
    assert st.get("im") == img
    assert st.has("im") and not st.has("other")
    assert os.listdir(st.images_dir) == ["im.json"]  # no .tmp left
    assert st.layer_path(img.layers[0]) == os.path.join(st.layers_dir, img.layers[0])
    assert st.has_layer(img.layers[0]) and not st.has_layer(KEY)


def test_layer_paths_are_top_first(tmp_path) -> None:
    st = ImageStore(str(tmp_path / "c"))
    img = Image("x", "d", ["a", "b", "c"], {}, "", "", 0)
    assert st.layer_paths(img) == [os.path.join(st.layers_dir, k) for k in ("c", "b", "a")]


def test_import_refusals_name_the_reason(tmp_path) -> None:
    st = ImageStore(str(tmp_path / "c"))
    missing = str(tmp_path / "nope")
    with pytest.raises(ImageError) as e:
        st.import_path(missing, "a")
    assert str(e.value) == f"{missing}: no such file or directory"
    src = _rootfs(tmp_path, "r", {"a": b"1"})
    st.import_path(src, "a")
    with pytest.raises(ImageError) as e:
        st.import_path(src, "a", replace=False)
    assert str(e.value) == "image 'a' exists"
    st.import_path(src, "a")  # replace=True by default
    with pytest.raises(ImageError) as e:
        st.get("zz")
    assert str(e.value) == "no image 'zz' on this node"


def test_a_refused_import_leaves_no_layer(tmp_path) -> None:
    src = _rootfs(tmp_path, "r", {"a": b"x" * 5000})
    st = ImageStore(str(tmp_path / "c"), ImageLimits(max_bytes=4096))
    with pytest.raises(ImageError):
        st.import_path(src, "a")
    assert os.listdir(st.layers_dir) == [] and os.listdir(st.tmp_dir) == []


def test_users_hold_a_shared_flock_until_the_last_release(tmp_path) -> None:
    st = ImageStore(str(tmp_path / "c"))
    st.import_path(_rootfs(tmp_path, "r", {"a": b"1"}), "a")
    img = st.acquire("a")
    assert img.name == "a" and st.users("a") == 1
    fd = st._held["a"]
    assert os.get_inheritable(fd) is False
    assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
    st.acquire("a")
    assert st.users("a") == 2 and st._held["a"] == fd  # one flock for all users
    # another process cannot take it exclusively, but can share it
    probe = (
        "import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY)\n"
        "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('ex')\n"
        "except BlockingIOError:\n    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB); print('sh')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, st._record("a")], capture_output=True, text=True
    )
    assert out.stdout.strip() == "sh"
    with pytest.raises(ImageInUse) as e:
        st.remove("a")
    assert (
        str(e.value)
        == "image 'a' is in use by 2 session(s)/action(s) on this node; close them first"
    )
    st.release("a")
    assert st.users("a") == 1 and "a" in st._held
    st.release("a")
    assert st.users("a") == 0 and st._held == {} and st._users == {}
    with pytest.raises(OSError):
        os.fstat(fd)
    out = subprocess.run(
        [sys.executable, "-c", probe, st._record("a")], capture_output=True, text=True
    )
    assert out.stdout.strip() == "ex"
    st.release("a")  # one too many: nothing
    assert st._users == {}
    assert st.remove("a").name == "a"


def test_an_image_another_process_holds_cannot_be_removed_or_replaced(tmp_path) -> None:
    st = ImageStore(str(tmp_path / "c"))
    src = _rootfs(tmp_path, "r", {"a": b"1"})
    st.import_path(src, "a")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY)\n"
            "fcntl.flock(fd, fcntl.LOCK_SH)\nprint('held', flush=True)\nsys.stdin.read()\n",
            st._record("a"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ImageInUse) as e:
            st.remove("a")
        assert (
            str(e.value)
            == "image 'a' is in use by a running service on this node; close them first"
        )
        with pytest.raises(ImageInUse) as e:
            st.import_path(src, "a")
        assert str(e.value) == (
            "image 'a' is in use by a running service on this node; it cannot be replaced now"
        )
        st.acquire("a")
        with pytest.raises(ImageInUse) as e:
            st.import_path(src, "a")
        assert str(e.value) == (
            "image 'a' is in use by 1 session(s)/action(s) on this node; it cannot be replaced now"
        )
        st.release("a")
    finally:
        holder.stdin.close()
        holder.wait(10)
    assert st.remove("a").name == "a" and not st.has("a")


def test_remove_keeps_shared_layers_and_drops_the_rest(tmp_path) -> None:
    st = ImageStore(str(tmp_path / "c"))
    a = st.import_path(_rootfs(tmp_path, "ra", {"a": b"1"}), "a")
    b = st.import_path(_rootfs(tmp_path, "rb", {"b": b"2"}), "b")
    st._write_record(Image("both", "d", a.layers + b.layers, {}, "", "", 0))
    st.remove("a")
    assert sorted(os.listdir(st.layers_dir)) == sorted(a.layers + b.layers)
    st.remove("both")
    assert os.listdir(st.layers_dir) == b.layers
    assert os.listdir(st.tmp_dir) == []  # (renamed into tmp/ then removed)
    st.remove("b")
    assert os.listdir(st.layers_dir) == [] and st.list_images() == []


def test_rmtree_renames_into_tmp_first(tmp_path, monkeypatch) -> None:
    st = ImageStore(str(tmp_path / "c"))
    st._ensure()
    st._rmtree(os.path.join(st.layers_dir, "absent"))  # nothing there: nothing done
    assert os.listdir(st.tmp_dir) == []
    os.makedirs(os.path.join(st.layers_dir, "k", "sub"))
    renamed = []
    real = os.rename
    monkeypatch.setattr(store_mod.os, "rename", lambda s, d: renamed.append((s, d)) or real(s, d))
    st._rmtree(os.path.join(st.layers_dir, "k"))
    ((s, d),) = renamed
    assert s == os.path.join(st.layers_dir, "k")
    assert os.path.dirname(os.path.dirname(d)) == st.tmp_dir and os.path.basename(d) == "x"
    assert os.path.basename(os.path.dirname(d)).startswith("rm-")
    assert os.listdir(st.tmp_dir) == [] and os.listdir(st.layers_dir) == []
    os.symlink("/nonexistent", os.path.join(st.layers_dir, "dangling"))
    st._rmtree(os.path.join(st.layers_dir, "dangling"))  # a link counts (lexists)
    assert os.listdir(st.layers_dir) == []


def test_replacing_an_image_drops_the_layers_only_its_old_version_used(tmp_path) -> None:
    st = ImageStore(str(tmp_path / "c"))
    old = st.import_path(_rootfs(tmp_path, "r1", {"a": b"1"}), "a")
    keep = st.import_path(_rootfs(tmp_path, "r0", {"k": b"k"}), "keep")
    st._write_record(Image("a", "d", old.layers + keep.layers, {}, "", "", 0))
    new = st.import_path(_rootfs(tmp_path, "r2", {"a": b"2"}), "a")
    assert sorted(os.listdir(st.layers_dir)) == sorted(new.layers + keep.layers)
    assert st.get("a").layers == new.layers


def test_a_record_naming_a_missing_layer_is_refused(tmp_path) -> None:
    st = ImageStore(str(tmp_path / "c"))
    st._ensure()
    k2 = "sha256-" + "1" * 64
    os.makedirs(st.layer_path(KEY))
    with pytest.raises(ImageError) as e:
        st._write_record(Image("a", "d", [KEY, k2, "sha256-" + "2" * 64], {}, "", "", 0))
    assert str(e.value) == f"image 'a': layer(s) {k2}, sha256-{'2' * 64} missing"
    assert not st.has("a")


def test_list_images_is_sorted_and_skips_what_is_not_a_record(tmp_path) -> None:
    st = ImageStore(str(tmp_path / "c"))
    st._ensure()
    for n in ("b", "a", "c"):
        with open(os.path.join(st.images_dir, n + ".json"), "w") as f:
            json.dump(Image(n, "d", [], {}, "", "", 0).to_dict(), f)
    with open(os.path.join(st.images_dir, "bad.json"), "w") as f:
        f.write("{")
    with open(os.path.join(st.images_dir, "nokey.json"), "w") as f:
        f.write("{}")
    with open(os.path.join(st.images_dir, "x.txt"), "w") as f:
        f.write("{}")
    os.mkdir(os.path.join(st.images_dir, "dir.json"))
    with open(os.path.join(st.images_dir, "Bad Name.json"), "w") as f:
        f.write("{}")
    assert [i.name for i in st.list_images()] == ["a", "b", "c"]


def test_budget_for_caps_by_owner_and_by_cache(tmp_path) -> None:
    MiB = 1 << 20
    lim = ImageLimits(max_bytes=100 * MiB)
    st = ImageStore(str(tmp_path / "c"), lim)
    b = st.budget_for("t+x")
    assert (b.bytes_left, b.why) == (100 * MiB, "image_max_mb: 100 MiB")
    st._ensure()
    recs = [
        Image("t+a", "d", ["l1", "l2"], {}, "", "", 30 * MiB, layer_sizes=[10 * MiB, 20 * MiB]),
        Image("t+b", "d", ["l2", "l3"], {}, "", "", 25 * MiB, layer_sizes=[20 * MiB, 5 * MiB]),
        Image("u+c", "d", ["l4"], {}, "", "", 7 * MiB, layer_sizes=[7 * MiB]),
        Image("s", "d", ["l5"], {}, "", "", 3 * MiB, layer_sizes=[3 * MiB]),
    ]
    for r in recs:
        with open(st._record(r.name), "w") as f:
            json.dump(r.to_dict(), f)
    st.owner_max_bytes = 80 * MiB
    b = st.budget_for("t+x")  # 80 - 55 = 25
    assert (b.bytes_left, b.why) == (
        25 * MiB,
        "tenant 't''s images may hold 80 MiB in all (image_tenant_max_mb)",
    )
    b = st.budget_for("t+a")  # its own older version not counted: 80 - 25
    assert b.bytes_left == 55 * MiB
    b = st.budget_for("plain")
    assert (b.bytes_left, b.why) == (
        77 * MiB,
        "the shared images may hold 80 MiB in all (image_tenant_max_mb)",
    )
    st.owner_max_bytes = 20 * MiB
    assert st.budget_for("t+x").bytes_left == 0  # never negative
    st.owner_max_bytes = 155 * MiB  # 155 - 55 = 100: not below the per-image cap
    b = st.budget_for("t+x")
    assert (b.bytes_left, b.why) == (100 * MiB, "image_max_mb: 100 MiB")
    st.owner_max_bytes = 154 * MiB
    assert st.budget_for("t+x").bytes_left == 99 * MiB
    st.owner_max_bytes = 0
    st.max_total_bytes = 120 * MiB  # layers: 10 + 20 + 5 + 7 + 3 = 45 (l2 once)
    b = st.budget_for("t+x")
    assert (b.bytes_left, b.why) == (75 * MiB, "the cache may hold 120 MiB (image_store_max_mb)")
    st.max_total_bytes = 145 * MiB
    b = st.budget_for("t+x")
    assert (b.bytes_left, b.why) == (100 * MiB, "image_max_mb: 100 MiB")
    st.max_total_bytes = 144 * MiB
    assert st.budget_for("t+x").bytes_left == 99 * MiB
    st.max_total_bytes = 40 * MiB
    assert st.budget_for("t+x").bytes_left == 0
    st.owner_max_bytes, st.max_total_bytes = 80 * MiB, 100 * MiB  # both: the smaller wins
    b = st.budget_for("t+x")
    assert (b.bytes_left, b.why) == (
        25 * MiB,
        "tenant 't''s images may hold 80 MiB in all (image_tenant_max_mb)",
    )
    st.max_total_bytes = 60 * MiB
    b = st.budget_for("t+x")
    assert (b.bytes_left, b.why) == (15 * MiB, "the cache may hold 60 MiB (image_store_max_mb)")
    assert b.fs_path == st.tmp_dir and b.limits is lim


def test_budget_for_with_a_record_missing_sizes(tmp_path) -> None:
    MiB = 1 << 20
    st = ImageStore(str(tmp_path / "c"), ImageLimits(max_bytes=100 * MiB), max_total_bytes=50 * MiB)
    st._ensure()
    r = Image("a", "d", ["l1", "l2"], {}, "", "", 0, layer_sizes=[10 * MiB])
    with open(st._record("a"), "w") as f:
        json.dump(r.to_dict(), f)
    assert st.budget_for("b").bytes_left == 40 * MiB  # zip stops at the shorter


def test_check_layer_key() -> None:
    assert check_layer_key(KEY) == KEY
    for bad in (
        "sha256-" + "0" * 63,
        "sha256-" + "0" * 65,
        "sha256-" + "A" * 64,
        "x" + KEY,
        KEY + "\n",
        "sha512-" + "0" * 64,
        5,
        None,
    ):
        with pytest.raises(ImageError) as e:
            check_layer_key(bad)  # type: ignore[arg-type]
        assert str(e.value) == f"not a layer key: {bad!r}"


def test_du_counts_regular_files_only(tmp_path) -> None:
    d = tmp_path / "d"
    (d / "s").mkdir(parents=True)
    (d / "a").write_bytes(b"x" * 10)
    (d / "s" / "b").write_bytes(b"y" * 5)
    os.symlink("a" * 50, d / "ln")
    os.mkfifo(d / "fifo")
    assert store_mod._du(str(d)) == 15
    assert store_mod._du(str(tmp_path / "absent")) == 0


def test_a_layer_goes_out_and_comes_back_in_through_a_spool(tmp_path, monkeypatch) -> None:
    st = ImageStore(str(tmp_path / "c"))
    img = st.import_path(_rootfs(tmp_path, "r", {"a": b"hello", "d/b": b"xy"}), "src+img")
    (key,) = img.layers
    from arl_tangram.managers.cpu.images import transfer

    dflt = st.open_layer(key)
    assert dflt.chunk == transfer.CHUNK_BYTES and dflt.root == st.layer_path(key)
    dflt.close()
    out = st.open_layer(key, 1 << 16)
    assert out.chunk == 1 << 16
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", "/nonexistent-t53")  # nothing made outside the cache
    other = ImageStore(str(tmp_path / "c2"))
    spool = other.new_spool()
    assert os.stat(other.root).st_mode & 0o777 == 0o700
    assert os.path.dirname(spool.path) == other.tmp_dir
    for chunk in iter(out.next, b""):
        spool.write(chunk)
    other.finish_layer(spool, key, out.digest, "peer")
    assert other.has_layer(key)
    # a layer past the receiving cache's per-import limit is refused
    small = ImageStore(str(tmp_path / "c3"), ImageLimits(max_bytes=6))
    sp = small.new_spool()
    out = st.open_layer(key)
    for chunk in iter(out.next, b""):
        sp.write(chunk)
    with pytest.raises(ImageError) as e:
        small.finish_layer(sp, key, out.digest, "peer")
    assert str(e.value).startswith("peer")
    assert "unpacks to more than it may (image_max_mb: 0 MiB)" in str(e.value)
    assert not small.has_layer(key)
    rec = img.to_dict()
    rec["layer_sizes"] = []
    got = other.add_pulled(rec, "peer:1", 1.23456789)
    assert (got.source, got.import_s, got.layer_sizes, got.size) == ("peer:1", 1.234568, [7], 7)
    assert got.imported_at >= img.imported_at
    assert other.get("src+img").to_dict() == got.to_dict()
    rec["layer_sizes"] = [99]
    assert other.add_pulled(rec, "p", 0).layer_sizes == [99]  # as the peer said
    with pytest.raises(ImageError) as e:
        st.open_layer("../x")
    assert str(e.value) == "not a layer key: '../x'"
    with pytest.raises(ImageError):
        other.add_pulled({**rec, "layers": ["../etc"]}, "p", 0)
    with pytest.raises(ImageError):
        other.add_pulled({**rec, "name": "bad name"}, "p", 0)
    with pytest.raises(ImageError) as e:
        other.finish_layer(other.new_spool(), "nope", "d", "w")
    assert str(e.value) == "not a layer key: 'nope'"


def test_an_import_through_imagekit_layouts_counts_the_layers_it_made(tmp_path) -> None:
    base = _rootfs(tmp_path, "b", {"etc/x": b"x"})
    tar = imagekit.pack_layer(base, str(tmp_path / "b.tar"))
    lay = imagekit.write_oci_layout(str(tmp_path / "oci"), [tar], {"Env": ["A=1"]})
    st = ImageStore(str(tmp_path / "c"))
    job = store_mod._Import(st, st.budget_for("i"))
    assert job.made == [] and job.tmp_dir == st.tmp_dir and job.store is st
    st._ensure()
    from arl_tangram.managers.cpu.images import archives

    fmt, (keys, config) = archives.read(lay, job)
    assert fmt == "oci-dir" and config == {"Env": ["A=1"]} and job.made == keys
    assert job.has_layer(keys[0]) is True


def test_a_pulled_record_cannot_replace_an_image_in_use(tmp_path) -> None:
    st = ImageStore(str(tmp_path / "c"))
    img = st.import_path(_rootfs(tmp_path, "r", {"a": b"1"}), "a")
    st.acquire("a")
    with pytest.raises(ImageInUse) as e:
        st.add_pulled(img.to_dict(), "peer", 0.5)
    assert str(e.value) == (
        "image 'a' is in use by 1 session(s)/action(s) on this node; it cannot be replaced now"
    )
    st.release("a")


def test_the_digest_sorts_the_configs_keys_and_the_import_time_is_measured(
    tmp_path, monkeypatch
) -> None:
    import tempfile

    base = _rootfs(tmp_path, "b", {"x": b"x"})
    tar = imagekit.pack_layer(base, str(tmp_path / "b.tar"))
    cfg = {"WorkingDir": "/w", "Env": ["A=1"], "Cmd": ["sh"]}  # not in sorted order
    lay = imagekit.write_oci_layout(str(tmp_path / "oci"), [tar], cfg)
    monkeypatch.setattr(tempfile, "tempdir", "/nonexistent-t53")  # nothing made outside the cache
    st = ImageStore(str(tmp_path / "c"))
    img = st.import_path(lay, "i")
    assert list(img.config) != sorted(img.config)  # (as the reader keeps it: not sorted)
    want = (
        "sha256:"
        + hashlib.sha256(
            json.dumps([img.layers, {"Cmd": ["sh"], "Env": ["A=1"], "WorkingDir": "/w"}]).encode()
        ).hexdigest()
    )
    assert img.digest == want
    assert 0 < img.import_s < 6 and round(img.import_s, 6) == img.import_s
