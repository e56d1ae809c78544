"""Manager side: the host ids this manager's sandboxes run as (issue 35, M2).

Per-uid kernel limits (inotify instances, `fs.inotify.max_user_instances`, 128 by default;
inotify watches; RLIMIT_NPROC; on Linux >= 5.11 counted per (user namespace, uid)) are shared
by every process of one uid. With one uid for every sandbox, one session holding 128 inotify
instances broke `inotify_init` in every other tenant's sandbox, and, with the default uid 65534,
for the host's own `nobody`. So each live sandbox runs as an id of its own.

Invariant: the node's range (`CpuManagerConfig.sandbox_id_base`, `sandbox_id_count`) holds no
user or group of the host (`check_range`, at start); it is cut into blocks of
`SANDBOX_ID_BLOCK` ids, and a manager holds one block for its whole life by an exclusive
`flock` on that block's lock file (`claim`), so two managers of one node (a multi-node local
executor, two services) never hand out the same id. Within the block the fork server lends an
id to one sandbox at a time (`zygote.server.Namespaces`) and takes it back only when it has
reaped that sandbox's init, i.e. when every process of its PID namespace is gone: no process of
an earlier sandbox still runs as the id when a later one gets it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import os
import pwd
from dataclasses import dataclass

SANDBOX_ID_BLOCK = 4096  # ids per manager: at most this many sandboxes alive at once
LOCK_DIR = "/run/arl-tangram/sandbox-ids"


@dataclass(slots=True)
class Block:
    """The ids ``first``.. ``first + count - 1``, held while ``fd`` (the lock) is open."""

    fd: int
    first: int
    count: int

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def check_range(base: int, count: int) -> None:
    """ValueError naming the first user or group of the host whose id is in the range."""
    for p in pwd.getpwall():
        if base <= p.pw_uid < base + count:
            raise ValueError(f"sandbox ids {base}-{base + count - 1} hold the host's user "
                             f"{p.pw_name!r} (uid {p.pw_uid}): move sandbox_id_base")
    for g in grp.getgrall():
        if base <= g.gr_gid < base + count:
            raise ValueError(f"sandbox ids {base}-{base + count - 1} hold the host's group "
                             f"{g.gr_name!r} (gid {g.gr_gid}): move sandbox_id_base")


def claim(base: int, count: int, lock_dir: str = LOCK_DIR) -> Block:
    """A free block of the range, locked for this process (OSError EBUSY when every block is
    held by another manager). A block no manager holds may still have processes of a manager
    killed with -9 (its sessions' frozen processes, until the next start thaws and kills them,
    `cgroups._remove_stale`): a block without any process is taken first."""
    check_range(base, count)
    os.makedirs(lock_dir, mode=0o700, exist_ok=True)
    size = min(SANDBOX_ID_BLOCK, count)
    busy = uids_in_use(base, count)
    free: list[Block] = []
    try:
        for first in range(base, base + count - size + 1, size):
            fd = os.open(os.path.join(lock_dir, f"{first}-{size}"),
                         os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            except BaseException:
                os.close(fd)
                raise
            free.append(Block(fd, first, size))
            if not any(first <= u < first + size for u in busy):
                break
        if not free:
            raise OSError(errno.EBUSY, f"every block of sandbox ids {base}-{base + count - 1} "
                          "is held by another CPU manager of this node: widen sandbox_id_count")
        got = free.pop()  # the clean one, else the last free one tried
        return got
    finally:
        for b in free:
            b.close()


def uids_in_use(base: int, count: int) -> set[int]:
    """The real uids in ``base``.. ``base + count - 1`` of the host's processes now."""
    out = set()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        u = int(line.split()[1])
                        if base <= u < base + count:
                            out.add(u)
                        break
        except (OSError, ValueError):
            continue
    return out
