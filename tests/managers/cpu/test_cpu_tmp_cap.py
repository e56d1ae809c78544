"""Issue 25 (the review's 7, `abuse/disktmp.py`): filling a sandbox's /tmp answers ENOSPC, never
"memory limit exceeded". /workdir + /tmp is one tmpfs whose pages are charged to the sandbox's
memory cgroup; it was `workdir_max_mb` (256) whatever the action's memory limit, so under a
128 MB limit (or, with its unbounded inodes, a file flood under any limit) the program was killed
for memory instead. Now the tmpfs is at most half the memory limit (remounted by the init when
the limit is small: `payload.tmpfs_mb`) with a bounded inode count, for one-shot actions (the
Python direct path and the general one) and sessions. Real sandboxes (root)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from _cpu_helpers import TEST_UID, action, allot

from arl_tangram.core.actions import ActionKind
from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig
from arl_tangram.managers.cpu.host.payload import tmpfs_mb

pytestmark = [pytest.mark.integration, pytest.mark.needs_root,
              pytest.mark.asyncio(loop_scope="module")]

FILL = """
import os
n = m = 0
try:
    with open("/tmp/fill.bin", "wb") as f:
        while True:
            f.write(b"x" * (1 << 20)); f.flush(); n += 1
except OSError as e:
    print("tmp", n, e.errno, flush=True)
os.remove("/tmp/fill.bin")
try:
    for i in range(10**7):
        open(f"/tmp/f{i}", "w").close(); m += 1
except OSError as e:
    print("inodes", m, e.errno, flush=True)
"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mgr() -> AsyncIterator[CpuManager]:
    if os.geteuid() != 0:
        pytest.fail("sandboxes need root (namespaces, cgroups)")
    root = tempfile.mkdtemp(prefix="tangram-cpu-tmpcap-")
    m = CpuManager(CpuManagerConfig(work_root=root, sandbox_uid=TEST_UID, sandbox_gid=TEST_UID,
                                    workdir_max_mb=256, warm_min=1, warm_max=2,
                                    default_memory_mb=512))
    await m.start()
    yield m
    await m.aclose()


async def test_tmpfs_is_at_most_half_the_memory_limit() -> None:
    cfg = CpuManagerConfig(workdir_max_mb=256)
    assert tmpfs_mb(512 << 20, cfg) == 256
    assert tmpfs_mb(4096 << 20, cfg) == 256
    assert tmpfs_mb(128 << 20, cfg) == 64
    assert tmpfs_mb(1 << 20, cfg) == 1


@pytest.mark.parametrize("mem_mb", [64, 128, 512])
@pytest.mark.parametrize("language", ["python", "bash"])
async def test_filling_tmp_is_enospc_not_a_memory_kill(mgr: CpuManager, mem_mb: int,
                                                       language: str) -> None:
    code = FILL if language == "python" else (
        "n=0; while head -c 1048576 /dev/zero >> /tmp/fill.bin 2>/dev/null; do n=$((n+1)); "
        "done; echo tmp $n 28; rm /tmp/fill.bin; m=0; "
        "while : 2>/dev/null > /tmp/f$m; do m=$((m+1)); done; echo inodes $m 28")
    r = await mgr.run(action(code, language=language, run_timeout=30, memory_limit_MB=mem_mb),
                      allot(memory_mb=mem_mb))
    assert r.status == "Success" and not r.memory_exceeded, r.to_dict()
    assert r.run_result is not None
    lines = dict(ln.split(" ", 1) for ln in r.run_result.stdout.splitlines())
    cap = min(256, mem_mb // 2)
    filled, err = map(int, lines["tmp"].split())
    assert err == 28 and cap - 2 <= filled <= cap, r.run_result.stdout  # ENOSPC at the cap
    made, err = map(int, lines["inodes"].split())
    assert err == 28 and made <= cap * 256, r.run_result.stdout
    assert r.peak_memory_mb is not None and r.peak_memory_mb < mem_mb, r.to_dict()


async def test_a_session_with_a_small_memory_limit_has_a_small_tmp(mgr: CpuManager) -> None:
    await mgr.open_session("tmpcap", {"cpu": 1, "memory_mb": 100}, ttl_s=60)
    try:
        for _ in range(2):  # (the second action finds it already that size)
            r = await mgr.run(action("df -m /tmp | tail -1", kind=ActionKind.TOOL,
                                     session="tmpcap", language="bash"), allot(memory_mb=100))
            assert r.status == "Success" and r.run_result is not None, r.to_dict()
            assert r.run_result.stdout.split()[1] == "50", r.run_result.stdout
    finally:
        await mgr.close_session("tmpcap")
