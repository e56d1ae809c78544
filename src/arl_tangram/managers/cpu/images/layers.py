"""Writable layers of image sandboxes, on the node's disk (issue 17).

Invariant: a layer is a file system of its own (ext4, no journal) of exactly its cap, in a
sparse file on the node's disk, attached to a loop device that clears itself and mounted
*detached* (``fsmount``): no path of the host names the mount, the backing file is unlinked as
soon as the loop device holds it, and the whole layer lives exactly as long as its last mount,
the one the sandbox's init moves into its own namespace (`imagebox.enter`, with
`_linux.move_mount`: the fork server never imports this module, whose threads and subprocesses
would cost every sandbox's fork). When the sandbox dies, its namespace goes, the file system is
unmounted, the loop device clears and the disk blocks are freed, whoever dies first: manager,
fork server or sandbox.

A write past the cap fails inside that file system only (ENOSPC), and the sum of the caps of
the layers handed out is kept within the node's layer budget (by default the disk's free space
less a tenth of the disk), so sessions can never fill the node's disk: the backing files are
sparse, but the budget counts every layer at its full cap. Formatting (``mkfs.ext4``, ~9 ms)
is kept off the open path by a small warm pool of ready layers of the default size, as the
warm pool keeps sandboxes.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import itertools
import os
import shutil
import struct
import subprocess
import threading
from dataclasses import dataclass

from arl_tangram.core.errors import TangramError

from .. import _linux

MIN_LAYER_MB = 4  # ext4 needs a few hundred KiB of its own; below this the cap would be a lie

_FSOPEN_CLOEXEC = _FSMOUNT_CLOEXEC = 1
_FSCONFIG_SET_FLAG, _FSCONFIG_SET_STRING, _FSCONFIG_CMD_CREATE = 0, 1, 6
_MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 0x2, 0x4
_LOOP_CTL_GET_FREE, _LOOP_CONFIGURE = 0x4C82, 0x4C0A
_LO_FLAGS_AUTOCLEAR, _LO_FLAGS_DIRECT_IO = 4, 16

def _loop_attach(path: str) -> int:
    """A free loop device backed by ``path`` (autoclear; direct I/O where the disk takes it, so
    the layer's pages are not cached twice), as an open fd of the device."""
    backing = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(16):  # a device found free may be taken before we bind it: EBUSY, again
            ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
            try:
                n = fcntl.ioctl(ctl, _LOOP_CTL_GET_FREE)
            finally:
                os.close(ctl)
            dev = os.open(f"/dev/loop{n}", os.O_RDWR | os.O_CLOEXEC)
            try:
                if _loop_configure(dev, backing):
                    return dev
            except BaseException:
                os.close(dev)
                raise
            os.close(dev)
        raise OSError(errno.EBUSY, "no free loop device (16 tries)")
    finally:
        os.close(backing)


def _loop_configure(dev: int, backing: int) -> bool:
    """Bind ``backing`` to loop device ``dev``; False if another process bound it first."""
    for flags in (_LO_FLAGS_AUTOCLEAR | _LO_FLAGS_DIRECT_IO, _LO_FLAGS_AUTOCLEAR):
        # struct loop_config {fd, block_size, struct loop_info64 {dev, inode, rdev, offset,
        # sizelimit, number, encrypt_type, encrypt_key_size, flags, file_name[64],
        # crypt_name[64], encrypt_key[32], init[2]}, reserved[8]}
        info = struct.pack("=QQQQQIIII64s64s32sQQ", 0, 0, 0, 0, 0, 0, 0, 0, flags,
                           b"", b"", b"", 0, 0)
        try:
            fcntl.ioctl(dev, _LOOP_CONFIGURE, struct.pack("=II", backing, 0) + info + bytes(64))
            return True
        except OSError as e:
            if e.errno == errno.EBUSY:
                return False
            if not flags & _LO_FLAGS_DIRECT_IO:
                raise  # (with direct I/O refused, again without it)
    return False


def _fsmount_ext4(dev_fd: int) -> int:
    """The ext4 file system on loop device ``dev_fd``, mounted nowhere: a detached mount's fd."""
    fs = _linux.syscall(_linux.SYS_FSOPEN, b"ext4", ctypes.c_uint(_FSOPEN_CLOEXEC))
    try:
        _linux.syscall(_linux.SYS_FSCONFIG, ctypes.c_int(fs), ctypes.c_uint(_FSCONFIG_SET_STRING), b"source",
             f"/proc/self/fd/{dev_fd}".encode(), ctypes.c_int(0))
        # the file is sparse, so never-written inode tables already read as zeros: no need for
        # the kernel's background thread that would write them out
        _linux.syscall(_linux.SYS_FSCONFIG, ctypes.c_int(fs), ctypes.c_uint(_FSCONFIG_SET_FLAG), b"noinit_itable",
             None, ctypes.c_int(0))
        _linux.syscall(_linux.SYS_FSCONFIG, ctypes.c_int(fs), ctypes.c_uint(_FSCONFIG_CMD_CREATE), None, None,
             ctypes.c_int(0))
        return _linux.syscall(_linux.SYS_FSMOUNT, ctypes.c_int(fs), ctypes.c_uint(_FSMOUNT_CLOEXEC),
                    ctypes.c_uint(_MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV))
    finally:
        os.close(fs)


MEMORY_FS = ("tmpfs", "ramfs")
FALLBACK_DIR = "/var/tmp/arl-tangram/layers"  # on disk on every common distribution


def fs_type(path: str) -> str:
    """The type of the file system holding ``path`` (the longest mount point above it in
    /proc/self/mountinfo; of two on one point the later, which covers the earlier), or ""
    where it cannot be told."""
    path = os.path.realpath(path)
    best, kind = -1, ""
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                mnt = left.split()[4].replace("\\040", " ")
                inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= best:
                    best, kind = len(mnt), right.split()[0]
    except (OSError, IndexError):
        return ""
    return kind


def default_dir(work_root: str) -> str:
    """Where layers go by default: ``work_root/layers``, unless ``work_root`` is in memory
    (a tmpfs /tmp, as on Debian 13 or Fedora), where a layer "on disk" would not be."""
    return FALLBACK_DIR if fs_type(work_root) in MEMORY_FS else os.path.join(work_root, "layers")


def _mkfs() -> str | None:
    found = shutil.which("mkfs.ext4")
    if found:
        return found
    for d in ("/usr/sbin", "/sbin"):
        if os.access(f"{d}/mkfs.ext4", os.X_OK):
            return f"{d}/mkfs.ext4"
    return None


class LayerError(TangramError):
    """A layer could not be made or is over the node's budget; the message says which."""


@dataclass(slots=True, eq=False)
class Layer:
    """One writable layer: ``fd`` is its detached mount (close it once the sandbox holds it)."""

    fd: int
    mb: int

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


class LayerStore:
    """This node's writable layers: made in ``dir_`` (backing files live there only until their
    loop device holds them), ``budget_mb`` for the caps of the layers handed out at once, and
    ``warm`` ready layers of ``default_mb`` kept in hand.

    Thread-safe: layers are made in worker threads (`take` is called through
    ``asyncio.to_thread``), refills run in a thread of their own."""

    def __init__(self, dir_: str, default_mb: int, budget_mb: int = 0, warm: int = 2) -> None:
        self.dir, self.default_mb, self.warm = dir_, int(default_mb), int(warm)
        self.problem = ""
        self.used_mb = 0
        # per owner (a tenant): MiB of the budget kept for it (`reserve`), MiB its layers hold
        self.reserved: dict[str, int] = {}
        self.held: dict[str, int] = {}
        self._ready: list[Layer] = []
        self._lock = threading.Lock()
        self._names = itertools.count()
        self._refilling = False
        self._closed = False
        self._mkfs = _mkfs()
        try:
            os.makedirs(self.dir, 0o700, exist_ok=True)
            self._sweep()
            disk = shutil.disk_usage(self.dir)
        except OSError as e:
            self.problem, spare_mb = f"layer directory {self.dir}: {e}", 0
        else:  # default: the disk free now less a tenth of the disk, kept for everything else
            spare_mb = max(0, disk.free - disk.total // 10) >> 20
        self.budget_mb = int(budget_mb) if budget_mb > 0 else spare_mb
        if not self.problem and fs_type(self.dir) in MEMORY_FS:
            self.problem = f"layer directory {self.dir} is on {fs_type(self.dir)} (memory)"
        if not self.problem:
            self.problem = self._probe()  # leaves one ready layer; more once layers are taken

    @property
    def available(self) -> bool:
        return not self.problem

    def _sweep(self) -> None:
        """Backing files left by a process that died between making and attaching one."""
        for name in os.listdir(self.dir):
            pid = name.split("-", 1)[0]
            if name.endswith(".ext4") and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.dir, name))

    def _probe(self) -> str:
        if self._mkfs is None:
            return "mkfs.ext4 not found (install e2fsprogs)"
        if not os.path.exists("/dev/loop-control"):
            return "no /dev/loop-control (loop devices)"
        try:
            self._ready.append(self._make(self.default_mb))
        except (OSError, subprocess.SubprocessError) as e:
            return f"cannot make a disk layer: {e}"
        return ""

    @property
    def prefix(self) -> str:
        """The start of the names of this store's backing files (`_make`; the reaper removes
        what a killed service left, `reaper.server.clean`)."""
        return f"{os.getpid()}-{id(self):x}-"

    def _make(self, mb: int) -> Layer:
        assert self._mkfs is not None
        path = os.path.join(self.dir, f"{self.prefix}{next(self._names)}.ext4")
        try:
            with open(path, "wb") as f:
                f.truncate(mb << 20)  # sparse: blocks are taken as the layer is written
            subprocess.run([self._mkfs, "-q", "-F", "-O", "^has_journal", "-m", "0",
                            "-E", "lazy_itable_init=1,nodiscard", path],
                           check=True, capture_output=True, timeout=60)
            dev = _loop_attach(path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)  # the loop device holds it from here on
        try:
            return Layer(_fsmount_ext4(dev), mb)
        finally:
            os.close(dev)  # the mount holds the device (autoclear once unmounted)

    def reserve(self, reserved: dict[str, int]) -> None:
        """Keep ``reserved[owner]`` MiB of the budget for each owner (issue 41, M3): an owner
        below its reservation is never refused because others filled the budget; what is not
        reserved is shared (first come). The reservations' sum may not pass the budget."""
        got = {str(o): int(mb) for o, mb in reserved.items() if int(mb) > 0}
        if sum(got.values()) > self.budget_mb:
            raise ValueError(f"layer reservations of {sum(got.values())} MiB in all exceed the "
                             f"node's layer budget of {self.budget_mb} MiB")
        with self._lock:
            self.reserved = got

    def _kept_for_others(self, owner: str | None) -> int:
        """MiB of the budget kept for owners other than ``owner`` below their reservation."""
        return sum(max(0, r - self.held.get(o, 0)) for o, r in self.reserved.items()
                   if o != owner)

    def take(self, mb: int | None = None, owner: str | None = None) -> Layer:
        """A fresh, empty layer of ``mb`` MiB (default: the store's), counted against the
        budget (and ``owner``'s share, `reserve`) until `give_back`. Blocks for ~10 ms when no
        ready one fits."""
        mb = int(mb or self.default_mb)
        if self.problem:
            raise LayerError(f"no disk layers on this node: {self.problem}")
        if mb < MIN_LAYER_MB:
            raise LayerError(f"layer_mb must be at least {MIN_LAYER_MB}, got {mb}")
        with self._lock:
            kept = self._kept_for_others(owner)
            if self.used_mb + kept + mb > self.budget_mb:
                raise LayerError(
                    f"the node's layer budget is spent: {self.used_mb} of {self.budget_mb} MiB "
                    f"held by open layers, "
                    + (f"{kept} MiB kept for other tenants below their reservation, " if kept
                       else "") + f"{mb} MiB asked")
            self.used_mb += mb
            if owner is not None:
                self.held[owner] = self.held.get(owner, 0) + mb
            layer = next((x for x in self._ready if x.mb == mb), None)
            if layer is not None:
                self._ready.remove(layer)
        try:
            if layer is None:
                layer = self._make(mb)
        except BaseException as e:
            self.give_back(mb, owner)
            raise LayerError(f"cannot make a {mb} MiB disk layer: {e}") from e
        self.refill()
        return layer

    def give_back(self, mb: int, owner: str | None = None) -> None:
        """A layer handed out by `take` (for ``owner``) is gone (its sandbox was released)."""
        with self._lock:
            self.used_mb = max(0, self.used_mb - int(mb))
            if owner is not None and owner in self.held:
                left = self.held[owner] - int(mb)
                if left > 0:
                    self.held[owner] = left
                else:
                    del self.held[owner]

    def refill(self) -> None:
        """Make ready layers up to ``warm`` in a background thread (one refill at a time)."""
        with self._lock:
            if self._refilling or self._closed or len(self._ready) >= self.warm:
                return
            self._refilling = True
        threading.Thread(target=self._refill, name="tangram-layers", daemon=True).start()

    def _refill(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._closed or len(self._ready) >= self.warm:
                        return
                try:
                    layer = self._make(self.default_mb)
                except (OSError, subprocess.SubprocessError):
                    return  # `take` makes one itself and reports why
                with self._lock:
                    if self._closed:
                        layer.close()
                        return
                    self._ready.append(layer)
        finally:
            with self._lock:
                self._refilling = False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            ready, self._ready = self._ready, []
        for layer in ready:
            layer.close()
