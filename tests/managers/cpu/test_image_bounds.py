"""What an import may expand to is bounded (issue 35, H4): a gzip bomb, an inode bomb, sparse
members (a docker-archive's layer, its manifest), metadata read into memory, a tenant's total
and the cache's: each refused with `ImageTooLarge` (413 over HTTP) naming the bound, at once,
and nothing of the import kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from arl_tangram.managers.cpu.images import imagekit
from arl_tangram.managers.cpu.images.extract import ImageLimits
from arl_tangram.managers.cpu.images.store import ImageStore, ImageTooLarge, owner_of

pytestmark = pytest.mark.needs_root


def _empty(store: ImageStore) -> None:
    assert os.listdir(store.tmp_dir) == [] and os.listdir(store.layers_dir) == []
    assert store.list_images() == []


def _wchar() -> int:
    """Bytes this process has passed to write(2) so far."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


def test_a_gzip_bomb_stops_at_the_ratio_with_the_default_limits(tmp_path) -> None:
    """11 GiB of zeros in 11 MB: refused once the unpacked stream passes 200x what was read
    (past the first 64 MiB), not after writing 11 GiB."""
    bomb = imagekit.gzip_bomb(str(tmp_path / "bomb.tar.gz"), 11)
    assert os.path.getsize(bomb) < 16 << 20
    store = ImageStore(str(tmp_path / "cache"))
    store._ensure()
    written = _wchar()
    with pytest.raises(ImageTooLarge, match=r"expands more than 200 times its packed size"):
        store.import_path(bomb, "bomb")
    assert _wchar() - written < 256 << 20  # bytes this process wrote: not 11 GiB
    _empty(store)


def test_an_inode_bomb_stops_at_max_files(tmp_path) -> None:
    bomb = imagekit.inode_bomb(str(tmp_path / "inodes.tar.gz"), 3000)
    store = ImageStore(str(tmp_path / "cache"), ImageLimits(max_files=1000))
    with pytest.raises(ImageTooLarge, match=r"more entries than it may \(image_max_files: 1000\)"):
        store.import_path(bomb, "inodes")
    _empty(store)  # (the file system's free inodes move with whatever else runs: not asserted)
    assert sum(len(fs) + len(ds) for _, ds, fs in os.walk(store.root)) == 3  # its 3 folders
    ok = imagekit.inode_bomb(str(tmp_path / "ok.tar.gz"), 998)  # 998 files + the directory f
    assert store.import_path(ok, "ok").layers


def test_bytes_past_max_bytes_are_refused(tmp_path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(os.urandom(3 << 20))
    (src / "b").write_bytes(os.urandom(3 << 20))
    tar = imagekit.pack_layer(str(src), str(tmp_path / "l.tar"))
    store = ImageStore(str(tmp_path / "cache"), ImageLimits(max_bytes=5 << 20))
    with pytest.raises(ImageTooLarge, match=r"unpacks to more than it may \(image_max_mb: 5 MiB\)"):
        store.import_path(tar, "big")
    _empty(store)
    assert ImageStore(str(tmp_path / "cache2"), ImageLimits(max_bytes=7 << 20)).import_path(
        tar, "fits").size == 6 << 20


@pytest.mark.parametrize("member", ["layer", "manifest.json"])
def test_sparse_members_of_a_docker_archive_are_refused_unread(tmp_path, member: str) -> None:
    """A 10 KB docker-archive whose layer (3 GiB) or manifest.json (2 GiB) is a sparse member:
    refused before a byte of it is spooled or read, in a process that stays small."""
    arc = imagekit.sparse_docker_archive(str(tmp_path / "d.tar"), member,
                                         3 if member == "layer" else 2)
    assert os.path.getsize(arc) < 64 << 10
    cache = str(tmp_path / "cache")
    probe = (
        "import sys\n"
        "from arl_tangram.managers.cpu.images.store import ImageStore, ImageTooLarge\n"
        "s = ImageStore(sys.argv[1])\n"
        "try:\n"
        "    s.import_path(sys.argv[2], 'sparse')\n"
        "    print('imported')\n"
        "except ImageTooLarge as e:\n"
        "    print('refused:', e)\n"
        "print([ln for ln in open('/proc/self/io') if ln.startswith('wchar')][0].strip())\n"
        "print([ln for ln in open('/proc/self/status') if ln.startswith('VmHWM')][0].strip())\n")
    out = subprocess.run([sys.executable, "-c", probe, cache, arc], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "ARL_TANGRAM_PURE": "1"})
    lines = out.stdout.splitlines()
    assert lines and lines[0].startswith("refused:"), (out.stdout, out.stderr[-2000:])
    assert "is a sparse member of" in lines[0]
    assert "(refused: it would expand past what the archive holds)" in lines[0]
    # (VmHWM: this process's own peak; ru_maxrss keeps the forking parent's across exec)
    assert int(lines[-1].split()[1]) < 400_000  # KB: not the 2 GiB the member declares
    assert int(lines[-2].split()[1]) < 16 << 20  # bytes written: nothing spooled
    _empty(ImageStore(cache))


def test_a_sparse_file_inside_a_layer_is_refused(tmp_path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "hole", "wb") as f:
        f.truncate(200 << 30)
    arc = str(tmp_path / "sparse.tar")
    subprocess.run(["tar", "--sparse", "--format=gnu", "-cf", arc, "-C", str(src), "hole"],
                   check=True)
    store = ImageStore(str(tmp_path / "cache"))
    with pytest.raises(ImageTooLarge, match=r"entry 'hole' is a sparse file of 214748364800 "
                                            r"bytes \(refused: it would expand past what the "
                                            r"archive holds\)$"):
        store.import_path(arc, "holes")
    _empty(store)


def test_metadata_is_read_with_a_cap(tmp_path) -> None:
    layout = tmp_path / "oci"
    base = tmp_path / "base"
    (base / "etc").mkdir(parents=True)
    (base / "etc" / "x").write_text("x")
    imagekit.write_oci_layout(str(layout), [imagekit.pack_layer(str(base),
                                                                str(tmp_path / "b.tar"))])
    idx = json.loads((layout / "index.json").read_text())
    idx["annotations"] = {"pad": "x" * (2 << 20)}
    (layout / "index.json").write_text(json.dumps(idx))
    store = ImageStore(str(tmp_path / "cache"), ImageLimits(max_meta_bytes=1 << 20))
    with pytest.raises(ImageTooLarge, match=r"index.json is larger than 1048576 bytes"):
        store.import_path(str(layout), "meta")
    _empty(store)
    assert ImageStore(str(tmp_path / "c2")).import_path(str(layout), "meta").fmt == "oci-dir"


def test_a_refused_import_leaves_none_of_its_layers(tmp_path) -> None:
    """Layer 1 unpacks, layer 2 passes the bound: layer 1 is removed with the refusal."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "ok").write_text("fine")
    good = imagekit.pack_layer(str(src), str(tmp_path / "good.tar"))
    many = imagekit.inode_bomb(str(tmp_path / "many.tar.gz"), 50)
    arc = imagekit.write_docker_archive(str(tmp_path / "d.tar"), [good, many])
    store = ImageStore(str(tmp_path / "cache"), ImageLimits(max_files=20))
    with pytest.raises(ImageTooLarge, match=r"more entries than it may \(image_max_files: 20\)"):
        store.import_path(arc, "two")
    _empty(store)


def _random_layer(tmp_path, name: str) -> str:
    """A layer tar of one 3 MiB file of random bytes (every call another layer)."""
    src = tmp_path / f"src-{name}"
    src.mkdir()
    (src / "data").write_bytes(os.urandom(3 << 20))
    return imagekit.pack_layer(str(src), str(tmp_path / f"{name}.tar"))


def test_a_tenants_images_share_one_total(tmp_path) -> None:
    tar, tar2 = _random_layer(tmp_path, "a"), _random_layer(tmp_path, "b")
    store = ImageStore(str(tmp_path / "cache"), owner_max_bytes=5 << 20)
    assert owner_of("alice+a") == "alice" and owner_of("shared") == ""
    store.import_path(tar, "alice+a")
    with pytest.raises(ImageTooLarge, match=r"tenant 'alice''s images may hold 5 MiB in all "
                                            r"\(image_tenant_max_mb\)"):
        store.import_path(tar2, "alice+b")
    assert [i.name for i in store.list_images()] == ["alice+a"]
    assert len(os.listdir(store.layers_dir)) == 1 and os.listdir(store.tmp_dir) == []
    store.import_path(tar2, "bob+b")  # another tenant's total is its own
    store.import_path(tar2, "alice+a")  # a replaced version does not count against itself
    assert sorted(i.name for i in store.list_images()) == ["alice+a", "bob+b"]


def test_the_cache_total_bounds_every_owner(tmp_path) -> None:
    tar, tar2 = _random_layer(tmp_path, "a"), _random_layer(tmp_path, "b")
    store = ImageStore(str(tmp_path / "cache"), max_total_bytes=5 << 20)
    store.import_path(tar, "alice+a")
    with pytest.raises(ImageTooLarge, match=r"the cache may hold 5 MiB \(image_store_max_mb\)"):
        store.import_path(tar2, "bob+b")
    store.import_path(tar, "bob+same")  # its layer is already here: nothing new to hold


def test_limits_refuse_bad_values() -> None:
    with pytest.raises(ValueError, match="max_files must be an integer >= 0, got -1"):
        ImageLimits(max_files=-1)
    with pytest.raises(ValueError, match=r"max_ratio must be a number >= 1, got 0\.5"):
        ImageLimits(max_ratio=0.5)
