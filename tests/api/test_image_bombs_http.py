"""Issue 35 (H4) through a real `tangram serve` (uvicorn, real sandboxes): a gzip bomb, an inode
bomb and both sparse docker-archive shapes uploaded with `PUT /v1/images/NAME` answer 413 naming
the bound; nothing stays in the cache or the spool; the server's memory stays small; another
client's `/run_code` is served meanwhile and after."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from _serve import tangram_serve

from arl_tangram.managers.cpu.images import imagekit

pytestmark = [pytest.mark.integration, pytest.mark.needs_root]


class Server:
    def __init__(self, url: str, proc: subprocess.Popen, d: Path) -> None:
        self.url, self.proc, self.dir = url, proc, d

    def rss_kb(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("bombs")
    (d / "spool").mkdir()
    cfg = d / "service.yaml"
    cfg.write_text(
        "nodes:\n"
        "  - name: local\n"
        "    gpu: false\n"
        f"    cpu: {{work_root: {d / 'w'}, warm_min: 1, warm_max: 2, "
        f"images_dir: {d / 'cache'}, image_max_files: 2000}}\n"
        f"images: {{upload_dir: {d / 'spool'}}}\n")
    with tangram_serve(cfg) as (url, proc):
        yield Server(url, proc, d)


def _put(server: Server, name: str, path: str) -> httpx.Response:
    with open(path, "rb") as f:
        return httpx.put(f"{server.url}/v1/images/{name}", content=f.read(), timeout=120,
                         headers={"content-type": "application/octet-stream"})


def _left(server: Server) -> list[str]:
    cache = server.dir / "cache"
    out = [f"spool/{n}" for n in os.listdir(server.dir / "spool")]
    for sub in ("tmp", "layers", "images"):
        if (cache / sub).is_dir():
            out += [f"{sub}/{n}" for n in os.listdir(cache / sub)]
    return out


def _serves(server: Server) -> None:
    r = httpx.post(f"{server.url}/run_code", json={"code": "print(6 * 7)"}, timeout=60)
    assert r.status_code == 200 and r.json()["run_result"]["stdout"] == "42\n", r.text


@pytest.mark.parametrize("shape", ["gzip", "inodes", "sparse-layer", "sparse-manifest"])
def test_bombs_answer_413_and_leave_nothing(server: Server, tmp_path: Path, shape: str) -> None:
    if shape == "gzip":
        arc = imagekit.gzip_bomb(str(tmp_path / "b.tar.gz"), 11)
        why = "expands more than 200 times its packed size"
    elif shape == "inodes":
        arc = imagekit.inode_bomb(str(tmp_path / "b.tar.gz"), 3000)
        why = "more entries than it may (image_max_files: 2000)"
    elif shape == "sparse-layer":
        arc = imagekit.sparse_docker_archive(str(tmp_path / "b.tar"), "layer", 3)
        why = "layer.tar is a sparse member of 3221225472 bytes"
    else:
        arc = imagekit.sparse_docker_archive(str(tmp_path / "b.tar"), "manifest.json", 2)
        why = "manifest.json is a sparse member of 2147483648 bytes"
    _serves(server)
    rss0 = server.rss_kb()
    r = _put(server, "bomb", arc)
    assert r.status_code == 413, r.text
    assert why in r.json()["detail"], r.json()
    assert str(server.dir) not in r.text  # no host path in the answer
    assert _left(server) == []
    assert server.rss_kb() - rss0 < 100_000, (rss0, server.rss_kb())  # KB
    _serves(server)
    assert httpx.get(f"{server.url}/v1/images", timeout=10).json()["nodes"]["local"] == []


def _attack_tar(entries: list[tuple[str, str, str | None, int]]) -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for kind, name, target, mode in entries:
            ti = tarfile.TarInfo(name)
            ti.mode = mode
            if kind == "dir":
                ti.type = tarfile.DIRTYPE
            elif kind == "sym":
                ti.type, ti.linkname = tarfile.SYMTYPE, target or ""
            tf.addfile(ti, io.BytesIO(b"") if kind == "file" else None)
    return buf.getvalue()


def test_an_upload_cannot_chmod_or_create_host_files(server: Server, tmp_path: Path) -> None:
    """C1 over HTTP with no token (the default loopback bind): a directory entry (mode 6777)
    later replaced by a symlink to a root-owned host binary must not make it setuid; an opaque
    marker under a later symlink must not create a directory on the host."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"\x7fELF")
    os.chmod(victim, 0o700)
    hostdir = tmp_path / "hostdir"
    hostdir.mkdir()
    arc = tmp_path / "c1.tar"
    arc.write_bytes(_attack_tar([("dir", "d", None, 0o6777), ("sym", "d", str(victim), 0o777)]))
    r = _put(server, "c1", str(arc))
    assert r.status_code == 201, r.text  # harmless: the link is kept as a link
    assert os.stat(victim).st_mode & 0o7777 == 0o700
    arc.write_bytes(_attack_tar([("file", "q/sub/.wh..wh..opq", None, 0o644),
                                 ("sym", "q", str(hostdir), 0o777)]))
    r = _put(server, "opq", str(arc))
    assert r.status_code == 400 and "would be written through the symlink 'q'" in r.text, r.text
    assert os.listdir(hostdir) == []
    assert httpx.delete(f"{server.url}/v1/images/c1", timeout=30).status_code == 200
    assert _left(server) == []
    _serves(server)
