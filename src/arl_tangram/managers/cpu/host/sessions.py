"""The CPU manager's sessions: open, close, run an action in one, reap the idle, freeze and thaw
between actions, reclaim an idle one's page cache, and report their memory.

Runs in: the service process (asyncio), for one `CpuManager`.
Holds: the open sessions (`by_id`), the reasons of those whose open failed (`refused`), the
idle reaper task.
Invariant: a session's actions run only in its own sandbox, one at a time (its lock); between
actions a session with a freezer is frozen, so it holds memory, not CPU; a session whose sandbox
died, or whose action ended in a sandbox error, is closed and says so. A closed session gives
back its freezer (thawed first: a frozen task cannot die), its sandbox, its layer and its image.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Protocol

from arl_tangram.core.actions import ActionSpec
from arl_tangram.core.errors import BrokenError, ClosedError
from arl_tangram.core.resources import Resources
from arl_tangram.kinds import RunResult, RunStatus

from ..config import CpuManagerConfig
from ..images.layers import LayerError, LayerStore
from ..images.store import Image, ImageError, ImageStore
from . import overlay, payload
from .cgroups import CgroupTree
from .payload import SandboxRequest
from .pool import Sandbox, WarmPool
from .tasks import cancel_and_wait

log = logging.getLogger(__name__)

REFUSED_KEPT = 4096  # sessions whose open failed whose reason is kept (`SessionTable.refused`)


@dataclass(slots=True, eq=False)
class Session:
    sandbox: Sandbox
    ttl_s: float
    cpu: float
    memory: int
    last_used: float
    lock: asyncio.Lock
    image: Image | None = None  # the environment image it runs in (issue 17)
    inside: overlay.Inside | None = None  # that image's python3, user, cwd (as its init said)
    freezer: overlay.Freezer | None = None  # frozen between actions
    layer_mb: int = 0  # its writable layer's cap, held on the node's disk (`layers.py`)
    owner: str | None = None  # whose share of the layer budget its layer counts against
    # its memory as last read while frozen (`memory_use`): a frozen session cannot allocate,
    # so between its refreshes this is what is reported (None: read it on the next report)
    frozen_mem: int | None = None


class SessionHost(Protocol):
    """What the table borrows of its manager (`CpuManager`): new sandboxes, images and
    layers, an action's quota, and the exchange of one action with a sandbox (its registration
    for cancels and resizes, and the fork server's death, are the manager's)."""

    images: ImageStore | None
    layers: LayerStore | None

    async def take_sandbox(self, spawn: bool = False) -> Sandbox: ...

    async def enter_image(self, sb: Sandbox, img: Image, layer_mb: int,
                          owner: str | None = None) -> tuple[int, overlay.Inside]: ...

    def quota_of(self, action_id: str, default: float) -> float: ...

    async def exchange(self, action_id: str, sb: Sandbox, req: SandboxRequest,
                       mem: int) -> RunResult: ...


class SessionTable:
    """The open sessions of one CPU manager."""

    def __init__(self, config: CpuManagerConfig, host: SessionHost) -> None:
        self.config = config
        self.host = host
        self.by_id: dict[str, Session] = {}
        # sessions whose open failed, and why (the latest `REFUSED_KEPT`): an action naming
        # one is told the reason, not only that it is not open (issue 41, M3)
        self.refused: collections.OrderedDict[str, str] = collections.OrderedDict()
        self.closed = False
        self.memory_calls = 0  # `memory_use` calls so far
        self.memory_reads = 0  # sessions whose cgroup the last `memory_use` read
        self._pool: WarmPool | None = None
        self._cgroups: CgroupTree | None = None
        self._freezers: overlay.FreezerTree | None = None
        self._reaper: asyncio.Task[None] | None = None

    def start(self, pool: WarmPool, cgroups: CgroupTree,
              freezers: overlay.FreezerTree | None) -> None:
        """Sessions can be opened from now on; the idle ones are reaped."""
        self._pool, self._cgroups, self._freezers = pool, cgroups, freezers
        self._reaper = asyncio.create_task(self._reap(), name="cpu-session-reaper")

    async def aclose(self) -> None:
        """Every session closed, the reaper stopped."""
        self.closed = True
        await cancel_and_wait(self._reaper)
        for sid in list(self.by_id):
            await self.close(sid)

    # open and close ----------------------------------------------------------------------------
    async def open(self, session_id: str, demand: Resources, ttl_s: float,
                   image: str | None = None, layer_mb: int | None = None,
                   owner: str | None = None) -> None:
        """See `CpuManager.open_session`. When it cannot be opened, the reason is kept."""
        try:
            await self._open(session_id, demand, ttl_s, image, layer_mb, owner)
        except Exception as e:
            self.refused[session_id] = f"{type(e).__name__}: {e}"
            while len(self.refused) > REFUSED_KEPT:
                self.refused.popitem(last=False)
            raise
        self.refused.pop(session_id, None)

    async def _open(self, session_id: str, demand: Resources, ttl_s: float,
                    image: str | None, layer_mb: int | None, owner: str | None) -> None:
        if self.closed or self._pool is None:
            raise ClosedError("the CPU manager is closed")
        if session_id in self.by_id:
            return
        images = self.host.images
        img = images.acquire(image) if image is not None and images else None
        if image is not None and img is None:
            raise ImageError("no image cache on this node")
        try:
            sb = await self.host.take_sandbox(spawn=True)  # never a pooled one: a session is long-lived
        except BaseException:
            if img is not None and images is not None:
                images.release(img.name)
            raise
        cpus = float(demand.get("cpu", 0.0)) or self.config.default_cpus
        mem = int((float(demand.get("memory_mb", 0.0)) or self.config.default_memory_mb) * (1 << 20))
        s = Session(sb, float(ttl_s), cpus, mem, time.monotonic(), asyncio.Lock(), img,
                    owner=owner)
        self.by_id[session_id] = s
        try:
            await self._prepare(session_id, s, layer_mb)
        except BaseException:
            await self.close(session_id)
            raise

    async def _prepare(self, session_id: str, s: Session, layer_mb: int | None) -> None:
        """``s``'s limits, its image entered, its init kept past the fork server, frozen."""
        sb = s.sandbox
        sb.set_limits(s.cpu, s.memory)
        if s.image is not None and self.host.images is not None:
            mb = int(layer_mb or self.config.image_layer_mb)
            try:
                s.layer_mb, s.inside = await self.host.enter_image(sb, s.image, mb, s.owner)
            except LayerError as e:
                raise ImageError(str(e)) from None
        # its init outlives the fork server (no PR_SET_PDEATHSIG): a fork server's crash
        # loses only the actions in flight in its sandboxes, never a session's state
        # (issue 41, item 4; when the fork server dies it goes to the reaper, a subreaper).
        # After the image: entering one changes the init's uid, which sets it again.
        kept = await sb.request({"op": "keep"}, 10.0)
        if not kept.get("ok"):
            raise BrokenError(f"session {session_id!r}: its sandbox: {kept.get('error')}")
        sb.kept = True
        if self._freezers is not None and self._freezers.available:
            s.freezer = self._freezers.new(sb.slot)
            if s.freezer is not None:
                # its init by pid (what it forks later inherits the freezer): a self-joining
                # init may not be in its slot yet when the spawn returns (`pool.self_join`)
                s.freezer.add(sorted({sb.pid, *overlay.slot_pids(sb.slot)}))
                s.freezer.freeze()

    async def close(self, session_id: str) -> None:
        s = self.by_id.pop(session_id, None)
        if s is None:
            return
        if s.freezer is not None and self._freezers is not None:
            self._freezers.drop(s.freezer)  # thawed: a frozen task cannot die
        if self._pool is not None:
            self._pool.release(s.sandbox)
        if s.layer_mb and self.host.layers is not None:
            self.host.layers.give_back(s.layer_mb, s.owner)
        if s.image is not None and self.host.images is not None:
            self.host.images.release(s.image.name)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(self.config.session_reap_interval_s)
            now = time.monotonic()
            for sid, s in list(self.by_id.items()):
                if not s.lock.locked() and now - s.last_used > s.ttl_s:
                    await self.close(sid)

    # an action in a session --------------------------------------------------------------------
    async def run(self, action: ActionSpec, req: SandboxRequest) -> RunResult:
        """``action`` in its session's sandbox, thawed for it with its quota and frozen after."""
        sid = str(action.session)
        s = self.by_id.get(sid)
        if s is None:
            why = self.refused.get(sid)
            return RunResult.sandbox_error(f"session {sid!r} is not open on this node" + (
                f": it could not be opened ({why})" if why else ""))
        req = as_own_ids(s.sandbox, req)
        if s.image is not None:
            req = overlay.image_request(req, s.image, s.inside, None)
        elif payload.tmpfs_mb(s.memory, self.config) < self.config.workdir_max_mb:
            req = {**req, "tmpfs_mb": payload.tmpfs_mb(s.memory, self.config)}
        host = self.host
        async with s.lock:
            s.last_used = time.monotonic()
            # the action's quota is the session's: its allotment, or a resize that came while
            # it waited for the session (no await from here until its sandbox is registered)
            s.cpu = host.quota_of(action.id, req["quota"])
            sw = self._thaw(s)
            if s.sandbox.slot is not None:
                s.sandbox.slot.reset_stats()
            try:
                res = await host.exchange(action.id, s.sandbox, req, s.memory)
            finally:
                s.last_used = time.monotonic()
                self._freeze(s, sw)
            if sw is not None:
                res = dataclasses.replace(res, session_switch=sw.to_dict())
        if s.sandbox.dead or res.status == RunStatus.SandboxError:
            await self.close(sid)
            if res.status == RunStatus.SandboxError and "session" not in res.message:
                res = dataclasses.replace(res, message=f"the session's sandbox ended "
                                          f"({res.message}); session {sid!r} is closed, its "
                                          "state lost: open a new one")
        return res

    @staticmethod
    def _thaw(s: Session) -> overlay.SessionSwitch | None:
        """``s`` thawed with the action's quota (`Session.cpu`); what that cost (None: it has
        no freezer)."""
        if s.freezer is None:
            return None
        sw = overlay.SessionSwitch()
        s.frozen_mem = None  # (read again from its thaw until after it is frozen again)
        t0 = time.perf_counter()
        s.freezer.thaw()
        t1 = time.perf_counter()
        s.sandbox.set_limits(s.cpu, s.memory)
        sw.thaw_s, sw.requota_s = t1 - t0, time.perf_counter() - t1
        return sw

    @staticmethod
    def _freeze(s: Session, sw: overlay.SessionSwitch | None) -> None:
        """``s`` frozen again after its action: its CPUs go back."""
        if s.freezer is None or sw is None or s.sandbox.dead:
            return
        t0 = time.perf_counter()
        try:
            sw.frozen = s.freezer.freeze()
        except OSError:
            sw.frozen = False
        sw.freeze_s = time.perf_counter() - t0

    # memory ------------------------------------------------------------------------------------
    async def reclaim(self, session_id: str) -> int:
        """See `CpuManager.reclaim_session`."""
        s = self.by_id.get(session_id)
        if s is None or s.sandbox.slot is None or s.freezer is None:
            return 0
        async with s.lock:  # (no action thaws it meanwhile)
            if not s.freezer.frozen or s.sandbox.dead:
                return 0
            slot = s.sandbox.slot
            try:
                freed = await asyncio.to_thread(slot.reclaim)
            except (OSError, ValueError) as e:
                log.warning("CPU manager: reclaiming session %s: %s", session_id, e)
                return 0
            s.frozen_mem = None  # (read again on the next report)
            return freed

    async def reclaim_idle(self, need_bytes: int) -> int:
        """See `CpuManager.reclaim_idle`."""
        order = sorted(((s.frozen_mem or 0, sid) for sid, s in self.by_id.items()
                        if s.freezer is not None and s.freezer.frozen and not s.lock.locked()),
                       reverse=True)
        freed = 0
        for _, sid in order:
            if freed >= need_bytes:
                break
            freed += await self.reclaim(sid)
        return freed

    def memory_use(self) -> tuple[dict[str, tuple[int, int]], int]:
        """See `CpuManager.memory_use`."""
        out: dict[str, tuple[int, int]] = {}
        self.memory_calls += 1
        every, calls, reads = self.config.frozen_memory_refresh, self.memory_calls, 0
        for i, (sid, s) in enumerate(self.by_id.items()):
            slot = s.sandbox.slot
            if slot is None or s.sandbox.dead:
                continue
            fz = s.freezer
            still = fz is not None and fz.frozen and not s.lock.locked()
            if still and s.frozen_mem is not None and every and (i + calls) % every:
                out[sid] = (s.frozen_mem, s.frozen_mem)
                continue
            reads += 1
            try:
                out[sid] = slot.memory_sample()
            except (OSError, ValueError):
                continue
            s.frozen_mem = out[sid][0] if still else None
        self.memory_reads = reads
        total = self._cgroups.memory_bytes() if self._cgroups is not None else 0
        return out, max(0, total - sum(cur for cur, _ in out.values()))


def as_own_ids(sb: Sandbox, req: SandboxRequest) -> SandboxRequest:
    """``req`` run as ``sb``'s own host uid and gid (`Sandbox.uid`; `build_request` wrote the
    configured `sandbox_uid`/`sandbox_gid`, which are its own when every sandbox shares them).
    An image's user (`overlay.image_request`) is applied after this, over it."""
    lim = req["limits"]
    if lim["uid"] == sb.uid or sb.uid < 0:  # (the shared uid: its gid as configured)
        return req
    return {**req, "limits": {**lim, "uid": sb.uid, "gid": sb.uid}}
