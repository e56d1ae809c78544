"""Shared helpers for the CPU manager tests (real sandboxes)."""

from __future__ import annotations

import asyncio
import itertools
import os

from arl_tangram.core.actions import ActionKind, ActionSpec
from arl_tangram.core.resources import Resources
from arl_tangram.managers.cpu import CpuManager
from arl_tangram.managers.cpu.host.pool import Sandbox

TEST_UID = 61000 + os.getpid() % 2000  # private uid: leftovers of *this* run are findable
# ... and the private range of host ids the sandboxes of *this* run's managers take theirs from
# (`CpuManagerConfig.sandbox_id_base`; issue 35, M2): four blocks of 4096 ids
TEST_ID_BASE, TEST_ID_COUNT = (1 << 28) + (os.getpid() % 2000) * 16384, 16384
TEST_IDS = {"sandbox_id_base": TEST_ID_BASE, "sandbox_id_count": TEST_ID_COUNT}
_ids = itertools.count()


def action(code: str, *, kind: ActionKind = ActionKind.CODE, session: str | None = None,
           **payload: object) -> ActionSpec:
    return ActionSpec(id=f"t{next(_ids)}", kind=kind, session=session,
                      payload={"code": code, **payload})


def allot(cpu: float = 1, memory_mb: float = 256) -> Resources:
    return Resources(cpu=cpu, memory_mb=memory_mb)


async def registered(m: CpuManager, action_id: str) -> Sandbox:
    """The sandbox ``action_id`` runs in, once the manager has registered it (up to ~20 s)."""
    for _ in range(4000):
        sb = m._running.get(action_id)
        if sb is not None:
            return sb
        await asyncio.sleep(0.005)
    raise AssertionError(f"{action_id} never got its sandbox")


def procs_of_uid(uid: int, count: int = 1) -> list[int]:
    """Processes whose real uid is ``uid`` (``count``: any of ``uid``.. ``uid + count - 1``)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if uid <= int(line.split()[1]) < uid + count:
                            out.append(int(d))
                        break
        except OSError:
            continue
    return out


def describe_procs(pids: list[int]) -> list[str]:
    """Each process as ``pid (name) state S ppid P: cmdline``, for a failure message (one that
    ended meanwhile reads ``pid: gone``)."""
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as fb:
                cmd = fb.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            out.append(f"{pid}: gone")
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
        out.append(f"{pid} ({name}) state {state} ppid {ppid}: {cmd[:200]}")
    return out


async def no_leftovers(uid: int = TEST_UID, within_s: float = 3.0) -> list[int]:
    """Processes of the sandbox uid still alive after ``within_s`` (should be none); for
    `TEST_UID`, also those of this run's sandbox ids (`TEST_IDS`)."""
    left: list[int] = []
    for _ in range(int(within_s / 0.05)):
        left = procs_of_uid(uid)
        if uid == TEST_UID:
            left += procs_of_uid(TEST_ID_BASE, TEST_ID_COUNT)
        if not left:
            return []
        await asyncio.sleep(0.05)
    return left


def pod_pid(result: object) -> int:
    return int(str(result.executor_pod_name).rsplit("-", 1)[1])  # type: ignore[attr-defined]


def work_root_left(root: str) -> list[str]:
    """What actions left in a manager's ``work_root``: nothing but the fork server's (empty)
    mount point `rootfs` and the writable layers' directory, whose backing files are unlinked
    as soon as made (`layers.py`), so it stays empty too."""
    left = [n for n in sorted(os.listdir(root)) if n not in ("rootfs", "layers")]
    layers = os.path.join(root, "layers")
    if os.path.isdir(layers):
        left += [f"layers/{n}" for n in sorted(os.listdir(layers))]
    return left


def layer_loops(layers_dir: str) -> dict[str, int]:
    """Loop devices backed by a file of ``layers_dir``: name -> size in MiB."""
    out = {}
    for name in os.listdir("/sys/block"):
        try:
            with open(f"/sys/block/{name}/loop/backing_file") as f:
                backing = f.read().strip()
            with open(f"/sys/block/{name}/size") as f:
                sectors = int(f.read())
        except OSError:
            continue
        if backing.startswith(layers_dir.rstrip("/") + "/"):
            out[name] = sectors * 512 >> 20
    return out
