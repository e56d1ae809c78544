"""Configuration of the CPU manager: one keyword-only, validated, frozen dataclass.

Invariant: a constructed `CpuManagerConfig` is valid; every bad value raises `ValueError` naming
the field and the value.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .images.extract import ImageLimits

DEFAULT_PRELOAD = (
    "os", "sys", "re", "json", "math", "cmath", "collections", "collections.abc", "itertools",
    "functools", "operator", "typing", "random", "string", "heapq", "bisect", "datetime", "time",
    "decimal", "fractions", "statistics", "copy", "dataclasses", "io", "enum", "hashlib",
    "textwrap", "traceback", "array", "struct", "unittest", "contextlib", "abc", "numbers",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuManagerConfig:
    """How the CPU manager builds and limits its sandboxes."""

    # Host directory for the manager's private state (the sandbox root mount point lives here).
    work_root: str = field(default_factory=lambda: os.path.join(tempfile.gettempdir(), "tangram-cpu"))
    # Size cap of each sandbox's private work directory (+ /tmp), a tmpfs, in MiB.
    workdir_max_mb: int = 256
    # Start even when an isolation feature is missing (the report says which); off by default.
    allow_reduced_isolation: bool = False
    # Unprivileged uid/gid the code runs as when `sandbox_id_count` is 0 (every sandbox the same).
    sandbox_uid: int = 65534
    sandbox_gid: int = 65534
    # Host ids of sandboxes (issue 35, M2): each live sandbox (a one-shot action's, a warm one,
    # a session's) runs as a uid, and the gid of the same number, of its own, so per-uid kernel
    # limits (inotify instances and watches, RLIMIT_NPROC, ...) are its own and no neighbour
    # can spend them. The ids are `sandbox_id_base`.. `sandbox_id_base + sandbox_id_count - 1`,
    # reserved for the node: no user or group of the host's /etc/passwd or /etc/group may be
    # in the range (start-up refuses, naming it), nor the image range. A manager claims a block
    # of `SANDBOX_ID_BLOCK` (4096) of them at start (a lock file per block under
    # /run/arl-tangram/sandbox-ids: managers of one node never share an id); an id is given to
    # the next sandbox only once every process of the one before is gone (the fork server hands
    # it out again when it has reaped that sandbox's init: its PID namespace is empty).
    # 0: every sandbox runs as `sandbox_uid`/`sandbox_gid` (one uid shared by all).
    sandbox_id_base: int = 1 << 29
    sandbox_id_count: int = 65536
    # Cap on each of stdout and stderr kept per stage, in bytes; the rest is dropped and flagged.
    output_limit_bytes: int = 1 << 20
    # Warm sandboxes kept ready, per pool key (all languages share the "sandbox" key).
    warm_min: int = 2
    warm_max: int = 32
    # Memory limit of an action when neither allotment nor payload gives one, in MiB.
    default_memory_mb: int = 512
    # CPU cores of an action when the allotment gives none.
    default_cpus: float = 1.0
    # CPU weight (relative to a normal task) of an action squeezed below the cores it started
    # with (the core took lent CPU back from it, `core/lending.py`): its quota caps what it gets
    # over a scheduling period; this low weight makes it yield at once, within the period, to
    # any other sandbox and to the service's own processes that want a core. 0: the kernel's
    # least (cpu.shares 2, cpu.weight 1); 1.0: the same weight as any action.
    squeezed_weight: float = 0.0
    # CPU weight of the sandboxes' cgroup tree, in busy tasks per core: 1.0, as many plain
    # processes as the machine has cores (N busy sandboxes compete for CPU like N processes);
    # below 1 the service's own processes (the engine, the manager, the fork server: outside
    # the tree) win a contended CPU from busy sandboxes, so an action's path does not wait
    # behind another sandbox's time slice at each wake-up. Idle CPU is used either way. (Issue
    # 41's measurements of 1/16 under a flood disagree between two runs: docs/core.md.)
    sandbox_weight: float = 1.0
    # While any action here is squeezed below the cores it started with (lent CPU taken back,
    # `squeezed_weight`), the tree weighs only the quotas of its actions that are not: what its
    # sandboxes are entitled to. A squeezed action's least weight divides only the tree's own
    # part of a CPU; the tree's part against the service's own processes (outside it) is set
    # here, so that a squeezed loop yields to the control plane starting the action it made
    # room for. Back to `sandbox_weight`'s one busy task per core when none is squeezed.
    entitled_tree_weight: bool = False
    # While lent CPU is taken back from running actions (their quota below the cores they
    # started with), they share whole CPUs of their own: the last ceil(their quotas) of the
    # manager's (each thread's CPU affinity, `host/cgroups.pin`), so that the CPUs left are
    # the owed tenant's and the service's own, as her share of the machine would be, not CPUs
    # a squeezed loop also runs on. Back to every CPU when they grow back or end. Off, or where
    # no CPU would be left free of them: quota and weight alone.
    squeezed_cpus: bool = True
    # Maximum number of processes/threads inside one sandbox (cgroup pids.max).
    pids_max: int = 256
    # Default timeouts (seconds) when the payload gives none; and the hard upper bounds.
    default_compile_timeout_s: float = 30.0
    default_run_timeout_s: float = 10.0
    max_timeout_s: float = 600.0
    # Most cases one TEST action may carry (issue 35, M5): more is refused ("payload.cases").
    # The cases of an action run within its `timeout_s` together, whatever their number.
    max_test_cases: int = 1024
    # Open files per process (RLIMIT_NOFILE).
    max_open_files: int = 1024
    # Python modules imported once by the fork server so an action does not pay for them.
    preload_modules: tuple[str, ...] = DEFAULT_PRELOAD
    # Extra host paths bound read-only into every sandbox (toolchains outside /usr).
    extra_ro_paths: tuple[str, ...] = ()
    # Host paths masked inside every sandbox (a file reads empty, a directory is empty), for what
    # lies under a bound directory such as /etc but is the service's own (`tangram serve` adds
    # its config file). Secrets such as /etc/shadow and /etc/ssh are always masked.
    hidden_paths: tuple[str, ...] = ()
    # Install the default seccomp syscall filter in every sandbox (docs/sandbox.md, "Syscall
    # filter"); off only with allow_reduced_isolation, for a machine without libseccomp.
    syscall_filter: bool = True
    # Seconds between checks for expired sessions.
    session_reap_interval_s: float = 1.0
    # The sandbox fork server's restarts (`host/supervisor.py`): a death within
    # `fork_server_crash_window_s` of an earlier one waits `fork_server_restart_backoff_s`
    # before the restart, doubled per further death in the window (at most 5 s); the
    # `fork_server_max_crashes`-th death in the window marks the node down (takes fail at once
    # with the reason) and a restart is tried again every `fork_server_down_retry_s`.
    fork_server_max_crashes: int = 5
    fork_server_crash_window_s: float = 60.0
    fork_server_restart_backoff_s: float = 0.1
    fork_server_down_retry_s: float = 30.0
    # Hostname inside sandboxes.
    hostname: str = "sandbox"
    # Run a trivial one-shot Python action (no compile stage, no cases, no fetch_files) as PID 1
    # of its sandbox itself: one fork per action instead of two (no prepared child), its output
    # piped straight to the manager, which enforces the wall-clock limit and the output cap.
    direct_python: bool = True
    # Let fork() copy the fork server's page-table entries of its code (interpreter, libraries)
    # instead of each sandbox re-faulting every code page it runs (see `_linux.share_file_ptes`).
    share_code_ptes: bool = False
    # Run the direct path's Python once in each warm sandbox before its action arrives (moves
    # ~100 page faults off the action's latency, at a CPU cost per sandbox; refills skip it while
    # actions arrive faster than `pool.WARM_RATE_PER_CORE` per core).
    warm_direct: bool = True
    # Run a sandbox's set-up (namespaces, mounts, fds, privilege drop, syscall filter) through
    # the compiled `_fastpath` extension where it is built (same calls, ~150 fewer page faults
    # per sandbox); False, or no extension: the same steps in Python.
    compiled_setup: bool = True
    # cgroup v1: each new sandbox's init moves itself into its slot (writes 0 to the slot's
    # `tasks` files, opened by the fork server, first thing after its fork) instead of the
    # manager writing its pid to `cgroup.procs`. A move of another process takes the kernel's
    # global threadgroup lock, whose write side waits for an RCU grace period (~10-20 ms on a
    # 2-core VM) whenever no move came just before; a thread moving itself does not take it.
    # That wait, serial in front of every refill batch, left the machine ~15 % idle under load.
    cgroup_self_join: bool = True
    # Environment images (issue 17): the node's image cache ("": `image_cache_dir`), the
    # default size cap of a session's or image action's writable layer (MiB), and whether
    # sessions are frozen (cgroup freezer) between their actions.
    images_dir: str = ""
    image_layer_mb: int = 1024
    freeze_sessions: bool = True
    # A frozen session's memory is read once after its freeze, then once every this many of
    # the node's memory reports (every ~0.5 s: 20 is every 10 s), spread over the calls; in
    # between its last figure is reported (a frozen session cannot allocate). 0: every session
    # read at every report (issue 40, item 3: 1,000 idle sessions' reads were most of the
    # manager's idle CPU).
    frozen_memory_refresh: int = 20
    # What an import may expand to (issue 35; `images.extract.ImageLimits`): per image its
    # unpacked bytes, entries and decompression ratio; per owner (a tenant, or the shared
    # images) the bytes of its images together; the cache's layers in all (0: no cap); and the
    # free space an import always leaves on the cache's file system. Past one: 413, nothing kept.
    image_max_mb: int = 16384
    image_max_files: int = 300_000
    image_max_ratio: float = 200.0
    image_tenant_max_mb: int = 65536
    image_store_max_mb: int = 0
    image_min_free_mb: int = 2048
    # Writable layers on the node's disk (`layers.py`): each its own ext4 of exactly its cap
    # in a sparse file under `layers_dir` ("": `work_root`/layers, or /var/tmp/arl-tangram/
    # layers where `work_root` is on a tmpfs), the caps of the layers open at once within
    # `layer_budget_mb` (0: the disk free at start less a tenth of the disk), and
    # `layers_warm` ready ones of the default size. Where loop devices or mkfs.ext4 are
    # missing, or with `layers_on_disk` off, a layer is a size-capped tmpfs (memory) instead,
    # and the isolation report says why.
    layers_on_disk: bool = True
    layers_dir: str = ""
    layer_budget_mb: int = 0
    layers_warm: int = 2
    # owner (a tenant) -> MiB of `layer_budget_mb` kept for its image sessions (issue 41, M3:
    # a tenant below its reservation is never refused because others filled the node; the
    # rest is shared, first come). The service fills it from each tenant's `layer_reserve_mb`.
    layer_reservations: Mapping[str, int] = field(default_factory=dict)
    # Image sandboxes run as the image's own user (OCI `User`, root when unset) inside a user
    # namespace (issue 26): one per node, mapping uids and gids 0..`image_id_count`-1 inside to
    # `image_id_base`.. on the host (inside root is host uid `image_id_base`, with no capability
    # over the host), the image's layers idmapped into it. Off, or where the kernel has no
    # idmapped mounts, image sandboxes run as `sandbox_uid` as before (the report says why).
    image_userns: bool = True
    image_id_base: int = 1 << 30
    image_id_count: int = 65536

    def image_cache_dir(self) -> str:
        """The image cache: `images_dir`, else ``work_root/images``, unless `work_root` is in
        memory (a tmpfs /tmp: Debian 13, Fedora), where ``/var/tmp/arl-tangram/images`` keeps
        hundreds of MB of layers on disk and across reboots. `tangram image` and the service
        both find it here."""
        if self.images_dir:
            return self.images_dir
        from .images.layers import MEMORY_FS, fs_type

        if fs_type(self.work_root) in MEMORY_FS:
            return "/var/tmp/arl-tangram/images"
        return os.path.join(self.work_root, "images")

    def image_limits(self) -> ImageLimits:
        from .images.extract import ImageLimits

        return ImageLimits(max_bytes=self.image_max_mb << 20, max_files=self.image_max_files,
                           max_ratio=self.image_max_ratio,
                           min_free_bytes=self.image_min_free_mb << 20)

    def __post_init__(self) -> None:
        _positive(self, "image_max_mb", "image_max_files", "image_max_ratio")
        for name in ("image_tenant_max_mb", "image_store_max_mb", "image_min_free_mb"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        _positive(self, "workdir_max_mb", "output_limit_bytes", "default_memory_mb",
                  "default_cpus", "pids_max", "default_compile_timeout_s",
                  "default_run_timeout_s", "max_timeout_s", "max_open_files",
                  "session_reap_interval_s", "image_layer_mb", "max_test_cases",
                  "fork_server_crash_window_s", "fork_server_restart_backoff_s",
                  "fork_server_down_retry_s")
        v = self.squeezed_weight
        if not isinstance(v, int | float) or isinstance(v, bool) or not 0.0 <= v <= 1.0:
            raise ValueError(f"squeezed_weight must be a number from 0 to 1, got {v!r}")
        v = self.sandbox_weight
        if not isinstance(v, int | float) or isinstance(v, bool) or not 0.0 < v <= 1.0:
            raise ValueError(f"sandbox_weight must be a number above 0 and at most 1, got {v!r}")
        v = self.fork_server_max_crashes
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"fork_server_max_crashes must be an integer >= 1, got {v!r}")
        for name in ("images_dir", "layers_dir"):
            v = getattr(self, name)
            if v and not os.path.isabs(v):
                raise ValueError(f"{name} must be an absolute path, got {v!r}")
        for owner, mb in self.layer_reservations.items():
            if not isinstance(mb, int) or isinstance(mb, bool) or mb < 0:
                raise ValueError(f"layer_reservations[{owner!r}] must be an integer >= 0 (MiB), "
                                 f"got {mb!r}")
        for name in ("layer_budget_mb", "layers_warm", "frozen_memory_refresh"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        if not os.path.isabs(self.work_root):
            raise ValueError(f"work_root must be an absolute path, got {self.work_root!r}")
        for name in ("sandbox_uid", "sandbox_gid"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive (non-root) id, got {v!r}")
        if not (isinstance(self.image_id_count, int) and 1 <= self.image_id_count <= 1 << 24):
            raise ValueError(f"image_id_count must be an integer in 1..2**24, got "
                             f"{self.image_id_count!r}")
        if not isinstance(self.image_id_base, int) or isinstance(self.image_id_base, bool) \
                or self.image_id_base < 65536 \
                or self.image_id_base + self.image_id_count > (1 << 32) - 2 \
                or any(self.image_id_base <= v < self.image_id_base + self.image_id_count
                       for v in (self.sandbox_uid, self.sandbox_gid)):
            raise ValueError("image_id_base must be >= 65536, leave room for image_id_count "
                             "ids below 2**32-2, and not hold sandbox_uid/gid, got "
                             f"{self.image_id_base!r}")
        n = self.sandbox_id_count
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= 1 << 24:
            raise ValueError(f"sandbox_id_count must be an integer in 0..2**24, got {n!r}")
        b = self.sandbox_id_base
        if n and (not isinstance(b, int) or isinstance(b, bool) or b < 65536
                  or b + n > (1 << 32) - 2
                  or any(b <= v < b + n for v in (self.sandbox_uid, self.sandbox_gid))
                  or (b < self.image_id_base + self.image_id_count
                      and self.image_id_base < b + n)):
            raise ValueError("sandbox_id_base must be >= 65536, leave room for sandbox_id_count "
                             "ids below 2**32-2, and hold neither sandbox_uid/gid nor an id "
                             f"of the image range, got {b!r}")
        if self.warm_min < 0:
            raise ValueError(f"warm_min must be >= 0, got {self.warm_min!r}")
        if self.warm_max < self.warm_min:
            raise ValueError(f"warm_max ({self.warm_max!r}) must be >= warm_min ({self.warm_min!r})")
        if self.pids_max < 16:
            raise ValueError(f"pids_max must be >= 16, got {self.pids_max!r}")


def _positive(cfg: CpuManagerConfig, *names: str) -> None:
    for name in names:
        v = getattr(cfg, name)
        if not isinstance(v, int | float) or isinstance(v, bool) or not v > 0:
            raise ValueError(f"{name} must be a positive number, got {v!r}")
