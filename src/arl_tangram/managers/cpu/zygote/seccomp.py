"""The sandboxes' default syscall filter (seccomp), built with libseccomp through ctypes.

Invariant: the filter allows every system call except those in `DENY` (and `clone` with a
namespace flag, and `socket`/`socketpair` of a family in `DENY_SOCKET_FAMILIES`), which fail
with EPERM; `clone3` fails with ENOSYS, so that the C library falls
back to `clone`, whose flags the filter can see (Docker's default profile does the same). A
call made through another architecture's entry (i386 `int 0x80`, x32) kills the process.

The program is built once, in the fork server (`build`), by libseccomp (Debian ``libseccomp2``,
``libseccomp.so.2``; no Python binding is needed: Debian's ``python3-seccomp`` is built for the
system Python, not for the interpreter the service runs) and exported as raw BPF; each sandbox
installs it with a single ``prctl(PR_SET_SECCOMP)`` as the last step of its privilege drop
(`child.final_drop`), after the namespace and mount set-up that needs some of these calls, and
before any of the action's code runs. Reference: docs/sandbox.md, "Syscall filter".
"""

from __future__ import annotations

import ctypes
import errno
import marshal
import os

# Denied with EPERM. Docker's default profile is the reference (it allows a list and denies the
# rest; these are the calls it leaves out that exist on x86-64/arm64), plus the calls added to
# the kernel since that an untrusted program has no use for (new mount API, io_uring, pidfd_getfd).
DENY = (
    # tracing and reading/writing other processes' memory
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    # kernel keyrings (not namespaced)
    "keyctl", "add_key", "request_key",
    # BPF programs, performance counters, page-fault handling in user space
    "bpf", "perf_event_open", "userfaultfd",
    # namespaces and mounts (the sandbox's own are set up before the filter is installed)
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig",
    "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
    # file handles (open_by_handle_at escapes a mount namespace: the "shocker" exploit)
    "open_by_handle_at", "name_to_handle_at",
    # kernel modules, kexec, reboot, swap, accounting, quotas
    "init_module", "finit_module", "delete_module", "create_module", "query_module",
    "get_kernel_syms", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct",
    "quotactl", "quotactl_fd",
    # clocks, the kernel log, obsolete or privileged interfaces
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "stime", "syslog", "vhangup",
    "lookup_dcookie", "nfsservctl", "sysfs", "_sysctl", "uselib", "ustat", "ioperm", "iopl",
    "vm86", "vm86old", "fanotify_init",
    # io_uring (a large attack surface; removed from Docker's default profile in 2023)
    "io_uring_setup", "io_uring_enter", "io_uring_register",
)

# clone(2) with any of these flags (new namespaces) is denied; clone3 hides its flags in memory.
CLONE_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000,
                         0x20000000, 0x40000000, 0x00000080)  # NS CGROUP UTS IPC USER PID NET TIME

# socket(2) and socketpair(2) of these address families are denied: no namespace confines them.
# AF_VSOCK reaches the hypervisor's (and other VMs') vsock services from any network namespace;
# AF_ALG is the kernel's crypto API, a source of kernel exploits. Docker's default profile
# refuses both (AF_VSOCK since moby PR 44562). The family is the call's first argument, an int:
# the kernel reads its low 32 bits, so the rule compares those only (a caller cannot slip past
# it with bits set above them).
DENY_SOCKET_FAMILIES = {"AF_ALG": 38, "AF_VSOCK": 40}

_ACT_ALLOW = 0x7FFF0000
_ACT_KILL_PROCESS = 0x80000000
_FLTATR_ACT_BADARCH = 2
_CMP_MASKED_EQ = 7
_FLTATR_CTL_OPTIMIZE = 8  # (libseccomp >= 2.5) 2: the syscall-number checks as a binary tree


def _errno_action(e: int) -> int:
    return 0x00050000 | (e & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class Program:
    """A BPF filter program ready to install (the ctypes objects are made once, here)."""

    def __init__(self, bpf: bytes, denied: tuple[str, ...]) -> None:
        self.bpf = bpf
        self.denied = denied  # the DENY names this kernel/libseccomp knows
        self._buf = ctypes.create_string_buffer(bpf, len(bpf))
        self._prog = _SockFprog(len(bpf) // 8, ctypes.cast(self._buf, ctypes.c_void_p))
        self.ref = ctypes.byref(self._prog)


def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(_ArgCmp)]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    return lib


def build() -> Program:
    """The default filter as a BPF program (raises OSError when libseccomp is missing/fails)."""
    try:
        lib = _lib()
    except OSError as e:
        raise OSError(errno.ENOENT, f"libseccomp.so.2 not found (Debian: libseccomp2): {e}") from e
    ctx = lib.seccomp_init(_ACT_ALLOW)
    if not ctx:
        raise OSError(errno.ENOMEM, "seccomp_init failed")
    try:
        _check(lib.seccomp_attr_set(ctx, _FLTATR_ACT_BADARCH, _ACT_KILL_PROCESS), "badarch")
        # A binary tree instead of a chain of ~60 comparisons: each sandbox installs (the kernel
        # checks, converts and JIT-compiles) the program, and the kernel's per-filter cache of
        # always-allowed calls emulates it once per system call number; both cost less on a
        # shallow program. Best effort: an older libseccomp makes the chain (same verdicts).
        lib.seccomp_attr_set(ctx, _FLTATR_CTL_OPTIMIZE, 2)
        eperm = _errno_action(errno.EPERM)
        denied = []
        for name in DENY:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:  # not a system call on this architecture (libseccomp: __NR_SCMP_ERROR)
                continue
            _check(lib.seccomp_rule_add_array(ctx, eperm, nr, 0, None), name)
            denied.append(name)
        clone = lib.seccomp_syscall_resolve_name(b"clone")
        for flag in CLONE_NAMESPACE_FLAGS:
            cmp = _ArgCmp(0, _CMP_MASKED_EQ, flag, flag)  # (flags & flag) == flag
            _check(lib.seccomp_rule_add_array(ctx, eperm, clone, 1, ctypes.byref(cmp)), "clone")
        for call in (b"socket", b"socketpair"):
            nr = lib.seccomp_syscall_resolve_name(call)
            for family in DENY_SOCKET_FAMILIES.values():
                cmp = _ArgCmp(0, _CMP_MASKED_EQ, 0xFFFFFFFF, family)  # (int)domain == family
                _check(lib.seccomp_rule_add_array(ctx, eperm, nr, 1, ctypes.byref(cmp)),
                       call.decode())
        clone3 = lib.seccomp_syscall_resolve_name(b"clone3")
        if clone3 >= 0:
            _check(lib.seccomp_rule_add_array(ctx, _errno_action(errno.ENOSYS), clone3, 0, None),
                   "clone3")
        fd = os.memfd_create("seccomp-bpf", os.MFD_CLOEXEC)
        try:
            _check(lib.seccomp_export_bpf(ctx, fd), "export")
            size = os.lseek(fd, 0, os.SEEK_END)
            bpf = os.pread(fd, size, 0)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)
    if not bpf or len(bpf) % 8:
        raise OSError(errno.EINVAL, "libseccomp exported an empty or malformed program")
    return Program(bpf, tuple(denied))


def build_apart() -> Program:
    """`build`, run in a short-lived child process: the program comes back through a pipe.

    For the fork server: every fork copies its mappings and every sandbox's exit tears them
    down, so it does not map libseccomp (5 mappings) nor keep what libseccomp allocated in its
    C heap. (A plain Python process that had built the filter itself made children that took
    ~90 more copy-on-write faults to run ``print(1)``; the fork server, which preloads and
    rehearses after building, showed no such difference.)"""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # (the child: build, send, exit; nothing of it stays)
        try:
            os.close(r)
            try:
                p = build()
                out = marshal.dumps((p.bpf, p.denied))
            except OSError as e:
                out = marshal.dumps((e.errno or errno.EIO, str(e)))
            while out:
                out = out[os.write(w, out):]
        finally:
            os._exit(0)
    os.close(w)
    try:
        chunks = []
        while chunk := os.read(r, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    got = marshal.loads(b"".join(chunks)) if chunks else (errno.EIO, "the builder died")
    if isinstance(got[0], int):
        raise OSError(got[0], got[1])
    return Program(got[0], tuple(got[1]))


def _check(rc: int, what: str) -> None:
    if rc < 0:
        raise OSError(-rc, f"libseccomp: {what}: {os.strerror(-rc)}")
