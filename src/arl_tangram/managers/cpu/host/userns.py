"""Manager side: the node's user namespace for image sandboxes (issue 26).

An image sandbox runs as the image's own user (root when its OCI config names none) inside a
user namespace whose ids 0..count-1 are the host's base..base+count-1 (one range per node, like
a subordinate range of /etc/subuid): inside root is host uid ``base``, an unprivileged uid with
no capability over anything the host owns (the sandbox's mount, PID, network, IPC and UTS
namespaces belong to the host's user namespace, so inside root can mount, unshare or change
none of them; the syscall filter denies those calls anyway). The image's layers stay on disk
with the owners the image gave them, and are lent to the sandbox as an idmapped mount through
this namespace (`idmap`), so an image's root-owned file is owned by host uid ``base`` below the
sandbox's overlay and by root as seen inside.

Invariant: one namespace per manager, made once at start (`make`) and lent (an fd) to every
image sandbox's init, which joins it (setns) after it has mounted the image and before anything
of the action runs; the manager's own process never enters it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from dataclasses import dataclass

from .. import _linux

# The helper whose namespace becomes the node's: as its owner (argv[1], a host uid; -1: root
# itself) it unshares a user namespace, says so, and waits for its stdin to close (it is in a
# user namespace with no ids mapped until we write them, so it does nothing else).
_HELPER = ("import ctypes, os, sys\n"
           "o = int(sys.argv[1])\n"
           "if o >= 0:\n"
           "    os.setgroups([]); os.setresgid(o, o, o); os.setresuid(o, o, o)\n"
           "r = ctypes.CDLL(None, use_errno=True).unshare(0x10000000)\n"
           "os.write(1, b'ok\\n' if r == 0 else b'unshare: errno %d\\n' % ctypes.get_errno())\n"
           "os.read(0, 1)\n")


@dataclass(slots=True)
class UserNamespace:
    """The node's user namespace (an fd of it) and the host ids it maps."""

    fd: int
    base: int
    count: int

    def idmap(self, mount_fd: int) -> None:
        """Idmap the detached mount ``mount_fd`` (`overlay.open_tree_clone`) through this
        namespace (kernel 5.12+, and a file system that supports it)."""
        _linux.idmap_mount(mount_fd, self.fd)

    def describe(self, own: str = "") -> str:
        """What the isolation report says; ``own``: how each image sandbox's namespace is had
        ("one per image sandbox, owned by its own id", or why the node's one is shared)."""
        return (f"userns (the image's user, root when unset; ids 0-{self.count - 1} inside are "
                f"host {self.base}-{self.base + self.count - 1}; idmapped layers"
                + (f"; {own}" if own else "") + ")")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def make(base: int, count: int, owner: int = -1) -> UserNamespace:
    """A new user namespace mapping ids 0..count-1 to the host's base..base+count-1 (uids and
    gids alike; setgroups stays allowed: the maps are written by root of the host), owned by
    host uid ``owner`` (-1: root). OSError says why it could not be made. (An image sandbox's
    own namespace is made by its init, `imagebox.own_userns`, as its own id; the manager makes
    one such here at start to learn whether this host lets an unprivileged uid make one.)"""
    p = subprocess.Popen([sys.executable, "-S", "-c", _HELPER, str(int(owner))],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
    try:
        assert p.stdout is not None and p.stdin is not None
        said = p.stdout.readline().decode(errors="replace").strip()
        if said != "ok":
            raise OSError(f"cannot make a user namespace: {said or 'the helper died'}")
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{p.pid}/{name}", "w") as f:
                f.write(f"0 {base} {count}\n")
        fd = os.open(f"/proc/{p.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        if p.stdin is not None:
            with contextlib.suppress(OSError):
                p.stdin.close()
        p.kill()
        p.wait()
        if p.stdout is not None:
            p.stdout.close()
    return UserNamespace(fd, base, count)

