"""Environment images (issue 17) on real sandboxes: sessions and one-shot actions in an image,
state kept per session and never shared, frozen between actions, the writable layer's cap,
removal refused while in use. The image is a small root file system of this machine's programs
(`imagekit.host_rootfs`), so these run in seconds; the Debian-built SWE image is in
tests/e2e/test_swe_image.py."""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
import time

import pytest
from _cpu_fixture import mgr  # noqa: F401
from _cpu_helpers import action, allot, layer_loops

from arl_tangram.core.actions import ActionKind
from arl_tangram.core.resources import Resources
from arl_tangram.managers.cpu import CpuManager
from arl_tangram.managers.cpu.images import imagekit
from arl_tangram.managers.cpu.images.store import ImageError, ImageInUse

pytestmark = [pytest.mark.needs_root, pytest.mark.asyncio(loop_scope="module")]


@pytest.fixture(scope="module")
def mini_rootfs() -> str:
    d = tempfile.mkdtemp(prefix="tangram-mini-")
    return imagekit.host_rootfs(os.path.join(d, "rootfs"))


async def _image(mgr: CpuManager, rootfs: str, name: str = "mini") -> str:  # noqa: F811
    assert mgr.images is not None
    if not mgr.images.has(name):
        await asyncio.to_thread(mgr.images.import_path, rootfs, name)
    return name


def sh(mgr: CpuManager, sid: str, code: str, cpu: float = 1, **kw: object):  # noqa: F811
    return mgr.run(action(code, kind=ActionKind.TOOL, session=sid, language="bash", **kw),
                   allot(cpu=cpu))


async def test_session_in_image_keeps_files_processes_and_cwd(mgr: CpuManager,  # noqa: F811
                                                              mini_rootfs: str) -> None:
    img = await _image(mgr, mini_rootfs)
    await mgr.open_session("img-a", Resources(cpu=1, memory_mb=256), ttl_s=60, image=img)
    try:
        r = await sh(mgr, "img-a", "cat /etc/os-release; id -u; pwd")
        assert r.status == "Success", (r.run_result.stdout, r.run_result.stderr) if r.run_result else r
        out = r.run_result.stdout
        assert "ID=tangram-mini" in out  # the image's root, not the host's
        assert out.split()[1] == "0"  # the image's user: root inside (test_cpu_image_user.py)
        assert r.session_switch is not None and r.session_switch["frozen"]
        r = await sh(mgr, "img-a", "mkdir -p /workdir/x && cd /workdir/x && echo kept > f && "
                                   "export FOO=bar && (sleep 300 &) && echo started")
        assert r.status == "Success", (r.run_result.stdout, r.run_result.stderr) if r.run_result else r
        r = await sh(mgr, "img-a", "pwd; cat f; echo $FOO; ls /proc | grep -c '^[0-9]'; "
                                   "cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' '")
        assert r.status == "Success", (r.run_result.stdout, r.run_result.stderr) if r.run_result else r
        lines = r.run_result.stdout.splitlines()
        assert lines[:3] == ["/workdir/x", "kept", "bar"]
        assert "sleep 300" in r.run_result.stdout  # the process started earlier is alive
        r = await sh(mgr, "img-a", "ls /sandbox /tangram 2>&1; ls / ")
        assert "bin" in r.run_result.stdout and "usr" in r.run_result.stdout
    finally:
        await mgr.close_session("img-a")


async def test_sessions_of_one_image_share_nothing(mgr: CpuManager,  # noqa: F811
                                                   mini_rootfs: str) -> None:
    img = await _image(mgr, mini_rootfs)
    await mgr.open_session("img-b1", Resources(cpu=1, memory_mb=256), ttl_s=60, image=img)
    await mgr.open_session("img-b2", Resources(cpu=1, memory_mb=256), ttl_s=60, image=img)
    try:
        r = await sh(mgr, "img-b1", "echo secret > /srv/data/leak && echo hi > /tmp/t && "
                                    "echo changed > /srv/data/orig && echo done")
        assert r.status == "Success" and "done" in r.run_result.stdout, r
        r = await sh(mgr, "img-b2", "ls /srv/data/leak /tmp/t 2>&1; cat /srv/data/orig")
        assert r.run_result.stdout.count("No such file") == 2
        assert "original" in r.run_result.stdout  # changed only in b1's layer
        # the cache's layer itself is untouched
        layer = mgr.images.layer_paths(mgr.images.get(img))[0]  # type: ignore[union-attr]
        with open(os.path.join(layer, "srv/data/orig")) as f:
            assert f.read() == "original\n"
        assert not os.path.exists(os.path.join(layer, "srv/data/leak"))
    finally:
        await mgr.close_session("img-b1")
        await mgr.close_session("img-b2")
    # a new session of the same image starts clean
    await mgr.open_session("img-b3", Resources(cpu=1, memory_mb=256), ttl_s=60, image=img)
    try:
        r = await sh(mgr, "img-b3", "ls /srv/data/leak 2>&1; cat /srv/data/orig")
        assert "No such file" in r.run_result.stdout and "original" in r.run_result.stdout
    finally:
        await mgr.close_session("img-b3")


def _cpu_ticks(pid_of: str) -> float:
    """CPU seconds of every host process whose cmdline contains ``pid_of``."""
    total = 0.0
    hz = os.sysconf("SC_CLK_TCK")
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if pid_of.encode() not in f.read():
                    continue
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / hz
        except OSError:
            continue
    return total


async def test_frozen_session_gains_no_cpu_between_actions(mgr: CpuManager,  # noqa: F811
                                                           mini_rootfs: str) -> None:
    img = await _image(mgr, mini_rootfs)
    await mgr.open_session("img-f", Resources(cpu=1, memory_mb=256), ttl_s=60, image=img)
    try:
        marker = "spin_" + os.urandom(4).hex()
        r = await sh(mgr, "img-f", f"(exec -a {marker} bash -c 'while :; do :; done' &) ; "
                                   "sleep 0.3; echo ok")
        assert r.status == "Success", (r.run_result.stdout, r.run_result.stderr) if r.run_result else r
        await asyncio.sleep(0.1)
        before = _cpu_ticks(marker)
        assert before > 0.05  # it did run during the action
        await asyncio.sleep(1.0)  # between actions: frozen
        between = _cpu_ticks(marker) - before
        assert between < 0.02, f"the frozen loop used {between:.3f} s of CPU"
        r = await sh(mgr, "img-f", "sleep 0.5; echo ok")  # thawed: it runs again
        assert r.status == "Success"
        assert _cpu_ticks(marker) - before > 0.1
        sw = r.session_switch
        assert sw is not None and sw["frozen"] and sw["total_ms"] >= 0
    finally:
        await mgr.close_session("img-f")


async def test_write_beyond_layer_cap_fails_the_action_not_the_node(
        mgr: CpuManager, mini_rootfs: str) -> None:  # noqa: F811
    img = await _image(mgr, mini_rootfs)
    await mgr.open_session("img-cap", Resources(cpu=1, memory_mb=256), ttl_s=60, image=img,
                           layer_mb=8)
    try:
        r = await sh(mgr, "img-cap", "dd if=/dev/zero of=/tmp/big bs=1M count=20 2>&1; echo rc=$?")
        assert "No space left" in r.run_result.stdout and "rc=1" in r.run_result.stdout, r
        r = await sh(mgr, "img-cap", "rm -f /tmp/big; echo small > /tmp/s; cat /tmp/s")  # session lives on
        assert r.status == "Success" and "small" in r.run_result.stdout
    finally:
        await mgr.close_session("img-cap")
    r = await mgr.run(action("print(6*7)"), allot())  # the node too
    assert r.status == "Success" and r.run_result.stdout.strip() == "42"


async def test_one_shot_action_in_image_gets_a_fresh_layer(mgr: CpuManager,  # noqa: F811
                                                           mini_rootfs: str) -> None:
    img = await _image(mgr, mini_rootfs)
    for _ in range(2):
        r = await mgr.run(action("cat /etc/os-release; ls /srv/data/left 2>&1; echo x > /srv/data/left",
                                 language="bash", image=img), allot())
        assert r.status == "Success", (r.run_result.stdout, r.run_result.stderr) if r.run_result else r
        assert "ID=tangram-mini" in r.run_result.stdout
        assert "No such file" in r.run_result.stdout  # the last one's write is gone
    r = await mgr.run(action("echo hi", language="bash", image="no-such-image"), allot())
    assert r.status == "SandboxError" and "no-such-image" in r.message


async def test_remove_image_in_use_is_refused(mgr: CpuManager, mini_rootfs: str) -> None:  # noqa: F811
    assert mgr.images is not None
    img = await _image(mgr, mini_rootfs, "mini-rm")
    await mgr.open_session("img-rm", Resources(cpu=1, memory_mb=128), ttl_s=60, image=img)
    with pytest.raises(ImageInUse, match="in use by 1 session"):
        mgr.images.remove(img)
    await mgr.close_session("img-rm")
    mgr.images.remove(img)
    assert not mgr.images.has(img)
    with pytest.raises(ImageError, match="no image"):
        await mgr.open_session("img-rm2", Resources(cpu=1, memory_mb=128), ttl_s=60, image=img)
    assert "img-rm2" not in mgr.session_ids()


async def test_plain_sessions_are_frozen_too(mgr: CpuManager) -> None:  # noqa: F811
    await mgr.open_session("plain-f", Resources(cpu=1, memory_mb=128), ttl_s=60)
    try:
        r = await sh(mgr, "plain-f", "echo $((6*7))")
        assert r.status == "Success" and r.run_result.stdout.strip() == "42"
        assert r.session_switch is not None and r.session_switch["frozen"]
        t = time.perf_counter()
        r = await mgr.run(action("x = 5\nx", kind=ActionKind.TOOL, session="plain-f"), allot())
        assert r.run_result.stdout.strip() == "5" and time.perf_counter() - t < 30
        assert re.match(r"^\d", str(r.session_switch["thaw_ms"]))
    finally:
        await mgr.close_session("plain-f")


_CHILD = r"""
import asyncio, os, sys, tempfile
from arl_tangram.core.actions import ActionKind, ActionSpec
from arl_tangram.core.resources import Resources
from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig

async def main():
    m = CpuManager(CpuManagerConfig(work_root=tempfile.mkdtemp(prefix="tangram-cpu-test-"),
                                    sandbox_uid=int(sys.argv[1]), sandbox_gid=int(sys.argv[1]),
                                    warm_min=0, warm_max=1))
    await m.start()
    await m.open_session("s", Resources(cpu=1, memory_mb=128), 600)
    a = ActionSpec(id="a", kind=ActionKind.TOOL, session="s",
                   payload={"code": "(sleep 300 &); echo ok", "language": "bash"})
    r = await m.run(a, Resources(cpu=1, memory_mb=128))
    print(m.sessions.by_id["s"].freezer.dir, m.fork.watchdog.proc.pid, flush=True)
    await asyncio.sleep(300)

asyncio.run(main())
"""


async def test_sessions_frozen_by_a_killed_manager_are_thawed_and_killed_at_next_start(
        tmp_path) -> None:
    import signal
    import subprocess
    import sys

    from _cpu_helpers import TEST_UID

    from arl_tangram.managers.cpu import CpuManagerConfig

    p = subprocess.Popen([sys.executable, "-c", _CHILD, str(TEST_UID)], stdout=subprocess.PIPE,
                         text=True)
    try:
        fdir, reaper = [*p.stdout.readline().split(), "", ""][:2]  # type: ignore[union-attr]
        assert fdir, "the child manager did not open its session"
        with open(f"{fdir}/cgroup.procs") as f:
            pids = [int(x) for x in f.read().split()]
        assert len(pids) >= 2  # init, bash, sleep
        # its reaper killed too (it would thaw and kill them at once, issue 41: see
        # test_cpu_service_killed.py), the manager stopped first (it would start a new one):
        # what is left is then for the next start
        p.send_signal(signal.SIGSTOP)
        while open(f"/proc/{p.pid}/stat").read().rsplit(") ", 1)[1][0] != "T":  # noqa: SIM115
            await asyncio.sleep(0.01)
        os.kill(int(reaper), signal.SIGKILL)
        p.send_signal(signal.SIGKILL)
        p.wait()
        await asyncio.sleep(1.0)
        with open(f"{fdir}/freezer.state") as f:
            assert f.read().strip() == "FROZEN"
        assert any(os.path.exists(f"/proc/{x}") for x in pids)  # frozen: they cannot die
        m2 = CpuManager(CpuManagerConfig(work_root=str(tmp_path / "w2"), warm_min=0,
                                         warm_max=1))
        await m2.start()  # finds the dead manager's frozen sessions
        try:
            deadline = time.monotonic() + 5
            while any(os.path.exists(f"/proc/{x}") for x in pids) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert not any(os.path.exists(f"/proc/{x}") for x in pids)
            assert not os.path.exists(fdir)
        finally:
            await m2.aclose()
    finally:
        if p.poll() is None:
            p.kill()


def _shmem(mgr: CpuManager, sid: str) -> int:  # noqa: F811
    """Bytes of shared memory (tmpfs pages) charged to session ``sid``'s memory cgroup."""
    slot = mgr.sessions.by_id[sid].sandbox.slot
    assert slot is not None
    with open(f"{slot.dirs['memory']}/memory.stat") as f:
        stat = dict(line.split() for line in f)
    return int(stat.get("shmem", 0))


async def test_writable_layer_is_on_the_node_disk_and_freed_with_the_session(
        mgr: CpuManager, mini_rootfs: str) -> None:  # noqa: F811
    assert mgr.isolation_report()["image_layer"] == "disk"
    assert mgr.layers is not None
    img = await _image(mgr, mini_rootfs)
    before = set(layer_loops(mgr.layers.dir))
    await mgr.open_session("img-disk", Resources(cpu=1, memory_mb=256), ttl_s=60, image=img,
                           layer_mb=48)
    try:
        mine = [k for k, v in layer_loops(mgr.layers.dir).items() if k not in before and v == 48]
        assert len(mine) == 1  # its own file system of exactly the cap (others: warm ones)
        assert mgr.layers.used_mb == 48
        shmem0 = _shmem(mgr, "img-disk")
        r = await sh(mgr, "img-disk", "dd if=/dev/urandom of=/workdir/f bs=1M count=24 2>&1 && "
                                      "sync; df -m / | tail -1")
        assert r.status == "Success", (r.run_result.stdout, r.run_result.stderr) if r.run_result else r
        size_mb = int(r.run_result.stdout.split()[-5])
        assert 40 <= size_mb <= 48  # what the session sees as its disk: the layer
        # the 24 MiB sit on disk, not in memory as a tmpfs layer's pages would
        assert _shmem(mgr, "img-disk") - shmem0 < 4 << 20
    finally:
        await mgr.close_session("img-disk")
    assert mgr.layers.used_mb == 0
    deadline = time.monotonic() + 5
    while mine[0] in layer_loops(mgr.layers.dir) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert mine[0] not in layer_loops(mgr.layers.dir)  # loop device and blocks released
    assert not [n for n in os.listdir(mgr.layers.dir) if n.endswith(".ext4")]  # nothing named


async def test_layers_past_the_node_budget_are_refused_and_the_open_ones_go_on(
        mgr: CpuManager, mini_rootfs: str) -> None:  # noqa: F811
    assert mgr.layers is not None
    img = await _image(mgr, mini_rootfs)
    budget = mgr.layers.budget_mb
    mgr.layers.budget_mb = mgr.layers.used_mb + 40
    try:
        await mgr.open_session("img-bud1", Resources(cpu=1, memory_mb=128), ttl_s=60, image=img,
                               layer_mb=32)
        with pytest.raises(ImageError, match=r"layer budget is spent: 32 of 40 MiB"):
            await mgr.open_session("img-bud2", Resources(cpu=1, memory_mb=128), ttl_s=60,
                                   image=img, layer_mb=32)
        assert "img-bud2" not in mgr.session_ids()
        r = await mgr.run(action("echo x", language="bash", image=img, layer_mb=32), allot())
        assert r.status == "SandboxError" and "layer budget" in r.message
        r = await sh(mgr, "img-bud1", "echo still > /workdir/s && cat /workdir/s")
        assert r.status == "Success" and "still" in r.run_result.stdout
        await mgr.close_session("img-bud1")
        await mgr.open_session("img-bud2", Resources(cpu=1, memory_mb=128), ttl_s=60, image=img,
                               layer_mb=32)  # its cap came back with the closed session
        await mgr.close_session("img-bud2")
    finally:
        mgr.layers.budget_mb = budget
        for sid in ("img-bud1", "img-bud2"):
            await mgr.close_session(sid)
