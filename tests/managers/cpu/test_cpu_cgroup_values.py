# ruff: noqa: F811  (the module-scoped `mgr` fixture is imported, then requested)
"""The cgroup limits in force, read back from the kernel's files (issue 43).

- memory: the limit an action asks for is written as its memory limit *and* as its memory+swap
  limit (v1 ``memory.memsw.limit_in_bytes``; v2 ``memory.swap.max`` 0): a sandbox cannot swap
  past its limit; raising and lowering a slot's limit keeps the two equal;
- CPU weight: relative to a normal task, 1.0 is the kernel's default weight (v1 ``cpu.shares``
  1024; v2 ``cpu.weight`` 100), a warming sandbox 0.25 of it; a running action has 1.0.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from _cpu_fixture import mgr  # noqa: F401
from _cpu_helpers import action, allot, registered

from arl_tangram.managers.cpu import CpuManager
from arl_tangram.managers.cpu.host.cgroups import Slot
from arl_tangram.managers.cpu.host.pool import WARMING_WEIGHT

MiB = 1 << 20
V1 = "/sys/fs/cgroup"


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def _v1_has(controller: str, file: str) -> bool:
    return os.path.exists(f"{V1}/{controller}/{file}")


@pytest.fixture
def v1_slot() -> Iterator[Slot]:
    """A slot of real v1 cgroups (cpu, memory) made for the test, removed after it."""
    if os.geteuid() != 0 or not _v1_has("memory", "memory.memsw.limit_in_bytes") \
            or not _v1_has("cpu", "cpu.shares"):
        pytest.skip("needs root and cgroup v1 memory (with swap accounting) and cpu")
    name = f"tangram-test43-{uuid.uuid4().hex[:8]}"
    dirs = {"cpu": f"{V1}/cpu/{name}", "memory": f"{V1}/memory/{name}"}
    for d in dirs.values():
        os.mkdir(d)
    slot = Slot(name, "v1", dirs)
    try:
        yield slot
    finally:
        for fd in slot._fds.values():
            os.close(fd)
        for d in dirs.values():
            with contextlib.suppress(OSError):
                os.rmdir(d)


@pytest.mark.needs_root
def test_v1_memory_and_memory_plus_swap_limits_are_written_equal(v1_slot: Slot) -> None:
    mem = v1_slot.dirs["memory"]
    for limit in (256 * MiB, 512 * MiB, 64 * MiB, 300 * MiB):  # up, down, up: each order
        v1_slot.set_memory(limit)
        assert int(_read(f"{mem}/memory.limit_in_bytes")) == limit
        assert int(_read(f"{mem}/memory.memsw.limit_in_bytes")) == limit
        assert v1_slot.memory == limit


@pytest.mark.needs_root
def test_v1_cpu_weight_scale(v1_slot: Slot) -> None:
    cpu = v1_slot.dirs["cpu"]
    for fraction, shares in ((1.0, 1024), (WARMING_WEIGHT, 256), (0.5, 512), (2.0, 2048),
                             (0.001, 2)):
        v1_slot.set_weight(fraction)
        assert int(_read(f"{cpu}/cpu.shares")) == shares, fraction
        assert v1_slot.weight == fraction


def _v2_slot(d: Path) -> Slot:
    for f in ("cpu.weight", "memory.max", "memory.swap.max"):
        (d / f).write_text("")
    return Slot("s", "v2", dict.fromkeys(("cpu", "memory", "pids"), str(d)))


@pytest.mark.parametrize("fraction,weight", [(1.0, 100), (WARMING_WEIGHT, 25), (0.5, 50),
                                             (2.0, 200), (0.001, 1)])
def test_v2_cpu_weight_scale(tmp_path: Path, fraction: float, weight: int) -> None:
    # (v2's files as plain files, one slot a value: what the manager writes, as the kernel
    # would read it; this machine's cgroup v2 has no cpu controller)
    slot = _v2_slot(tmp_path)
    try:
        slot.set_weight(fraction)
        assert (tmp_path / "cpu.weight").read_text() == str(weight)
    finally:
        for fd in slot._fds.values():
            os.close(fd)


def test_v2_memory_limit_and_no_swap(tmp_path: Path) -> None:
    slot = _v2_slot(tmp_path)
    try:
        slot.set_memory(256 * MiB)
        assert (tmp_path / "memory.max").read_text() == str(256 * MiB)
        assert (tmp_path / "memory.swap.max").read_text() == "0"
    finally:
        for fd in slot._fds.values():
            os.close(fd)




@pytest.mark.integration
@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("memory_mb,asked,limit_mb", [(256, None, 256), (512, 100, 100)])
async def test_a_running_sandbox_has_its_limits_in_the_kernel(
        mgr: CpuManager, memory_mb: int, asked: int | None, limit_mb: int) -> None:
    # the action sleeps until the test has read its cgroup, then the test cancels it
    extra = {} if asked is None else {"memory_limit_MB": asked}
    spec = action("import time\ntime.sleep(60)\n", **extra)
    task = asyncio.create_task(mgr.run(spec, allot(cpu=1, memory_mb=memory_mb)))
    try:
        sb = await registered(mgr, spec.id)
        assert sb.slot is not None
        slot = sb.slot
        for _ in range(400):  # (the limits are written just after the registration)
            if slot.memory == limit_mb * MiB:
                break
            await asyncio.sleep(0.005)
        mem, cpu = slot.dirs["memory"], slot.dirs["cpu"]
        if slot.version == "v1":
            assert int(_read(f"{mem}/memory.limit_in_bytes")) == limit_mb * MiB
            if os.path.exists(f"{mem}/memory.memsw.limit_in_bytes"):
                assert int(_read(f"{mem}/memory.memsw.limit_in_bytes")) == limit_mb * MiB
            assert int(_read(f"{cpu}/cpu.shares")) == 1024
            assert int(_read(f"{cpu}/cpu.cfs_quota_us")) == int(_read(f"{cpu}/cpu.cfs_period_us"))
        else:
            assert int(_read(f"{mem}/memory.max")) == limit_mb * MiB
            if os.path.exists(f"{mem}/memory.swap.max"):
                assert _read(f"{mem}/memory.swap.max") == "0"
            assert int(_read(f"{cpu}/cpu.weight")) == 100
    finally:
        await mgr.cancel(spec.id)
        r = await asyncio.wait_for(task, 30)
        assert r.status == "SandboxError" and r.message == "cancelled", r
