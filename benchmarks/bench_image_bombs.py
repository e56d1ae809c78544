"""Hostile image uploads against a real `tangram serve` with the default import bounds (issue 35,
H4): a gzip bomb (11 GiB of zeros in ~11 MB), an inode bomb (500,000 empty files), a
docker-archive whose layer is a sparse 3 GiB member and one whose manifest.json is a sparse
2 GiB member. For each: the answer, the seconds to it, and the cache file system's free bytes and
inodes and the server's RSS before and after (each should be back within 5%), with a small
upload's import time in the same run as the baseline.

    .venv/bin/python benchmarks/bench_image_bombs.py [--inodes 500000] [--gib 11]

Needs root (the server's sandboxes). Loopback only; the server is stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx

from arl_tangram.managers.cpu.images import imagekit


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inodes", type=int, default=500_000)
    ap.add_argument("--gib", type=float, default=11.0)
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="bench-bombs-", dir="/var/tmp")
    os.makedirs(f"{d}/spool")
    with open(f"{d}/service.yaml", "w") as f:
        f.write("nodes:\n  - name: local\n    gpu: false\n"
                f"    cpu: {{work_root: {d}/w, warm_min: 1, warm_max: 2, images_dir: {d}/cache}}\n"
                f"images: {{upload_dir: {d}/spool}}\n")
    print("building the archives ...", flush=True)
    root = imagekit.host_rootfs(f"{d}/rootfs")
    shapes = [
        ("baseline: a small rootfs", imagekit.pack_layer(root, f"{d}/mini.tar.gz", gzip_it=True)),
        (f"gzip bomb, {args.gib:g} GiB of zeros", imagekit.gzip_bomb(f"{d}/gz.tar.gz", args.gib)),
        (f"inode bomb, {args.inodes:,} files", imagekit.inode_bomb(f"{d}/in.tar.gz", args.inodes)),
        ("docker-archive, sparse 3 GiB layer",
         imagekit.sparse_docker_archive(f"{d}/sl.tar", "layer", 3)),
        ("docker-archive, sparse 2 GiB manifest.json",
         imagekit.sparse_docker_archive(f"{d}/sm.tar", "manifest.json", 2)),
    ]
    port = _port()
    tangram = os.path.join(os.path.dirname(sys.executable), "tangram")
    proc = subprocess.Popen([tangram, "serve", "--config", f"{d}/service.yaml", "--no-models",
                             "--port", str(port), "--log-level", "warning"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        print(f"{'upload':44} {'size':>9} {'answer':>6} {'s':>6} {'free MB':>17} "
              f"{'free inodes':>21} {'RSS MB':>13}")
        for i, (what, path) in enumerate(shapes):
            st0 = os.statvfs(d)
            rss0 = _rss_kb(proc.pid)
            t0 = time.perf_counter()
            with open(path, "rb") as f:
                r = httpx.put(f"{url}/v1/images/x{i}", content=f.read(), timeout=600,
                              headers={"content-type": "application/octet-stream"})
            took = time.perf_counter() - t0
            if r.status_code == 201:
                httpx.delete(f"{url}/v1/images/x{i}", timeout=60)
            st1 = os.statvfs(d)
            rss1 = _rss_kb(proc.pid)
            free = (st0.f_bavail * st0.f_frsize >> 20, st1.f_bavail * st1.f_frsize >> 20)
            print(f"{what:44} {os.path.getsize(path) / 1e6:8.2f}M {r.status_code:>6} "
                  f"{took:6.2f} {free[0]:>8}->{free[1]:<8} {st0.f_favail:>10}->{st1.f_favail:<10} "
                  f"{rss0 >> 10:>6}->{rss1 >> 10:<6}", flush=True)
            if r.status_code != 201:
                print(f"    {r.json().get('detail', '')[:150]}")
    finally:
        proc.terminate()
        proc.wait(30)
        subprocess.run(["rm", "-rf", d], check=False)


if __name__ == "__main__":
    main()
