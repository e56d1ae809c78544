"""Supervision of the sandbox fork server: the reaper that is its parent, its start, its death
and its restart with backoff, and the readiness that follows from them.

Runs in: the service process (asyncio), for one `CpuManager`.
Holds: the fork server (`Zygote`), the reaper (`Reaper`), the block of host ids the sandboxes
use, the generation of fork servers, their deaths and restarts.
Invariant: at most one restart runs at a time; once `stop` is called no fork server is started
again. A death is counted once (`died`); after `fork_server_max_crashes` within
`fork_server_crash_window_s` the node is down (`WarmPool.down`: waiting takes fail with the
reason) and tried again every `fork_server_down_retry_s`; a restart after the first death of a
window waits `fork_server_restart_backoff_s`, doubled per further death, up to
`RESTART_BACKOFF_MAX_S` (the settings are `CpuManagerConfig`'s).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from typing import Any

from ..config import CpuManagerConfig
from . import ids
from .client import Zygote
from .pool import WarmPool
from .reaper import Reaper
from .tasks import cancel_and_wait

log = logging.getLogger(__name__)

RESTART_BACKOFF_MAX_S = 5.0


class ForkServerSupervisor:
    """Starts the fork server under its reaper and restarts it when it dies."""

    def __init__(self, config: CpuManagerConfig) -> None:
        self.config = config
        self.zygote: Zygote | None = None
        # cleans what is left when the service dies, and is the fork server's parent (issue 41)
        self.watchdog: Reaper | None = None
        self.ids: ids.Block | None = None  # the block of host ids this manager's sandboxes use
        self.gen = 0  # fork servers started so far: a sandbox of an older one died with it
        self.not_ready: str | None = None  # why the node is not ready (None: ready)
        self.restarts = 0  # fork server restarts that came up
        self.deaths = 0  # fork server deaths seen
        self._wcfg: dict[str, Any] = {}  # what the reaper cleans (`reaper.server`)
        self._zcfg: dict[str, Any] = {}  # the fork server's configuration
        self._join_dirs: list[str] = []
        self._pool: WarmPool | None = None
        self._crashes: collections.deque[float] = collections.deque()
        self._restarter: asyncio.Task[None] | None = None
        self._stopped = False

    # start -------------------------------------------------------------------------------------
    def start_reaper(self, cgroups: list[str]) -> None:
        """The reaper, cleaning ``cgroups`` when the service dies; none (logged) when it cannot
        start. Before the first sandbox: whatever the manager makes from here, it cleans."""
        self._wcfg = {"cgroups": cgroups}
        try:
            self.watchdog = Reaper(self._wcfg)
        except OSError as e:
            log.error("CPU manager: no reaper (a killed service leaves its sessions until the "
                      "next start): %s", e)

    def configure_reaper(self, **more: Any) -> None:
        """Tell the reaper what else it cleans (the freezer, the layer files)."""
        self._wcfg.update(more)
        if self.watchdog is not None:
            try:
                self.watchdog.configure(**self._wcfg)
            except OSError as e:
                log.error("CPU manager: the reaper: %s", e)

    async def claim_ids(self) -> None:
        """The configured block of host ids (`host/ids.py`); OSError or ValueError when it
        cannot be had."""
        cfg = self.config
        self.ids = await asyncio.to_thread(ids.claim, cfg.sandbox_id_base, cfg.sandbox_id_count)

    async def start(self, zcfg: dict[str, Any], join_dirs: list[str]) -> dict[str, Any]:
        """The first fork server, under the reaper where it can; its hello."""
        self._zcfg, self._join_dirs = zcfg, list(join_dirs)
        work_root = self.config.work_root
        try:
            z = Zygote(zcfg, work_root, join_dirs, self.watchdog)
        except OSError as e:  # (the reaper broke: the fork server as the service's child)
            if self.watchdog is None:
                raise
            log.error("CPU manager: the reaper cannot start the fork server (%s); running "
                      "without it", e)
            self.watchdog.close()
            self.watchdog = None
            z = Zygote(zcfg, work_root, join_dirs)
        self.zygote, self.gen = z, 1
        return await asyncio.to_thread(z.wait_hello)

    def supervise(self, pool: WarmPool) -> None:
        """From now on a death of the fork server (seen by ``pool``) restarts it."""
        self._pool = pool
        pool.on_broken = self.died

    # death and restart --------------------------------------------------------------------------
    def died(self) -> None:
        """The fork server is gone (its pidfd fired or its socket closed): the node is not ready
        until a new one is up (`_restart`); the pool's takes wait for it meanwhile."""
        if self._stopped:
            return
        z = self.zygote
        why = z.gone if z is not None and z.gone else "the sandbox fork server died"
        self.deaths += 1
        self.not_ready = f"{why}; restarting it"
        log.warning("CPU manager: %s (pid %s); restarting it", why,
                    z.proc.pid if z is not None else "?")
        if self._restarter is None or self._restarter.done():
            self._restarter = asyncio.create_task(self._restart(), name="cpu-zygote-restart")

    def _down_for(self) -> str | None:
        """The death just seen counted in the window: why the node is down, or None."""
        now, window = time.monotonic(), self.config.fork_server_crash_window_s
        self._crashes.append(now)
        while self._crashes and self._crashes[0] < now - window:
            self._crashes.popleft()
        n = len(self._crashes)
        if n >= self.config.fork_server_max_crashes:
            return f"the sandbox fork server died {n} times within {window:g} s: node marked down"
        return None

    async def _restart(self) -> None:
        """Reap the dead fork server, start a new one (backing off on repeated deaths; after
        `fork_server_max_crashes` within `fork_server_crash_window_s` the node is marked down
        and tried again every `fork_server_down_retry_s`), hand it to the pool, which refills."""
        assert self._pool is not None
        pool, cfg = self._pool, self.config
        while not self._stopped:
            await self._reap_old()
            why = self._down_for()
            if why is not None:
                self.not_ready = why
                pool.down = why
                pool.up.set()  # (waiting takes fail now, with the reason)
                log.error("CPU manager: %s; trying again in %g s", why,
                          cfg.fork_server_down_retry_s)
                await asyncio.sleep(cfg.fork_server_down_retry_s)
                self._crashes.clear()
                if self._stopped:
                    return
                pool.up.clear()
                pool.down = None
            elif len(self._crashes) > 1:
                await asyncio.sleep(min(cfg.fork_server_restart_backoff_s
                                        * 2 ** (len(self._crashes) - 2), RESTART_BACKOFF_MAX_S))
            if self._stopped:
                return
            if await self._start_new(pool):
                return

    async def _reap_old(self) -> None:
        old = self.zygote
        if old is None:
            return
        old.on_broken = None
        with contextlib.suppress(OSError):
            old.proc.kill()
        with contextlib.suppress(Exception):  # reaped: no zombie
            await asyncio.to_thread(old.proc.wait, 5)
        old.close("the sandbox fork server died")

    async def _start_new(self, pool: WarmPool) -> bool:
        """One try at a new fork server handed to ``pool``: True when it is up (or stopped)."""
        t0 = time.monotonic()
        held: set[int] = set()
        if self.ids is not None:  # the dead one's sandboxes may not all be gone yet
            self._zcfg["ids_busy"] = sorted(await asyncio.to_thread(
                ids.uids_in_use, self.ids.first, self.ids.count))
            # (and its sessions live on, on their ids: not lent until they end)
            held = set(pool.orphan_ids)
            self._zcfg["ids_held"] = sorted(held)
        if self.watchdog is not None and self.watchdog.proc.poll() is not None:
            # the reaper died (its fork server with it): a new one (the old one's
            # orphaned sessions went to the host's init, which reaps them)
            log.error("CPU manager: the reaper died (%s); starting a new one",
                      self.watchdog.proc.returncode)
            try:
                self.watchdog = Reaper(self._wcfg)
            except OSError as e:
                log.error("CPU manager: no reaper: %s", e)
                self.watchdog = None
        try:
            z = Zygote(self._zcfg, self.config.work_root, self._join_dirs, self.watchdog)
        except OSError as e:
            log.warning("CPU manager: cannot start the sandbox fork server: %s", e)
            self.zygote = None
            return False
        self.zygote = z
        hello = await asyncio.to_thread(z.wait_hello, 10.0)
        if self._stopped:
            z.close()
            return True
        if not hello.get("ok"):
            log.warning("CPU manager: the new sandbox fork server failed: %s", hello.get("error"))
            return False
        self.gen += 1
        pool.attach_zygote(z)
        z.give_ids(sorted(held - pool.orphan_ids))  # (sessions that ended meanwhile)
        pool.down = None
        pool.up.set()
        pool._wake.set()  # refill the warm pool
        self.restarts += 1
        self.not_ready = None
        log.warning("CPU manager: sandbox fork server restarted (pid %d) in %.3f s",
                    z.proc.pid, time.monotonic() - t0)
        return True

    # stop --------------------------------------------------------------------------------------
    async def stop(self) -> None:
        """No restart from now on; one under way is cancelled."""
        self._stopped = True
        await cancel_and_wait(self._restarter)

    def close_fork_server(self) -> None:
        """After the pool: the fork server ends (touches the event loop: stay on its thread)."""
        if self.zygote is not None:
            self.zygote.close()

    def close_ids(self) -> None:
        """After the fork server: its sandboxes are gone with it."""
        if self.ids is not None:
            self.ids.close()
            self.ids = None

    async def close_reaper(self) -> None:
        """Last: it cleans whatever the manager's close left."""
        if self.watchdog is not None:
            await asyncio.to_thread(self.watchdog.close)
            self.watchdog = None
