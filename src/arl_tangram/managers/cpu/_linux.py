"""Thin ctypes bindings to the Linux calls Python 3.11 lacks (unshare, setns, mount, pivot_root,
prctl, and raw `syscall` for the new mount API).

Invariant: every wrapper raises ``OSError`` with the errno and the call's arguments on failure;
nothing here keeps state, so a forked child may use it freely. This is the package's one libc
loader: every other module (`images.layers`, `host.overlay`, the fork server, sandboxes) calls
libc through it. (The isolation probe, a program run inside a sandbox, is the one exception:
it checks the filter with its own code, not ours.)
"""

from __future__ import annotations

import ctypes
import importlib
import os
import signal
import struct
from typing import Any

try:
    _libc = ctypes.CDLL("libc.so.6", use_errno=True)
except OSError:  # not glibc: ask the (heavier) finder
    import ctypes.util

    _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
for _name in ("unshare", "setns", "mount", "umount2", "syscall", "sethostname", "prctl"):
    getattr(_libc, _name)  # looked up once, here: not again (dlsym + objects) in every sandbox
_libc.syscall.restype = ctypes.c_long  # (a raw system call returns a long)

# System call numbers (x86_64; from 424 on, the unified table every architecture shares)
SYS_PIVOT_ROOT = 155
SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
SYS_FSOPEN, SYS_FSCONFIG, SYS_FSMOUNT = 430, 431, 432
SYS_MOUNT_SETATTR = 442

# The C signal module: its calls return plain ints, where `signal`'s wrappers convert every
# result to an enum member (in a freshly forked interpreter that costs ~100 copy-on-write page
# faults). Used on the fork path; the constants below are plain ints for it.
raw_signal: Any = importlib.import_module("_signal")
SIG_BLOCK, SIG_UNBLOCK, SIG_SETMASK = (int(signal.SIG_BLOCK), int(signal.SIG_UNBLOCK),
                                       int(signal.SIG_SETMASK))
SIG_DFL, SIG_IGN = int(signal.SIG_DFL), int(signal.SIG_IGN)
SIGCHLD = (int(signal.SIGCHLD),)  # a mask of one
SIGPIPE = int(signal.SIGPIPE)
CHILD_DEFAULT_SIGNALS = tuple(int(s) for s in (
    signal.SIGPIPE, signal.SIGXFSZ, signal.SIGXCPU, signal.SIGINT, signal.SIGTERM, signal.SIGCHLD))

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
PR_GET_NO_NEW_PRIVS = 39
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
PR_SET_MM = 35
PR_SET_MM_ARG_START = 8
PR_SET_MM_ARG_END = 9
PR_SET_MM_ENV_START = 10
PR_SET_MM_ENV_END = 11


# Integer arguments go to libc as plain Python ints (ctypes passes them as a C int, which the
# x86-64 and arm64 calling conventions widen to the register), never wrapped in `ctypes.c_int`
# and friends: each wrapper is an object made in every freshly forked sandbox, with its
# copy-on-write page faults. Only flags and small numbers that fit an int come here (`_int`).
_INT_MAX = (1 << 31) - 1


def _int(v: int) -> int:
    if not 0 <= v <= _INT_MAX:
        raise OverflowError(f"{v!r} does not fit a C int")
    return v


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    if _libc.unshare(_int(flags)) != 0:
        _check(-1, f"unshare({flags:#x})")


def setns(fd: int, nstype: int) -> None:
    if _libc.setns(_int(fd), _int(nstype)) != 0:
        _check(-1, f"setns({fd}, {nstype:#x})")


def _enc(s: str | None) -> bytes | None:
    return s.encode() if s is not None else None


def mount(source: str | None, target: str, fstype: str | None, flags: int = 0,
          data: str | None = None) -> None:
    rc = _libc.mount(_enc(source), _enc(target), _enc(fstype), _int(flags), _enc(data))
    if rc != 0:
        _check(rc, f"mount({source!r}, {target!r}, {fstype!r}, {flags:#x}, {data!r})")


def syscall(nr: int, *args: Any) -> int:
    """``syscall(nr, *args)`` through libc (``args`` as ctypes takes them): its non-negative
    result; OSError with the errno on failure."""
    r = int(_libc.syscall(ctypes.c_long(nr), *args))
    if r < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return r


def umount2(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(target.encode(), ctypes.c_int(flags)), f"umount2({target!r})")


def pivot_root(new_root: str, put_old: str) -> None:
    rc = _libc.syscall(ctypes.c_long(SYS_PIVOT_ROOT), new_root.encode(), put_old.encode())
    _check(rc, f"pivot_root({new_root!r}, {put_old!r})")


def move_mount(fd: int, target: str) -> None:
    """Attach the detached mount ``fd`` (``fsmount``, ``open_tree``) at ``target`` in the
    caller's mount namespace (``move_mount(fd, "", AT_FDCWD, target, F_EMPTY_PATH)``)."""
    rc = _libc.syscall(ctypes.c_long(SYS_MOVE_MOUNT), _int(fd), b"", ctypes.c_int(-100), target.encode(),
                       ctypes.c_uint(0x4))  # MOVE_MOUNT_F_EMPTY_PATH
    _check(rc, f"move_mount({fd}, {target!r})")


def idmap_mount(fd: int, userns_fd: int) -> None:
    """Make the detached mount ``fd`` (``open_tree(OPEN_TREE_CLONE)``) and the mounts below it
    idmapped through the user namespace ``userns_fd`` (``mount_setattr(MOUNT_ATTR_IDMAP)``,
    Linux 5.12+; the file system must support it: ext4, xfs, btrfs, tmpfs 6.3+...)."""
    attr = ctypes.create_string_buffer(struct.pack("=QQQQ", 0x00100000, 0, 0, userns_fd), 32)
    rc = _libc.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), _int(fd), b"",
                       ctypes.c_uint(0x1000 | 0x8000), attr, ctypes.c_size_t(32))
    _check(rc, "mount_setattr(MOUNT_ATTR_IDMAP)")  # (AT_EMPTY_PATH | AT_RECURSIVE)


def sethostname(name: str) -> None:
    b = name.encode()
    if _libc.sethostname(b, _int(len(b))) != 0:
        _check(-1, f"sethostname({name!r})")


def prctl(option: int, arg2: int = 0) -> int:
    rc = _libc.prctl(_int(option), _int(arg2), 0, 0, 0)
    if rc < 0:
        _check(rc, f"prctl({option}, {arg2})")
    return int(rc)


PR_SET_NAME = 15


def set_name(name: str) -> None:
    """This thread's name (``comm``, as ps/top/perf show it), at most 15 bytes."""
    buf = ctypes.create_string_buffer(name.encode()[:15])
    _check(_libc.prctl(ctypes.c_int(PR_SET_NAME), buf, ctypes.c_ulong(0), ctypes.c_ulong(0),
                       ctypes.c_ulong(0)), f"prctl(PR_SET_NAME, {name!r})")


def set_no_new_privs() -> None:
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def install_filter(prog_ref: Any) -> None:
    """Install a seccomp BPF program (``ctypes.byref`` of a ``sock_fprog``, made in advance by
    `seccomp.Program`) on this thread; needs no_new_privs (or CAP_SYS_ADMIN). One syscall."""
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prog_ref, 0, 0) != 0:
        _check(-1, "prctl(PR_SET_SECCOMP)")


def scrub_exec_strings(title: bytes) -> None:
    """Overwrite the argument and environment strings this process was exec'd with (what
    ``/proc/PID/cmdline`` and ``/proc/PID/environ`` show, in this process and in every fork of
    it) with ``title`` and zeros, and, where the kernel lets us (CAP_SYS_RESOURCE), shrink the
    ranges the kernel shows to ``title`` and nothing. Python's own copies (``sys.orig_argv``,
    ``os.environ``) are not touched here."""
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    # fields[0] is field 3 (state); arg_start..env_end are fields 48..51
    arg_start, arg_end, env_start, env_end = (int(x) for x in fields[45:49])
    for start, end, text in ((arg_start, arg_end, title), (env_start, env_end, b"")):
        n = end - start
        if n <= 0:
            continue
        ctypes.memset(start, 0, n)
        ctypes.memmove(start, text[: max(0, n - 1)], min(len(text), max(0, n - 1)))
    # shrink (best effort: needs CAP_SYS_RESOURCE and a kernel with checkpoint/restore)
    for opt, val in ((PR_SET_MM_ARG_END, arg_start + min(len(title) + 1, arg_end - arg_start)),
                     (PR_SET_MM_ENV_END, env_start)):
        _libc.prctl(PR_SET_MM, opt, ctypes.c_ulong(val), 0, 0)


def die_with_parent() -> None:
    """SIGKILL this process when its parent (thread) dies. The kernel clears this on every
    change of effective uid/gid, so it is set again after each drop of privileges."""
    prctl(PR_SET_PDEATHSIG, 9)


def write_proc(path: str, data: bytes) -> bool:
    """Write a small /proc file with plain syscalls; False if that failed. (No `open()` and no
    context manager: their objects cost page faults in a freshly forked interpreter.)"""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.write(fd, data)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


PROT_READ, PROT_WRITE, PROT_EXEC = 1, 2, 4


def share_file_ptes(page: int = 4096) -> int:
    """Give every read-only private file mapping (the interpreter's and libraries' code) an
    anon_vma, so that fork() copies its page-table entries instead of leaving the child to fault
    each page it runs back in (a minor fault per page of code: costly in a VM). Done by one
    copy-on-write write of a byte to itself; returns how many mappings got one."""
    n = 0
    with open("/proc/self/maps") as f:
        lines = f.read().splitlines()
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 6 or parts[4] == "0" or parts[1][3] != "p" or parts[1][1] == "w":
            continue
        if not parts[5].startswith("/"):
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        prot = (PROT_READ if parts[1][0] == "r" else 0) | (PROT_EXEC if parts[1][2] == "x" else 0)
        if not prot & PROT_READ:
            continue
        if _libc.mprotect(ctypes.c_void_p(start), ctypes.c_size_t(end - start),
                          ctypes.c_int(prot | PROT_WRITE)) != 0:
            continue
        try:
            b = ctypes.c_ubyte.from_address(start)
            b.value = b.value
            n += 1
        finally:
            _libc.mprotect(ctypes.c_void_p(start), ctypes.c_size_t(end - start), ctypes.c_int(prot))
    return n
