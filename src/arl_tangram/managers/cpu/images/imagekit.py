"""Making small images without a container tool (tests, benchmarks, examples).

`host_rootfs` copies a few of this machine's programs and the libraries they load into a
directory (a root file system good enough for bash sessions); `pack_layer` tars a directory;
`write_oci_layout`, `write_oci_archive` and `write_docker_archive` write the layouts that
``skopeo copy``/``podman save --format oci-archive`` and ``docker save`` write, from layer tars.
`gzip_bomb`, `inode_bomb` and `sparse_docker_archive` make the hostile shapes the import bounds
are tested with (a few MB each).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterable, Sequence
from typing import Any

DEFAULT_TOOLS = ("bash", "sh", "cat", "ls", "sleep", "head", "dd", "mkdir", "rm", "echo",
                 "true", "false", "grep", "sed", "wc", "env", "id", "stat", "tr", "cut", "sort",
                 "touch", "chmod", "cp", "mv", "find", "pwd", "uname", "tail", "df", "sync")


def _libs(binary: str) -> set[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    libs = set()
    for line in out.splitlines():
        m = re.search(r"(/\S+)\s+\(0x", line)
        if m:
            libs.add(m.group(1))
    return libs


def _copy(src: str, root: str) -> None:
    """Copy ``src`` (following its symlinks) to the same path under ``root``."""
    dst = root + src
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if not os.path.exists(dst):
        shutil.copy2(os.path.realpath(src), dst)


def host_rootfs(root: str, tools: Iterable[str] = DEFAULT_TOOLS) -> str:
    """A minimal root file system at ``root``: the host's ``tools`` and their libraries, /etc
    with passwd/group, /tmp, /workdir, /proc and /dev mount points."""
    for d in ("bin", "etc", "tmp", "workdir", "proc", "dev", "usr/bin", "root"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    os.chmod(os.path.join(root, "tmp"), 0o1777)
    os.chmod(os.path.join(root, "workdir"), 0o777)
    files: set[str] = set()
    for t in tools:
        path = shutil.which(t)
        if path is None:
            continue
        for p in (path, f"/bin/{t}", f"/usr/bin/{t}"):
            if os.path.exists(p):
                files.add(p)
        files |= _libs(os.path.realpath(path))
    for name in sorted(files):
        _copy(name, root)
    for lib in [f for f in files if "/ld-linux" in f]:
        for d in ("/lib64", "/lib/x86_64-linux-gnu"):
            cand = os.path.join(d, os.path.basename(lib))
            if os.path.exists(cand):
                _copy(cand, root)
    with open(os.path.join(root, "etc/passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/:/bin/sh\n")
    with open(os.path.join(root, "etc/group"), "w") as f:
        f.write("root:x:0:\nnogroup:x:65534:\n")
    with open(os.path.join(root, "etc/os-release"), "w") as f:
        f.write("ID=tangram-mini\n")
    os.makedirs(os.path.join(root, "srv/data"), exist_ok=True)  # writable by anyone
    os.chmod(os.path.join(root, "srv/data"), 0o777)
    with open(os.path.join(root, "srv/data/orig"), "w") as f:
        f.write("original\n")
    os.chmod(os.path.join(root, "srv/data/orig"), 0o666)
    return root


# standard-library parts a work program or a session's interpreter never needs (~80% of it)
_PY_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data",
            "site-packages", "dist-packages", "__pycache__", "distutils", "unittest", "asyncio",
            "email", "xml", "xmlrpc", "http", "urllib", "wsgiref", "html", "dbm", "sqlite3",
            "curses", "venv", "idle_test", "config-3"}


def add_host_python(root: str, python: str = "/usr/bin/python3") -> str | None:
    """Add this machine's ``python`` (a system interpreter, not a virtual environment's) with
    its libraries and most of its standard library to the root file system at ``root``, as
    ``/usr/bin/python3``; None (nothing added) when there is no such interpreter."""
    if not os.access(python, os.X_OK):
        return None
    out = subprocess.run([python, "-S", "-c", "import sys, sysconfig; "
                          "print(sysconfig.get_path('stdlib')); print(sys.prefix == sys.base_prefix)"],
                         capture_output=True, text=True)
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 2 or lines[1] != "True":
        return None
    stdlib, real = lines[0], os.path.realpath(python)
    for f in {real, *_libs(real)}:
        _copy(f, root)
    for lib in [f for f in _libs(real) if "/ld-linux" in f]:
        for d in ("/lib64", "/lib/x86_64-linux-gnu"):
            cand = os.path.join(d, os.path.basename(lib))
            if os.path.exists(cand):
                _copy(cand, root)

    def skip(_d: str, names: list[str]) -> set[str]:
        return {n for n in names if n in _PY_SKIP or n.startswith("config-3")}

    if not os.path.exists(root + stdlib):  # (again on the same root: already there)
        shutil.copytree(stdlib, root + stdlib, ignore=skip, symlinks=True)
    link = os.path.join(root, "usr/bin/python3")
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if not os.path.lexists(link):
        os.symlink(real, link)
    return link


def pack_layer(src_dir: str, out_tar: str, *, gzip_it: bool = False,
               extra: Sequence[tuple[str, bytes | None]] = ()) -> str:
    """Tar ``src_dir`` (paths relative to it, symlinks kept) to ``out_tar``; ``extra`` adds
    entries (name, data) after it (data None: an empty file, e.g. an OCI whiteout)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
        if src_dir:
            for top, dirs, names in os.walk(src_dir):
                dirs.sort()
                for n in sorted(dirs) + sorted(names):
                    full = os.path.join(top, n)
                    ti = tf.gettarinfo(full, arcname=os.path.relpath(full, src_dir))
                    if ti.isreg():
                        with open(full, "rb") as f:
                            tf.addfile(ti, f)
                    else:
                        tf.addfile(ti)
        for name, data in extra:
            ti = tarfile.TarInfo(name)
            ti.size = len(data or b"")
            ti.mode = 0o644
            tf.addfile(ti, io.BytesIO(data or b""))
    data = raw.getvalue()
    with open(out_tar, "wb") as f:
        f.write(gzip.compress(data, compresslevel=1, mtime=0) if gzip_it else data)
    return out_tar


def _blob(layout: str, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    path = os.path.join(layout, "blobs", "sha256", digest.split(":")[1])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return digest


def write_oci_layout(layout: str, layer_tars: Sequence[str],
                     config: dict[str, Any] | None = None, ref: str = "latest") -> str:
    """An OCI image layout directory (as ``skopeo copy ... oci:DIR`` writes) from layer tars
    (gzip-compressed or plain, as given)."""
    os.makedirs(layout, exist_ok=True)
    layers, diff_ids = [], []
    for t in layer_tars:
        with open(t, "rb") as f:
            data = f.read()
        gz = data[:2] == b"\x1f\x8b"
        raw = gzip.decompress(data) if gz else data
        diff_ids.append("sha256:" + hashlib.sha256(raw).hexdigest())
        layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar"
                       + ("+gzip" if gz else ""), "digest": _blob(layout, data),
                       "size": len(data)})
    cfg = {"architecture": "amd64", "os": "linux", "config": config or {},
           "rootfs": {"type": "layers", "diff_ids": diff_ids}}
    cfg_bytes = json.dumps(cfg).encode()
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": _blob(layout, cfg_bytes), "size": len(cfg_bytes)},
                "layers": layers}
    man_bytes = json.dumps(manifest).encode()
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": _blob(layout, man_bytes), "size": len(man_bytes),
        "annotations": {"org.opencontainers.image.ref.name": ref}}]}
    with open(os.path.join(layout, "index.json"), "w") as f:
        json.dump(index, f)
    with open(os.path.join(layout, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    return layout


def _tar_dir(src: str, out: str) -> str:
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tf:
        for n in sorted(os.listdir(src)):
            tf.add(os.path.join(src, n), arcname=n)
    return out


def write_oci_archive(layout_dir: str, out: str) -> str:
    """The layout as one tar (``podman save --format oci-archive``)."""
    return _tar_dir(layout_dir, out)


def write_docker_archive(out: str, layer_tars: Sequence[str],
                         config: dict[str, Any] | None = None, tag: str = "img:latest") -> str:
    """A docker-archive (``docker save``): manifest.json, the config, <id>/layer.tar each."""
    tmp = out + ".d"
    os.makedirs(tmp, exist_ok=True)
    try:
        paths, diff_ids = [], []
        for t in layer_tars:
            with open(t, "rb") as f:
                data = f.read()
            if data[:2] == b"\x1f\x8b":
                data = gzip.decompress(data)
            h = hashlib.sha256(data).hexdigest()
            os.makedirs(os.path.join(tmp, h), exist_ok=True)
            with open(os.path.join(tmp, h, "layer.tar"), "wb") as f:
                f.write(data)
            paths.append(f"{h}/layer.tar")
            diff_ids.append("sha256:" + h)
        cfg = json.dumps({"architecture": "amd64", "os": "linux", "config": config or {},
                          "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
        cid = hashlib.sha256(cfg).hexdigest()
        with open(os.path.join(tmp, f"{cid}.json"), "wb") as f:
            f.write(cfg)
        with open(os.path.join(tmp, "manifest.json"), "w") as f:
            json.dump([{"Config": f"{cid}.json", "RepoTags": [tag], "Layers": paths}], f)
        return _tar_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- hostile archives (issue 35: the bounds on what an import expands to are tested with these) --

def gzip_bomb(out: str, gib: float) -> str:
    """A gzip'd rootfs tar of one file of ``gib`` GiB of zeros, about 1 MB per GiB: the gzip
    members of one MiB of zeros repeated (concatenated members are one gzip stream)."""
    size = int(gib * (1 << 30)) // (1 << 20) << 20
    ti = tarfile.TarInfo("zeros")
    ti.size, ti.mode = size, 0o644
    mib = gzip.compress(b"\0" * (1 << 20), 9)
    with open(out, "wb") as f:
        f.write(gzip.compress(ti.tobuf(format=tarfile.PAX_FORMAT)))
        for _ in range(size >> 20):
            f.write(mib)
        f.write(gzip.compress(b"\0" * 1024))  # the tar's end
    return out


def inode_bomb(out: str, files: int) -> str:
    """A gzip'd rootfs tar of ``files`` empty files (a few bytes of archive per inode)."""
    with gzip.open(out, "wb", 6) as gz, tarfile.open(fileobj=gz, mode="w",
                                                     format=tarfile.GNU_FORMAT) as tf:
        for i in range(files):
            ti = tarfile.TarInfo(f"f/{i}")
            ti.mode = 0o644
            tf.addfile(ti)
    return out


def sparse_docker_archive(out: str, member: str, gib: float) -> str:
    """A docker-archive of a few KB whose ``member`` (``"layer"``: its one layer, or
    ``"manifest.json"``) is a GNU sparse file declaring ``gib`` GiB (``tar --sparse``)."""
    tmp = out + ".d"
    os.makedirs(tmp, exist_ok=True)
    try:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump({"architecture": "amd64", "os": "linux", "config": {}}, f)
        big = "manifest.json" if member == "manifest.json" else "layer.tar"
        if big != "manifest.json":
            with open(os.path.join(tmp, "manifest.json"), "w") as f:
                json.dump([{"Config": "config.json", "RepoTags": [],
                            "Layers": ["layer.tar"]}], f)
        with open(os.path.join(tmp, big), "wb") as f:
            f.write(b"[" if big == "manifest.json" else b"")
            f.truncate(int(gib * (1 << 30)))
        names = sorted(os.listdir(tmp))
        subprocess.run(["tar", "--sparse", "--format=gnu", "-cf", out, "-C", tmp, *names],
                       check=True)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
