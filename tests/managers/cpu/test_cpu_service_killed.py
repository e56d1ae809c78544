"""Issue 41, item 6 (review M7): kill -9 of a real `tangram serve` with two image sessions open
(one with a background `sleep` and files written, both frozen between actions) and an upload in
flight. Within 10 s, with no restart: no process of the sandbox ids or the image ids, no loop
device of its layers, no freezer or other cgroup of it, no layer file. The upload's spool is the
edge's (not the CPU manager's): it stays until the next start, which removes it, while a spool
a live process holds open is kept."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from _cpu_helpers import TEST_ID_BASE, TEST_ID_COUNT, procs_of_uid

from arl_tangram.managers.cpu.host import cgroups
from arl_tangram.managers.cpu.images import imagekit

pytestmark = [pytest.mark.integration, pytest.mark.needs_root]

IMAGE_BASE = (1 << 30) + (8 << 20) + (os.getpid() % 64) * 65536  # (no other test's range)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(cfg: Path, port: int) -> subprocess.Popen[bytes]:
    tangram = os.path.join(os.path.dirname(sys.executable), "tangram")
    proc = subprocess.Popen([tangram, "serve", "--config", str(cfg), "--no-models", "--port",
                             str(port), "--log-level", "warning"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    for _ in range(600):
        if proc.poll() is not None:
            pytest.fail(f"tangram serve exited: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    pytest.fail("tangram serve did not become healthy")


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split()]


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def _loops_under(d: str) -> list[str]:
    """Loop devices whose backing file is under ``d`` (what `losetup -a` lists)."""
    out = []
    for dev in os.listdir("/sys/block"):
        try:
            with open(f"/sys/block/{dev}/loop/backing_file") as f:
                if f.read().strip().startswith(d + "/"):
                    out.append(dev)
        except OSError:
            pass
    return out


def _cgroups_of(pid: int) -> list[str]:
    """Directories of every cgroup hierarchy named after service ``pid`` (its slots' trees and
    its sessions' freezer tree)."""
    out = []
    for kind, mnt, _opts in cgroups._mounts():
        for dirpath, dirnames, _ in os.walk(mnt):
            out += [os.path.join(dirpath, d) for d in dirnames if d.startswith(f"tangram-{pid}")]
            if dirpath.count("/") > 6 or kind == "cgroup2":
                dirnames[:] = []
    return out


def _frozen(pid: int) -> list[str]:
    out = []
    for d in _cgroups_of(pid):
        for dirpath, _, files in os.walk(d):
            if "freezer.state" in files:
                with open(os.path.join(dirpath, "freezer.state")) as f:
                    if f.read().strip() != "THAWED":
                        out.append(dirpath)
    return out


def _left(pid: int, layers: str) -> dict[str, list]:
    return {"sandbox procs": procs_of_uid(TEST_ID_BASE, TEST_ID_COUNT),
            "image procs": procs_of_uid(IMAGE_BASE, 65536),
            "loop devices": _loops_under(layers),
            "frozen cgroups": _frozen(pid),
            "cgroups": _cgroups_of(pid),
            "layer files": [n for n in os.listdir(layers) if n.startswith(f"{pid}-")]}


def _act(url: str, session: str, code: str) -> dict:
    r = httpx.post(f"{url}/v1/actions", timeout=120, json={
        "actions": [{"kind": "tool", "session": session,
                     "payload": {"code": code, "language": "bash"}}], "wait": True})
    assert r.status_code == 200, r.text
    (res,) = r.json()["results"]
    return res


def test_kill_9_of_the_service_leaves_nothing_within_10_s(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("sandboxes need root")
    img = imagekit.pack_layer(imagekit.host_rootfs(str(tmp_path / "rootfs")),
                              str(tmp_path / "mini.tar.gz"), gzip_it=True)
    layers, spool = str(tmp_path / "layers"), tmp_path / "spool"
    spool.mkdir()
    cfg = tmp_path / "service.yaml"
    cpu = {"work_root": str(tmp_path / "w"), "warm_min": 1, "warm_max": 2,
           "images_dir": str(tmp_path / "cache"), "layers_dir": layers, "image_layer_mb": 64,
           "sandbox_id_base": TEST_ID_BASE, "sandbox_id_count": TEST_ID_COUNT,
           "image_id_base": IMAGE_BASE}
    cfg.write_text("nodes:\n  - name: local\n    gpu: false\n"
                   f"    cpu: {json.dumps(cpu)}\n"
                   f"images: {{load: [{{name: mini, path: {img}}}], upload_dir: {spool}}}\n")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _serve(cfg, port)
    up = None
    try:
        for sid in ("a", "b"):
            r = httpx.post(f"{url}/v1/sessions", timeout=60,
                           json={"session_id": sid, "image": "mini", "layer_mb": 64})
            assert r.status_code == 201, r.text
        res = _act(url, "a", "sleep 1000 >/dev/null 2>&1 & head -c 20000000 /dev/zero > /srv/f; "
                             "mkdir -p /srv/d && touch /srv/d/x /srv/d/y; echo done")
        assert res["status"] == "succeeded" and res["output"]["run_result"]["stdout"] == "done\n", res
        res = _act(url, "b", "echo hi > /tmp/f; cat /tmp/f")
        assert res["status"] == "succeeded" and res["output"]["run_result"]["stdout"] == "hi\n", res
        # an upload in flight: 1 MiB of the 8 MiB it announces, then nothing
        up = socket.create_connection(("127.0.0.1", port))
        up.sendall(b"PUT /v1/images/late HTTP/1.1\r\nhost: t\r\n"
                   b"content-type: application/octet-stream\r\ncontent-length: 8388608\r\n\r\n"
                   + b"\0" * (1 << 20))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
                (spool / n / "image.tar").exists() and (spool / n / "image.tar").stat().st_size
                for n in os.listdir(spool)):
            time.sleep(0.05)
        (spooled,) = os.listdir(spool)
        before = _left(proc.pid, layers)
        assert len(before["image procs"]) >= 4, before  # 2 inits, 2 shells, the sleep
        # (the sessions' layers, and the ready layers the manager keeps in hand)
        assert len(before["loop devices"]) >= 2 and len(before["frozen cgroups"]) == 2, before
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    pid = proc.pid
    # the reaper obeys no SIGTERM (systemd sends one to every process of the unit): it ends
    # by itself once the service is gone
    (reaper,) = [c for c in _children(pid) if b"reaper.server" in _cmdline(c)]
    os.kill(reaper, signal.SIGTERM)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if up is not None:
        up.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_left(pid, layers).values()):
        time.sleep(0.1)
    assert _left(pid, layers) == {"sandbox procs": [], "image procs": [], "loop devices": [],
                                  "frozen cgroups": [], "cgroups": [], "layer files": []}
    while time.monotonic() < deadline and os.path.exists(f"/proc/{reaper}"):
        time.sleep(0.05)  # (reaped by the host's init, or by whoever adopted it)
    assert not os.path.exists(f"/proc/{reaper}") or open(  # noqa: SIM115
        f"/proc/{reaper}/stat").read().rsplit(") ", 1)[1][0] == "Z"  # its work done, it exited
    # the spool: the edge's, left by the kill; the next start removes it, and only it
    assert os.listdir(spool) == [spooled]
    held = spool / "tangram-upload-held"
    held.mkdir()
    (held / "image.tar").write_bytes(b"x")
    os.utime(held, (time.time() - 3600, time.time() - 3600))
    with open(held / "image.tar", "rb"):  # (an upload of a live service: open)
        again = _serve(cfg, port)
        try:
            assert sorted(os.listdir(spool)) == ["tangram-upload-held"]
        finally:
            again.terminate()
            again.wait(30)
