"""Manager side of environment images and frozen sessions (issue 17).

Invariant: a sandbox enters an image only through `enter_image` (the layers directory is lent
to its init as one O_PATH fd, right after the request frame, and closed on our side after);
a session's processes are frozen (cgroup freezer: v1 ``freezer.state``, v2 ``cgroup.freeze``)
whenever no action of the session runs, thawed only for an action, with the action's
allotment written as the CPU quota first; a session is thawed before it is killed (a v1
frozen task cannot die until thawed). Each thaw + re-quota + freeze is timed
(`SessionSwitch`), and the figures go back with the action's result.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from .. import _linux
from ..images.layers import Layer
from ..images.store import Image, ImageStore
from .cgroups import CgroupTree, Slot
from .payload import SandboxRequest
from .pool import Sandbox
from .userns import UserNamespace

_FROZEN_WAIT_S = 0.5  # at most this long for a v1 FREEZING state to become FROZEN
_OPEN_TREE_CLONE = 1
def open_tree_clone(path: str) -> int:
    """A detached copy of the mount at ``path`` (``open_tree(OPEN_TREE_CLONE)``), as an fd.

    overlayfs takes its lower layers only from mounts of the mounting process's own namespace
    or from the root of an anonymous one: the sandbox's namespace holds no host mount, so its
    init gets this fd, whose mount belongs to no namespace's tree."""
    import ctypes

    try:
        return _linux.syscall(_linux.SYS_OPEN_TREE, ctypes.c_int(-100), os.fsencode(path),
                       ctypes.c_uint(_OPEN_TREE_CLONE | os.O_CLOEXEC))
    except OSError as e:
        raise OSError(e.errno, f"open_tree({path}): {e.strerror}") from None


def _freezer_mount() -> str | None:
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 3 and parts[2] == "cgroup" and "freezer" in parts[3].split(","):
                return parts[1]
    return None


def _own_freezer_path() -> str:
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if "freezer" in ctrls.split(","):
                return path
    return "/"


class Freezer:
    """One session's freezer: v1 its own cgroup in the freezer hierarchy; v2 the slot's."""

    def __init__(self, dir_: str, version: str, own: bool) -> None:
        self.dir, self.version, self.own = dir_, version, own
        self.frozen = False
        name = "freezer.state" if version == "v1" else "cgroup.freeze"
        self._w = os.open(f"{dir_}/{name}", os.O_WRONLY | os.O_CLOEXEC)
        self._r = os.open(f"{dir_}/{name}" if version == "v1" else f"{dir_}/cgroup.events",
                          os.O_RDONLY | os.O_CLOEXEC)

    def add(self, pids: list[int]) -> None:
        if self.own:
            for pid in pids:
                with open(f"{self.dir}/cgroup.procs", "w") as f:
                    f.write(str(pid))

    def _state_frozen(self) -> bool:
        data = os.pread(self._r, 512, 0)
        if self.version == "v1":
            return data.strip() == b"FROZEN"
        return b"frozen 1" in data

    def freeze(self) -> bool:
        """Freeze; True once every task is frozen (waits up to `_FROZEN_WAIT_S`)."""
        os.pwrite(self._w, b"FROZEN" if self.version == "v1" else b"1", 0)
        self.frozen = True
        if self._state_frozen():
            return True
        deadline = time.monotonic() + _FROZEN_WAIT_S
        while time.monotonic() < deadline:
            time.sleep(0.0002)
            if self._state_frozen():
                return True
        return False

    def thaw(self) -> None:
        os.pwrite(self._w, b"THAWED" if self.version == "v1" else b"0", 0)
        self.frozen = False

    def close(self) -> None:
        for fd in (self._w, self._r):
            with contextlib.suppress(OSError):
                os.close(fd)


def _thaw_stale(parent: str) -> None:
    """Sessions of a manager that was killed (``tangram-<pid>-sessions``, pid gone) stay frozen,
    and a v1 frozen task cannot die: thaw them and kill what is left (only sessions' processes
    are ever put there), then remove the cgroups that are empty."""
    import signal

    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            pid = name[len("tangram-"):-len("-sessions")].split(".")[0] if name.endswith("-sessions") else ""
            if not name.startswith("tangram-") or not pid.isdigit() \
                    or os.path.exists(f"/proc/{pid}"):
                continue
            base = os.path.join(parent, name)
            for child in os.listdir(base):
                d = os.path.join(base, child)
                if not os.path.isdir(d):
                    continue
                with contextlib.suppress(OSError):
                    with open(f"{d}/freezer.state", "w") as f:
                        f.write("THAWED")
                    with open(f"{d}/cgroup.procs") as f:
                        for p in f.read().split():
                            with contextlib.suppress(OSError):
                                os.kill(int(p), signal.SIGKILL)
                for _ in range(20):
                    try:
                        os.rmdir(d)
                        break
                    except OSError:
                        time.sleep(0.05)
            with contextlib.suppress(OSError):
                os.rmdir(base)


class FreezerTree:
    """Where session freezers live: v1 ``<freezer>/<own>/<its cgroup tree's tag>-sessions/<n>``."""

    def __init__(self, cgroups: CgroupTree | None) -> None:
        self.version = cgroups.version if cgroups is not None else None
        self.base: str | None = None
        self.problem = ""
        self._n = 0
        if self.version == "v1":
            m = _freezer_mount()
            if m is None:
                self.version, self.problem = None, "no cgroup v1 freezer hierarchy mounted"
                return
            parent = m + _own_freezer_path()
            _thaw_stale(parent)
            tag = cgroups.tag if cgroups is not None else f"tangram-{os.getpid()}"
            self.base = os.path.join(parent, f"{tag}-sessions")  # one per manager, as its slots
            try:
                os.makedirs(self.base, exist_ok=True)
            except OSError as e:
                self.version, self.problem = None, f"cannot create freezer cgroups: {e}"
        elif self.version is None:
            self.problem = "no cgroups"

    @property
    def available(self) -> bool:
        return self.version is not None

    def new(self, slot: Slot | None) -> Freezer | None:
        if self.version == "v1" and self.base is not None:
            self._n += 1
            d = os.path.join(self.base, f"f{self._n}")
            os.makedirs(d, exist_ok=True)
            return Freezer(d, "v1", own=True)
        if self.version == "v2" and slot is not None:
            return Freezer(slot.dirs["cpu"], "v2", own=False)
        return None

    def drop(self, fz: Freezer) -> None:
        """Thaw (so a killed task can die) and close; v1: the cgroup is removed once empty."""
        with contextlib.suppress(OSError):
            fz.thaw()
        fz.close()
        if fz.own:
            asyncio.get_event_loop().call_later(0.05, self._rmdir, fz.dir, 200)

    def _rmdir(self, d: str, tries: int) -> None:
        try:
            os.rmdir(d)
        except FileNotFoundError:
            return
        except OSError:
            if tries > 0:
                asyncio.get_event_loop().call_later(0.1, self._rmdir, d, tries - 1)

    def close(self) -> None:
        if self.base is None:
            return
        for _ in range(20):
            with contextlib.suppress(OSError):
                for n in os.listdir(self.base):
                    p = os.path.join(self.base, n)
                    if os.path.isdir(p):
                        with contextlib.suppress(OSError):
                            with open(f"{p}/freezer.state", "w") as f:
                                f.write("THAWED")
                            os.rmdir(p)
                os.rmdir(self.base)
                return
            time.sleep(0.05)


@dataclass(slots=True)
class SessionSwitch:
    """What one session action's CPU hand-over cost, in seconds."""

    thaw_s: float = 0.0
    requota_s: float = 0.0
    freeze_s: float = 0.0
    frozen: bool = True  # every task reached FROZEN in time

    @property
    def total_s(self) -> float:
        return self.thaw_s + self.requota_s + self.freeze_s

    def to_dict(self) -> dict[str, Any]:
        return {"thaw_ms": round(self.thaw_s * 1e3, 4), "requota_ms": round(self.requota_s * 1e3, 4),
                "freeze_ms": round(self.freeze_s * 1e3, 4), "total_ms": round(self.total_s * 1e3, 4),
                "frozen": self.frozen}


def slot_pids(slot: Slot | None) -> list[int]:
    if slot is None:
        return []
    d = slot.dirs.get("pids") or slot.dirs.get("cpu") or next(iter(slot.dirs.values()))
    try:
        with open(f"{d}/cgroup.procs") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


@dataclass(slots=True, frozen=True)
class Inside:
    """What a sandbox's init reported on entering an image: the image's python3, and where the
    node's user namespace was lent, the image's user (ids as seen inside) and its home."""

    python: str | None = None
    uid: int | None = None  # None: the sandbox uid (no user namespace)
    gid: int | None = None
    home: str | None = None
    cwd: str = "/workdir"  # the image's WorkingDir (every child's cwd), or the work directory

    @staticmethod
    def of(reply: dict[str, Any]) -> Inside:
        userns = bool(reply.get("userns"))
        return Inside(python=reply.get("python"),
                      uid=int(reply["uid"]) if userns else None,
                      gid=int(reply["gid"]) if userns else None,
                      home=str(reply["home"]) if userns and reply.get("home") else None,
                      cwd=str(reply.get("cwd") or "/workdir"))


async def enter_image(sb: Sandbox, store: ImageStore, img: Image, layer_mb: int, uid: int,
                      gid: int, layer: Layer | None = None,
                      timeout: float = 30.0, userns: UserNamespace | None = None,
                      owner: int = -1) -> dict[str, Any]:
    """Have ``sb``'s init mount ``img`` with a writable layer of ``layer_mb`` MiB and pivot into
    it; its reply (``{"ok", "enter_s", "python", "uid", ...}``, `Inside.of`, or ``{"error"}``).
    The writable layer is ``layer`` (a detached mount on the node's disk, `layers.py`), lent to
    the init beside the cache's fd, or without one a tmpfs of ``layer_mb`` MiB that the init
    mounts itself. With ``userns`` (the node's, `userns.py`) the cache's copy is idmapped
    through it and its fd lent last: the init joins it as the image's user's root; with
    ``owner`` too (the sandbox's own host uid, `host/ids.py`), the init makes a user namespace
    of its own with the same maps, owned by ``owner``, idmaps the copy through that one and
    joins it (`imagebox.own_userns`; issue 35, M2: what its processes count per user is then
    charged to ``owner``, not to the node's namespace's owner, host root)."""
    fd = open_tree_clone(store.layers_dir)
    fds = [fd] if layer is None else [fd, layer.fd]
    try:
        if userns is not None and owner < 0:
            userns.idmap(fd)
            fds.append(userns.fd)
        cfg = img.config
        msg = {"op": "image", "layers": [os.path.basename(p) for p in store.layer_paths(img)],
               "layer_mb": int(layer_mb), "uid": uid, "gid": gid,
               "layer": "memory" if layer is None else "disk",
               "config": {k: cfg[k] for k in ("User", "WorkingDir", "Entrypoint", "Cmd", "Env")
                          if k in cfg},
               "userns": None if userns is None else
               {"base": userns.base, "count": userns.count, **({"owner": owner} if owner >= 0
                                                              else {})}}
        fut = asyncio.ensure_future(sb.request(msg, timeout))
        await asyncio.sleep(0)  # the frame goes out first; the init then reads the fd
        if fut.done():
            return await fut
        sock = sb.conn.sock
        for _ in range(1000):
            try:
                socket.send_fds(sock, [b"\0"], fds)
                break
            except BlockingIOError:
                await asyncio.sleep(0.001)
        return await fut
    finally:
        os.close(fd)


def image_env(env: dict[str, str], img: Image, home: str | None = None) -> dict[str, str]:
    """The sandbox's environment with the image's own ``Env`` (its PATH first) over it; with
    ``home`` (the image's user's, from its /etc/passwd), HOME is that unless ``Env`` sets it."""
    out = dict(env)
    out["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    if home:
        out["HOME"] = home
    for kv in img.config.get("Env") or ():
        k, sep, v = str(kv).partition("=")
        if sep and not k.startswith("TANGRAM_"):
            out[k] = v
    return out


def _in_workdir(arg: str) -> str:
    """An argv template's file argument (``{file}``, ``{stem}``, ``./main``) by its absolute
    path in the work directory: the action's cwd is the image's WorkingDir."""
    if arg.startswith("./"):
        arg = arg[2:]
    elif not arg.startswith(("{file}", "{stem}")):
        return arg
    return "/workdir/" + arg


def image_request(req: SandboxRequest, img: Image, inside: Inside | None,
                  layer_mb: int | None) -> SandboxRequest:
    """A one-shot or session request adjusted to run in the image: its environment, Python run
    by the image's python3 (the init's own interpreter is the host's), as the image's user
    where the sandbox runs in the node's user namespace, and the files of a one-shot action
    named by their path in /workdir where the cwd is the image's WorkingDir."""
    inside = inside or Inside()
    out = req.copy()
    out["env"] = image_env(req["env"], img, inside.home)
    out.pop("direct", None)
    lang = req["lang"].copy()
    if lang["inproc"]:
        lang["inproc"], lang["run"] = False, [inside.python or "python3", "{file}"]
    if inside.cwd != "/workdir":
        if lang["compile"]:
            lang["compile"] = [_in_workdir(a) for a in lang["compile"]]
        if lang["run"]:
            lang["run"] = [_in_workdir(a) for a in lang["run"]]
    out["lang"] = lang
    if layer_mb or inside.uid is not None:
        limits = req["limits"].copy()
        if layer_mb:  # files may grow to the writable layer's size (RLIMIT_FSIZE)
            limits["fsize"] = int(layer_mb) << 20
        if inside.uid is not None and inside.gid is not None:  # the image's user
            limits["uid"], limits["gid"] = inside.uid, inside.gid
        out["limits"] = limits
    return out
