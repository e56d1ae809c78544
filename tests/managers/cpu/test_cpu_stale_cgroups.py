"""Issue 25, nothing outlives a dead service (the review's 2c): the stale-cgroup cleanup at start
goes on past a busy slot (it used to stop at the first), kills what is left in a dead manager's
slots and retries, logging each one it cannot remove; after a kill -9 of a manager with a frozen
session open, the next start leaves no cgroup and no process of the dead one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
from _cpu_helpers import TEST_UID, procs_of_uid

from arl_tangram.core.errors import IsolationUnavailable
from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig
from arl_tangram.managers.cpu.host import cgroups
from arl_tangram.managers.cpu.host.cgroups import CgroupTree, _remove_stale

pytestmark = [pytest.mark.integration, pytest.mark.needs_root]


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _v1_parents(tree: CgroupTree) -> dict[str, str]:
    if tree.version != "v1":
        pytest.skip("cgroup v1 hierarchies needed for this scenario")
    return {c: os.path.dirname(b) for c, b in tree.bases.items()}


def test_remove_stale_goes_on_past_a_busy_slot(caplog: pytest.LogCaptureFixture) -> None:
    if os.geteuid() != 0:
        pytest.skip("cgroups need root")
    tree = CgroupTree()
    try:
        parents = _v1_parents(tree)
        dead = _dead_pid()
        slots = [f"s{i}" for i in range(1, 7)]
        for parent in parents.values():
            for s in slots:
                os.makedirs(f"{parent}/tangram-{dead}/{s}")
        busy = subprocess.Popen(["sleep", "60"])
        try:
            for parent in parents.values():  # the first slot, in every hierarchy, is busy
                with open(f"{parent}/tangram-{dead}/s1/cgroup.procs", "w") as f:
                    f.write(str(busy.pid))
            left = _remove_stale(parents["cpu"], rounds=1)
            # every other slot went, though the first was busy
            base = f"{parents['cpu']}/tangram-{dead}"
            assert [d for d in sorted(os.listdir(base))
                    if os.path.isdir(f"{base}/{d}")] == ["s1"], left
            assert f"{parents['cpu']}/tangram-{dead}/s1" in left
            assert any("not removed yet" in r.getMessage() for r in caplog.records)
            assert busy.wait(5) == -signal.SIGKILL  # what was left in it was killed
            left = tree.remove_stale(rounds=40)
            assert left == [], left
            for parent in parents.values():
                assert not os.path.exists(f"{parent}/tangram-{dead}")
        finally:
            if busy.poll() is None:
                busy.kill()
                busy.wait()
    finally:
        tree.close()


_CHILD = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, {tests!r})
    from _cpu_helpers import action, allot
    from arl_tangram.core.actions import ActionKind
    from arl_tangram.core.resources import Resources
    from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig

    async def main():
        m = CpuManager(CpuManagerConfig(work_root={root!r}, sandbox_uid={uid},
                                        sandbox_gid={uid}, warm_min=2, warm_max=4,
                                        sandbox_id_count=0))
        await m.start()
        await m.open_session("s", Resources(cpu=1, memory_mb=256), 600)
        r = await m.run(action("x = 1", kind=ActionKind.TOOL, session="s"), allot())
        print(r.status, flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
""")


def test_kill_9_with_a_frozen_session_then_start_leaves_nothing(tmp_path) -> None:
    if os.geteuid() != 0:
        pytest.skip("sandboxes need root")
    import asyncio

    uid = TEST_UID + 1
    root = tempfile.mkdtemp(prefix="tangram-cpu-test-")
    code = _CHILD.format(tests=os.path.dirname(__file__), root=root, uid=uid)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline() if child.stdout else ""
        if "Success" not in line:
            pytest.skip(f"the child manager could not run a session action: {line!r}")
        time.sleep(0.3)
        assert procs_of_uid(uid), "the session's processes should be there (frozen)"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    dead = child.pid
    time.sleep(0.5)

    async def start_and_stop() -> None:
        m = CpuManager(CpuManagerConfig(work_root=tempfile.mkdtemp(prefix="tangram-cpu-test-"),
                                        sandbox_uid=TEST_UID, sandbox_gid=TEST_UID,
                                        warm_min=1, warm_max=2))
        try:
            await m.start()
        except IsolationUnavailable as e:
            pytest.skip(f"isolation unavailable here: {e}")
        await m.aclose()

    asyncio.run(start_and_stop())
    deadline = time.monotonic() + 5
    while procs_of_uid(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert procs_of_uid(uid) == [], "a dead manager's session processes outlived the restart"
    left = []
    for kind, mnt, _opts in cgroups._mounts():
        if kind != "cgroup":
            continue
        for dirpath, dirnames, _ in os.walk(mnt):
            left += [os.path.join(dirpath, d) for d in dirnames
                     if d.startswith(f"tangram-{dead}")]
            if dirpath.count("/") > 6:
                dirnames[:] = []
    assert left == [], left


_IMAGE_CHILD = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, {tests!r})
    from _cpu_helpers import action, allot
    from arl_tangram.core.actions import ActionKind
    from arl_tangram.core.resources import Resources
    from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig

    async def main():
        m = CpuManager(CpuManagerConfig(work_root={root!r}, sandbox_uid={uid}, sandbox_gid={uid},
                                        image_id_base={base}, warm_min=1, warm_max=2,
                                        layers_dir={root!r} + "/layers",
                                        images_dir={root!r} + "/images"))
        await m.start()
        m.images.import_path({tar!r}, "mini")
        await m.open_session("s", Resources(cpu=1, memory_mb=256), 600, image="mini")
        r = await m.run(action("head -c 3000000 /dev/zero > /srv/f; echo done",
                               kind=ActionKind.TOOL, session="s", language="bash"), allot())
        print(r.status, flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
""")


def _loop_backing_files() -> list[str]:
    out = []
    for dev in os.listdir("/sys/block"):
        try:
            with open(f"/sys/block/{dev}/loop/backing_file") as f:
                out.append(f.read().strip())
        except OSError:
            pass
    return out


def test_kill_9_with_an_image_session_then_start_leaves_no_mount_loop_or_layer(tmp_path) -> None:
    """Issue 25's acceptance: a manager killed with an image session open (its processes in the
    node's user namespace, its writable layer an ext4 on a loop device, an overlay mount) leaves,
    after the next start, no process, cgroup, mount, loop device or layer file of it."""
    from arl_tangram.managers.cpu.images import imagekit

    uid, base = TEST_UID + 2, (1 << 30) + (1 << 20)  # (ids no other test uses)
    img = imagekit.pack_layer(imagekit.host_rootfs(str(tmp_path / "rootfs")),
                              str(tmp_path / "mini.tar.gz"), gzip_it=True)
    root = tempfile.mkdtemp(prefix="tangram-cpu-test-")
    code = _IMAGE_CHILD.format(tests=os.path.dirname(__file__), root=root, uid=uid, base=base,
                               tar=img)
    loops_before = set(_loop_backing_files())
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline() if child.stdout else ""
        assert "Success" in line, f"the child manager could not run an image session: {line!r}"
        time.sleep(0.3)
        assert procs_of_uid(base) or procs_of_uid(uid), "the session's processes should be there"
        assert set(_loop_backing_files()) - loops_before, "its layer should be on a loop device"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    dead = child.pid

    import asyncio

    async def start_and_stop() -> None:
        m = CpuManager(CpuManagerConfig(work_root=root, sandbox_uid=uid, sandbox_gid=uid,
                                        image_id_base=base, warm_min=1, warm_max=2,
                                        layers_dir=root + "/layers", images_dir=root + "/images"))
        await m.start()
        await m.aclose()

    asyncio.run(start_and_stop())
    deadline = time.monotonic() + 5
    while (procs_of_uid(base) or procs_of_uid(uid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert procs_of_uid(base) == [] and procs_of_uid(uid) == [], "session processes outlived it"
    deadline = time.monotonic() + 5  # (a loop device clears once its last mount is gone)
    while set(_loop_backing_files()) - loops_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(_loop_backing_files()) - loops_before == set(), _loop_backing_files()
    with open("/proc/self/mountinfo") as f:
        mounts = [ln for ln in f if root in ln or "tangram-layer" in ln]
    assert mounts == [], mounts
    layers = [n for n in os.listdir(os.path.join(root, "layers")) if n.startswith(f"{dead}-")]
    assert layers == [], layers  # (the dead manager's layer files: `layers.LayerPool`)
    left = []
    for kind, mnt, _opts in cgroups._mounts():
        if kind == "cgroup":
            for dirpath, dirnames, _ in os.walk(mnt):
                left += [os.path.join(dirpath, d) for d in dirnames if d.startswith(f"tangram-{dead}")]
                if dirpath.count("/") > 6:
                    dirnames[:] = []
    assert left == [], left
