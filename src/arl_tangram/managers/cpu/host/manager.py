"""The CPU resource manager: runs code actions in isolated sandboxes from a warm pool.

Invariant: `run` never raises for anything the action contains; every one-shot action gets a
fresh sandbox (own PID, mount, network, IPC and UTS namespaces, own cgroup slot, own tmpfs work
directory) that is destroyed as soon as its reply is in, so nothing leaks between actions.
Session actions run only in their session's sandbox, which lives until closed or idle past TTL.

A facade over its jobs: the fork server's supervision (`supervisor.ForkServerSupervisor`), the
sessions (`sessions.SessionTable`), and here the one-shot runs (pooled, or in an image), the
image cache, layers and user namespace, resizes, cancels and reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import socket
import weakref
from typing import Any

from arl_tangram.core.actions import ActionSpec
from arl_tangram.core.errors import BrokenError, InvalidAction, IsolationUnavailable
from arl_tangram.core.resources import Resources
from arl_tangram.kinds import (
    CaseResult,
    CodeRequest,
    CommandRunStatus,
    RunResult,
    RunStatus,
    StageResult,
    Timeouts,
)

from ..config import CpuManagerConfig
from ..images import layers
from ..images.layers import Layer, LayerStore
from ..images.store import Image, ImageError, ImageStore
from . import direct, isolation, languages, overlay, payload, userns
from .cgroups import CgroupTree, pin, squeezed_cpus
from .payload import SandboxRequest
from .pool import Sandbox, WarmPool
from .sessions import SessionTable
from .sessions import as_own_ids as _as
from .supervisor import ForkServerSupervisor

POOL_KEY = "sandbox"  # every language shares one kind of warm sandbox
log = logging.getLogger(__name__)

TAKE_RETRIES = 3  # an action whose sandbox never came because the fork server died: asked again
# The managers of this process (a local executor's nodes share its machine's CPUs): the CPUs
# one pins its squeezed actions to are not another's to pin to (`CpuManager._reconfine`).
_MANAGERS: weakref.WeakSet[CpuManager] = weakref.WeakSet()


def _raise_open_files() -> None:
    """This process's soft limit of open files raised to its hard limit: each open session
    keeps ~16 fds here (its slot's control files, its freezer's, its connection and pidfd;
    16,260 for 1,000 sessions, benchmarks/bench_sessions.py), past the usual soft 1024 from
    ~60 sessions on. Sandboxes set their own (`max_open_files`)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _inside(paths: list[str], ro: list[str]) -> list[str]:
    """Those of ``paths`` that lie in a directory bound into the sandbox view: only they need a
    mask, and the fork server (whose memory every sandbox inherits) learns no other path."""
    roots = [r.rstrip("/") for r in ro]
    return [p for p in paths if any(p == r or p.startswith(r + "/") for r in roots)]


class CpuManager:
    """Runs CODE, TEST and TOOL actions on this node's cores."""

    def __init__(self, config: CpuManagerConfig | None = None) -> None:
        self.config = config or CpuManagerConfig()
        self.fork = ForkServerSupervisor(self.config)  # the fork server, its reaper, its ids
        self.sessions = SessionTable(self.config, self)
        self._langs: dict[str, languages.Language] = {}
        self._report: dict[str, bool | str] = {}
        self._cgroups: CgroupTree | None = None
        # squeezed actions on CPUs of their own (`squeezed_cpus`): the sandboxes pinned, and to
        # which CPUs (empty: not pinned)
        self._confined: dict[str, Sandbox] = {}
        self._pinned: tuple[int, ...] = ()
        self._pool: WarmPool | None = None
        self._running: dict[str, Sandbox] = {}  # action -> its sandbox, once it has one
        # action -> its CPU quota in cores, from `run` to its end; a resize that comes before
        # the action's sandbox registers in `_running` waits here and is set when it registers
        self._quota: dict[str, float] = {}
        self._started: dict[str, float] = {}  # action id -> the quota it started with
        self._cancelled: set[str] = set()
        self._closed = False
        self._host = socket.gethostname()
        self._env: dict[float, dict[str, str]] = {}  # sandbox environment by CPU count
        self._base_env: dict[str, str] | None = None  # (`wire.encode_direct`'s compact form)
        self.images: ImageStore | None = None  # this node's image cache (`images.py`)
        self.layers: LayerStore | None = None  # writable layers on this node's disk
        # image sandboxes' user namespace (issue 26; None: they run as the sandbox uid)
        self.userns: userns.UserNamespace | None = None
        self._freezers: overlay.FreezerTree | None = None
        # each image sandbox makes a user namespace of its own, owned by its id (`_make_userns`)
        self._own_userns = False

    # life cycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.config
        _raise_open_files()
        self._langs = await languages.detect()
        self._cgroups = CgroupTree(cfg.sandbox_weight)
        _MANAGERS.add(self)
        fork = self.fork
        fork.start_reaper(sorted(set(self._cgroups.bases.values())))
        zcfg = self._fork_server_config()
        if cfg.sandbox_id_count:  # each sandbox on host ids of its own (`host/ids.py`)
            try:
                await fork.claim_ids()
            except (OSError, ValueError) as e:
                await self.aclose()
                raise IsolationUnavailable(f"sandbox ids: {e}") from None
            assert fork.ids is not None
            zcfg["ids"] = [fork.ids.first, fork.ids.count]
        os.makedirs(os.path.join(cfg.work_root, zcfg["root"]), exist_ok=True)
        join_dirs = self._cgroups.join_dirs() if cfg.cgroup_self_join else []
        hello = await fork.start(zcfg, join_dirs)
        assert fork.zygote is not None
        # the sandboxes' own environment: a direct request with it may go in the compact form,
        # which only the compiled set-up path reads (`wire.encode_direct`)
        self._base_env = zcfg["env"] if hello.get("compiled_setup") else None
        self._pool = WarmPool(fork.zygote, self._cgroups, warm_min=cfg.warm_min,
                              warm_max=cfg.warm_max, pids_max=cfg.pids_max,
                              default_cpu=cfg.default_cpus,
                              default_mem=cfg.default_memory_mb << 20,
                              self_join=bool(hello.get("cgroup_join")),
                              direct=cfg.direct_python)
        fork.supervise(self._pool)
        probe = await isolation.probe(self._pool, hello, self._cgroups, cfg) if hello.get("ok") \
            else None
        self._report = isolation.report(hello, probe, self._cgroups, cfg)
        missing = isolation.missing(self._report)
        if missing and not cfg.allow_reduced_isolation:
            await self.aclose()
            raise IsolationUnavailable(
                f"sandbox isolation incomplete, missing: {', '.join(missing)} "
                "(set allow_reduced_isolation=True to run anyway)")
        if not hello.get("ok"):
            await self.aclose()
            raise IsolationUnavailable(f"sandbox fork server failed: {hello.get('error')}")
        self._pool.start()
        await self._start_images()
        self._freezers = overlay.FreezerTree(self._cgroups) if cfg.freeze_sessions else None
        fork.configure_reaper(
            freezer=self._freezers.base if self._freezers is not None else None,
            layers=[self.layers.dir, self.layers.prefix] if self.layers else None)
        # a dead manager's slots its frozen sessions kept busy: free now that they are thawed
        # (each still left is logged; a later start tries again)
        left = await asyncio.to_thread(self._cgroups.remove_stale)
        if left:
            log.error("CPU manager: %d stale cgroup(s) of dead managers left: %s", len(left),
                      ", ".join(left[:8]))
        self.sessions.start(self._pool, self._cgroups, self._freezers)

    async def _start_images(self) -> None:
        """The image cache, the writable layers on disk, the user namespace of image sandboxes,
        and what the isolation report says of the last two."""
        cfg = self.config
        self.images = ImageStore(cfg.image_cache_dir(), cfg.image_limits(),
                                 owner_max_bytes=cfg.image_tenant_max_mb << 20,
                                 max_total_bytes=cfg.image_store_max_mb << 20)
        if cfg.layers_on_disk:
            self.layers = await asyncio.to_thread(
                LayerStore, cfg.layers_dir or layers.default_dir(cfg.work_root),
                cfg.image_layer_mb, cfg.layer_budget_mb, cfg.layers_warm)
            if cfg.layer_reservations:  # (a sum past the budget fails the start, saying so)
                self.layers.reserve(dict(cfg.layer_reservations))
        self._report["image_user"] = await asyncio.to_thread(self._make_userns)
        self._report["image_layer"] = (
            "disk" if self.layers is not None and self.layers.available else
            f"memory ({self.layers.problem if self.layers is not None else 'layers_on_disk=False'})")

    def _fork_server_config(self) -> dict[str, Any]:
        """What the fork server is started with: the sandbox view (read-only paths, the hidden
        ones among them), limits, user, preloads and the sandboxes' environment."""
        cfg = self.config
        ro = list(isolation.SYSTEM_RO_PATHS) + list(cfg.extra_ro_paths)
        for lang in self._langs.values():
            ro += lang.ro_paths
        return {"root": "rootfs", "ro_paths": ro,  # (in work_root: `Zygote`)
                "hidden_paths": _inside([os.path.realpath(p) for p in cfg.hidden_paths], ro),
                "syscall_filter": cfg.syscall_filter,
                "preload": list(cfg.preload_modules), "workdir_mb": cfg.workdir_max_mb,
                "uid": cfg.sandbox_uid, "gid": cfg.sandbox_gid, "hostname": cfg.hostname,
                "nofile": cfg.max_open_files, "direct": cfg.direct_python,
                "share_code_ptes": cfg.share_code_ptes, "warm_direct": cfg.warm_direct,
                "compiled_setup": cfg.compiled_setup,
                "env": payload.env_for(cfg.default_cpus, self._langs)}

    def _make_userns(self) -> str:
        """The node's user namespace for image sandboxes (`userns.py`), checked against the
        image cache's file system (idmapped mounts); what the isolation report says."""
        cfg = self.config
        b = self.fork.ids
        who = (f"sandbox uid {cfg.sandbox_uid}" if b is None else
               f"the sandbox's own uid (of {b.first}-{b.first + b.count - 1})")
        if not cfg.image_userns:
            return f"{who} (image_userns=False)"
        assert self.images is not None
        try:
            ns = userns.make(cfg.image_id_base, cfg.image_id_count)
        except OSError as e:
            return f"{who} (no user namespace: {e})"
        path = self.images.layers_dir  # (or, before the first import, its nearest parent)
        while not os.path.isdir(path) and os.path.dirname(path) != path:
            path = os.path.dirname(path)
        try:
            fd = overlay.open_tree_clone(path)
            try:
                ns.idmap(fd)
            finally:
                os.close(fd)
        except OSError as e:
            ns.close()
            return f"{who} (no idmapped mount of the image cache: {e})"
        self.userns = ns
        if b is None:
            return ns.describe("one namespace for every image sandbox (no sandbox ids)")
        try:  # can an unprivileged id make one here (each image sandbox's init does, as its id)?
            userns.make(cfg.image_id_base, cfg.image_id_count, owner=b.first).close()
        except OSError as e:
            self._own_userns = False
            log.warning("CPU manager: image sandboxes share the node's user namespace: %s", e)
            return ns.describe(f"one namespace for every image sandbox: an unprivileged id "
                               f"cannot make one here ({e})")
        self._own_userns = True
        return ns.describe("one namespace per image sandbox, owned by its own sandbox id")

    def health(self) -> dict[str, Any]:
        """Readiness: ``ready`` (sandboxes can be made now), ``reason`` when not, ``down`` (gave
        up restarting the fork server for now), deaths and restarts of the fork server."""
        fork = self.fork
        ready = not self._closed and self._pool is not None and fork.not_ready is None
        reason = ("the CPU manager is not running" if self._closed or self._pool is None
                  else fork.not_ready or "")
        return {"ready": ready, "reason": reason,
                "down": bool(self._pool is not None and self._pool.down),
                "fork_server_deaths": fork.deaths, "fork_server_restarts": fork.restarts}

    async def aclose(self) -> None:
        self._closed = self.sessions.closed = True
        _MANAGERS.discard(self)
        self._pinned = ()
        await self.fork.stop()
        await self.sessions.aclose()
        if self._pool is not None:
            await self._pool.aclose()
        self.fork.close_fork_server()
        if self._freezers is not None:
            self._freezers.close()
        if self.layers is not None:
            self.layers.close()
        if self.userns is not None:
            self.userns.close()
            self.userns = None
        if self._cgroups is not None:
            self._cgroups.close()
        self.fork.close_ids()
        await self.fork.close_reaper()

    # reports -----------------------------------------------------------------------------------
    def isolation_report(self) -> dict[str, bool | str]:
        return dict(self._report)

    def languages(self) -> dict[str, str]:
        return {name: lang.description for name, lang in sorted(self._langs.items())}

    def warm_state(self) -> dict[str, int]:
        return {POOL_KEY: len(self._pool.ready) if self._pool else 0}

    def set_warm_target(self, key: str, size: int) -> None:
        """The scheduler's ResizeWarmPool; every key maps to the shared sandbox pool."""
        if self._pool is None:
            return
        self._pool.sched_target = max(0, int(size))
        self._pool._wake.set()

    # actions -----------------------------------------------------------------------------------
    async def run(self, action: ActionSpec, allotment: Resources) -> RunResult:
        if self._closed or self._pool is None:
            return RunResult.sandbox_error("the CPU manager is not running")
        try:
            code = payload.request_of(action)
            req = payload.build_request(action, allotment, self._langs, self.config, self._env,
                                        code)
            mem = payload.memory_bytes(code, allotment, self.config)
        except InvalidAction as e:
            return RunResult.sandbox_error(str(e))
        self._quota[action.id] = self._started[action.id] = req["quota"]
        self._reweigh()
        try:
            if req["op"] == "session":
                return await self._run_in_session(action, req)
            if code.image is not None:
                return await self._run_in_image(action, req, mem, code)
            return await self._run_pooled(action, req, mem)
        finally:
            self._quota.pop(action.id, None)
            self._started.pop(action.id, None)
            self._reweigh()
            if self._confined:  # (its end: back, and the rest on as few CPUs as they need)
                self._reconfine()

    async def _run_pooled(self, action: ActionSpec, req: SandboxRequest, mem: int) -> RunResult:
        """A one-shot action in a sandbox of the warm pool."""
        assert self._pool is not None
        try:
            sb = await self.take_sandbox()
        except Exception as e:
            return RunResult.sandbox_error(f"no sandbox: {e}")
        req = _as(sb, req)
        tmp = payload.tmpfs_mb(mem, self.config)
        if tmp < self.config.workdir_max_mb:  # (a small memory limit: see `payload.tmpfs_mb`)
            req = {**req, "tmpfs_mb": tmp}
        try:
            return await self.exchange(action.id, sb, req, mem)
        finally:
            self._pool.release(sb)

    async def take_sandbox(self, spawn: bool = False) -> Sandbox:
        """A sandbox from the pool (``spawn``: a new one, never a warm one). One the fork server
        died before making is asked for again, of the restarted one (its action never ran)."""
        assert self._pool is not None
        for i in range(TAKE_RETRIES + 1):
            gen = self.fork.gen
            try:
                return await (self._pool.spawn() if spawn else self._pool.take())
            except BrokenError:
                if i == TAKE_RETRIES or self._closed or (self.fork.gen == gen and self._pool.up.is_set()):
                    raise
        raise AssertionError("unreachable")

    def _lost(self, res: RunResult, sb: Sandbox) -> RunResult:
        """``res`` of an action run in ``sb``: when the fork server that made it died meanwhile
        (and the sandbox with it: all but a session's, which is kept) and the action did not
        succeed, the result says so, rather than looking like the program's own crash. (By
        the sandbox's own fork server, not a count of restarts: a sandbox of the dead one
        handed out once a new one is up was reported as killed by SIGKILL.)"""
        z = sb.maker
        if res.status == RunStatus.Success or sb.kept or self._closed or z is None or not z.exited():
            return res
        return dataclasses.replace(res, status=RunStatus.SandboxError,
                                   message="the sandbox fork server died while the action ran "
                                           "(its sandbox died with it; the fork server is "
                                           "restarted)")

    def weight_of(self, action_id: str, cpus: float) -> float:
        """The CPU weight of ``action_id`` at a quota of ``cpus``: `squeezed_weight` below the
        quota it started with (lent CPU taken back from it), else a normal task's."""
        return self.config.squeezed_weight if self._squeezed(action_id, cpus) else 1.0

    def _squeezed(self, action_id: str, cpus: float) -> bool:
        """A quota of ``cpus`` is below the one ``action_id`` started with (lent CPU taken back)."""
        floor = self._started.get(action_id, cpus) - 1e-9
        return cpus < floor  # pragma: no mutate (< and <= differ only at the tolerance's edge)

    def _reweigh(self) -> None:
        """`entitled_tree_weight`: the tree weighs the cores of its unsqueezed actions while any
        is squeezed, else its usual weight (`CgroupTree.set_cores`)."""
        if not self.config.entitled_tree_weight or self._cgroups is None:
            return
        squeezed, entitled = False, 0.0
        for a, q in self._quota.items():
            if self._squeezed(a, q):
                squeezed = True
            else:
                entitled += q
        self._cgroups.set_cores(entitled if squeezed else None)

    def _reconfine(self) -> None:
        """`squeezed_cpus`: the running actions squeezed below the cores they started with
        share the last ``ceil(their quotas)`` CPUs of the manager's (`cgroups.squeezed_cpus`;
        not those another manager of this process pins its own to),
        each pinned there (`cgroups.pin`) when it is squeezed or the set changes; those no
        longer squeezed run on every CPU again. Called where a squeeze can begin or end: a
        resize applied, a sandbox given its quota, an action's end."""
        if not self.config.squeezed_cpus or self._cgroups is None:
            return
        squeezed = {a: q for a, q in self._quota.items()
                    if a in self._running and self._squeezed(a, q)}
        allowed = sorted(os.sched_getaffinity(0))  # pragma: no mutate (1: init's, every CPU, as ours unless the service is pinned)
        cpus: tuple[int, ...] = ()
        if squeezed:  # (on CPUs no other manager of this process pins to, one of them left)
            taken = {c for m in _MANAGERS if m is not self for c in m._pinned}
            free = [c for c in allowed if c not in taken]
            cpus = tuple(squeezed_cpus(free, sum(squeezed.values())) or ())
        for a in [a for a in self._confined if not cpus or a not in squeezed]:
            self._unconfine(a, allowed)
        if not cpus:
            self._pinned = ()
            return
        for a in squeezed:
            sb = self._running[a]
            fresh = a not in self._confined or cpus != self._pinned
            if fresh and sb.slot is not None and not sb.dead:  # pragma: no mutate (or: pinned again to the same CPUs, or a dead one's empty slot: the same masks)
                pin(sb.slot, set(cpus))
                self._confined[a] = sb
        self._pinned = cpus

    def _unconfine(self, action_id: str, allowed: list[int]) -> None:
        """``action_id``'s sandbox on every CPU again (a session's outlives its action; a
        one-shot one killed already has nothing to pin)."""
        sb = self._confined.pop(action_id, None)
        if sb is not None and sb.slot is not None and not sb.dead:  # pragma: no mutate (or: only confined sandboxes come here; a dead one's slot is empty)
            pin(sb.slot, set(allowed))

    def quota_of(self, action_id: str, default: float) -> float:
        """``action_id``'s CPU quota in cores now (a resize that came while it waited for its
        sandbox included); ``default`` when it has none here."""
        return self._quota.get(action_id, default)

    async def exchange(self, action_id: str, sb: Sandbox, req: SandboxRequest,
                       mem: int) -> RunResult:
        """Run ``req`` in ``sb`` for ``action_id``: registered in `_running` from the call (no
        await before) to its end, so a cancel or resize meanwhile reaches ``sb``; its quota
        the action's latest (`quota_of`). The result says so when the fork server that made
        ``sb`` died meanwhile (`_lost`)."""
        self._running[action_id] = sb
        try:
            return self._lost(await self._exchange(action_id, sb, req, mem), sb)
        finally:
            self._running.pop(action_id, None)
            self._cancelled.discard(action_id)

    async def _exchange(self, action_id: str, sb: Sandbox, req: SandboxRequest,
                        mem: int) -> RunResult:
        quota = self._quota.get(action_id, req["quota"])
        pod = f"{self._host}/sandbox-{sb.pid}"
        try:
            sb.set_limits(quota, mem, self.weight_of(action_id, quota))
        except OSError as e:
            return RunResult.sandbox_error(f"cannot set limits: {e}", pod)
        if self.config.squeezed_cpus and self._squeezed(action_id, quota):  # pragma: no mutate (or: `_reconfine` is idempotent; the test keeps its walk off every action's path)
            self._reconfine()  # (squeezed before it had a sandbox)
        n = len(req["cases"] or ()) + 1  # (cases run as many at a time as the code is shown)
        budget = Timeouts(req["compile_timeout"], req["run_timeout"], req.get("total_timeout")
                          ).reply_budget_s(n, req["limits"]["cpus"])
        try:
            if sb.outs and direct.eligible(req):
                reply = await direct.exchange(sb, req, budget, self._base_env)
            else:
                reply = await sb.request(req, budget)
        except (OSError, EOFError, asyncio.IncompleteReadError, ValueError, TimeoutError) as e:
            reply = {"error": f"sandbox broke: {type(e).__name__}: {e}"}
        return self._result(action_id, reply, sb, pod)

    def _result(self, action_id: str, reply: dict[str, Any], sb: Sandbox, pod: str) -> RunResult:
        stats: dict[str, Any] = {}
        if sb.slot is not None:
            try:  # noqa: SIM105  (no context manager: this runs once per action)
                stats = {"cpu_time": round(sb.slot.cpu_seconds(), 6),
                         "peak_memory_mb": sb.slot.peak_memory_mb(),
                         "memory_exceeded": sb.slot.oom_kills() > 0}
            except (OSError, ValueError):
                pass
        if action_id in self._cancelled:
            return RunResult(status=RunStatus.SandboxError, message="cancelled", executor_pod_name=pod,
                             **stats)
        if "error" in reply:
            return RunResult(status=RunStatus.SandboxError, message=str(reply["error"]),
                             executor_pod_name=pod, **stats)
        return build_result(reply, pod, stats)

    async def cancel(self, action_id: str) -> None:
        sb = self._running.get(action_id)
        if sb is not None:
            self._cancelled.add(action_id)
            sb.kill()

    async def resize(self, action_id: str, allotment: Resources) -> str:
        """Set an action's CPU quota to ``allotment``'s cpu. Returns "applied" (its sandbox's
        cgroup rewritten), "deferred" (it has no sandbox yet: set when it gets one) or "dropped"
        (no such action here: it ended, or never came; or its sandbox is gone)."""
        cpus = float(allotment.get("cpu", 0.0))
        if not cpus > 0 or math.isinf(cpus):
            raise ValueError(f"resize of {action_id}: allotment cpu must be a positive number, "
                             f"got {cpus!r}")
        if action_id not in self._quota:
            return "dropped"
        self._quota[action_id] = cpus
        self._reweigh()
        sb = self._running.get(action_id)
        if sb is None:
            return "deferred"
        if sb.slot is None or sb.dead:
            return "dropped"
        try:
            sb.set_limits(cpus, sb.memory, self.weight_of(action_id, cpus))
        except OSError:
            return "dropped"
        self._reconfine()
        return "applied"

    async def _run_in_image(self, action: ActionSpec, req: SandboxRequest, mem: int,
                            code: CodeRequest) -> RunResult:
        """A one-shot action in an environment image: a fresh sandbox, the image mounted with
        a fresh writable layer, discarded with the sandbox."""
        assert self._pool is not None
        name = code.image
        if self.images is None or not isinstance(name, str):
            return RunResult.sandbox_error("payload.image: must be the name of an image")
        try:
            img = self.images.acquire(name)
        except ImageError as e:
            return RunResult.sandbox_error(f"payload.image: {e}")
        sb = None
        held_mb = 0
        try:
            sb = await self.take_sandbox(spawn=True)
            layer_mb = int(code.layer_mb or self.config.image_layer_mb)
            try:
                held_mb, inside = await self.enter_image(sb, img, layer_mb)
            except ImageError as e:  # (the sandbox said why)
                return RunResult.sandbox_error(str(e))
            req = overlay.image_request(_as(sb, req), img, inside, layer_mb)
            return await self.exchange(action.id, sb, req, mem)
        except Exception as e:
            return RunResult.sandbox_error(f"image {name!r}: {type(e).__name__}: {e}")
        finally:
            if sb is not None:
                self._pool.release(sb)
            if held_mb and self.layers is not None:
                self.layers.give_back(held_mb)
            self.images.release(name)

    async def enter_image(self, sb: Sandbox, img: Image, layer_mb: int,
                           owner: str | None = None) -> tuple[int, overlay.Inside]:
        """Mount ``img`` in ``sb`` over a writable layer of ``layer_mb`` MiB (on the node's disk
        where it has disk layers, else a tmpfs in the sandbox), as the image's user in the
        node's user namespace where it has one (`userns.py`): the disk MiB now held (the
        caller gives them back with the sandbox) and what the init reported. On failure
        nothing stays held: `LayerError` past the layer budget, `ImageError` when the
        sandbox cannot enter it."""
        assert self.images is not None
        layer = await self._take_layer(layer_mb, owner)
        held = layer.mb if layer is not None else 0
        try:
            try:
                entered = await overlay.enter_image(sb, self.images, img, layer_mb,
                                                    sb.uid, self._gid(sb), layer,
                                                    userns=self.userns,
                                                    owner=sb.uid if self._own_userns else -1)
            finally:
                if layer is not None:
                    layer.close()  # the sandbox holds it now, or nobody
            if "error" in entered:
                raise ImageError(f"cannot enter image {img.name!r}: {entered['error']}")
        except BaseException:
            if held and self.layers is not None:
                self.layers.give_back(held, owner)
            raise
        return held, overlay.Inside.of(entered)

    def _gid(self, sb: Sandbox) -> int:
        """The host gid of ``sb``'s code: the number of its uid where it has its own."""
        return sb.uid if self.fork.ids is not None else self.config.sandbox_gid

    async def _take_layer(self, mb: int, owner: str | None = None) -> Layer | None:
        """A writable layer of ``mb`` MiB on the node's disk, or None where the node has no disk
        layers (the sandbox then mounts a tmpfs of that size); `LayerError` past the budget."""
        if self.layers is None or not self.layers.available:
            return None
        return await asyncio.to_thread(self.layers.take, mb, owner)

    # sessions (`sessions.SessionTable`) ---------------------------------------------------------
    async def open_session(self, session_id: str, demand: Resources, ttl_s: float,
                           image: str | None = None, layer_mb: int | None = None,
                           owner: str | None = None) -> None:
        """Open a session; with ``image``, its sandbox runs in that image (read-only layers and
        a writable layer of ``layer_mb`` MiB, `overlay.enter_image`), counted against
        ``owner``'s share of the node's layer budget (`set_layer_reservations`). When it
        cannot be opened, an action naming it later is told why (`_run_in_session`)."""
        await self.sessions.open(session_id, demand, ttl_s, image, layer_mb, owner)

    def set_layer_reservations(self, reserved: dict[str, int]) -> None:
        """Keep ``reserved[owner]`` MiB of the node's layer budget for each owner (a tenant):
        one below its reservation is never refused because others filled the node (issue 41,
        M3; `LayerStore.reserve`). ValueError when they pass the budget."""
        if self.layers is not None:
            self.layers.reserve(reserved)

    async def close_session(self, session_id: str) -> None:
        await self.sessions.close(session_id)

    async def _run_in_session(self, action: ActionSpec, req: SandboxRequest) -> RunResult:
        return await self.sessions.run(action, req)

    async def reclaim_session(self, session_id: str) -> int:
        """Give back what the kernel can reclaim of an idle session's memory without closing
        it (issue 40, item 2): the session stays frozen, its processes, files and shell state
        kept, and its next action thaws it as usual. Only page cache goes (files it wrote to
        a disk layer or read), never its processes' own memory (no swap). The bytes freed;
        0 for a session that is not open, has no slot, or is not frozen (an action in it)."""
        return await self.sessions.reclaim(session_id)

    async def reclaim_idle(self, need_bytes: int) -> int:
        """Memory short: reclaim idle (frozen) sessions' page cache, the largest by their last
        reading first, until ``need_bytes`` went or none is left (`reclaim_session`); none is
        closed. The bytes freed. What the node host does before its report when its measured
        use passes `runtime.node.reports.Reporters.memory_reclaim_at` (issue 40, item 2), so the core's watermark
        (which evicts) sees what the sessions cannot give back."""
        return await self.sessions.reclaim_idle(need_bytes)

    def memory_use(self) -> tuple[dict[str, tuple[int, int]], int]:
        """Each open session's memory, (bytes charged now, the most since the last call: its
        cgroup's memory.current and memory.peak, `Slot.memory_sample`), and what this manager's
        other sandboxes (one-shot actions, warm ones) hold now, in bytes. The node host calls
        it every ~0.5 s (issue 26).

        Sampled, not read whole (issue 40, item 3): a session frozen between its actions cannot
        allocate, so once read after its freeze (the read that sees its action's peak) it is
        reported at that figure, (cur, cur), and read again only on its turn, once every
        `frozen_memory_refresh` calls (its place in the open order plus the call count, so
        the refreshes spread evenly: ceil or floor of frozen/refresh per call), which sees what
        the kernel reclaimed meanwhile. A session not frozen (an action in it, or no freezer)
        is read at every call. `memory_reads` counts the sessions read by the last call (2
        files each on cgroup v1, 1-2 on v2, besides one read of the manager's own total)."""
        return self.sessions.memory_use()

    def session_ids(self) -> list[str]:
        return sorted(self.sessions.by_id)

    def has_session(self, session_id: str) -> bool:
        return session_id in self.sessions.by_id


def build_result(reply: dict[str, Any], pod: str, stats: dict[str, Any]) -> RunResult:
    comp = StageResult.from_wire(reply.get("compile_result"))
    run = StageResult.from_wire(reply.get("run_result"))
    cases = None
    if reply.get("cases") is not None:
        cases = tuple(CaseResult(index=int(c["index"]), passed=bool(c["passed"]),
                                 run=StageResult.from_wire(c.get("run_result")),
                                 skipped=bool(c.get("skipped"))) for c in reply["cases"])
    stages = [s for s in (comp, run) if s is not None] + [c.run for c in cases or () if c.run]
    truncated = any(s.truncated for s in stages)
    if comp is not None and not comp.ok:
        ok, msg = False, "compile failed"
    elif cases is not None:
        npass = sum(c.passed for c in cases)
        ok, msg = npass == len(cases), f"{npass}/{len(cases)} cases passed"
    else:
        ok, msg = run is not None and run.ok, ""
    if stats.get("memory_exceeded"):
        msg = "memory limit exceeded" + (f"; {msg}" if msg else "")
    elif run is not None and run.status == CommandRunStatus.Finished and run.return_code == -9:
        # neither the run timeout nor the memory limit: killed from outside (or by itself)
        msg = ("killed by SIGKILL, not by a limit of the sandbox (from outside it, or by the "
               "program itself)") + (f"; {msg}" if msg else "")
    if reply.get("message"):
        msg = f"{msg}; {reply['message']}" if msg else str(reply["message"])
    cut = bool(reply.get("timed_out"))
    if cut:  # the action's timeout_s ran out (`sandbox.init._run`): never a success
        ok, msg = False, f"{msg}; {reply['timed_out']}" if msg else str(reply["timed_out"])
    return RunResult(status=RunStatus.Success if ok else RunStatus.Failed, message=msg, compile_result=comp,
                     run_result=run, executor_pod_name=pod, files=dict(reply.get("files") or {}),
                     output_truncated=truncated, cases=cases, timeout_s_exceeded=cut, **stats)
