# ruff: noqa: F811  (the module-scoped `mgr` fixture is imported, then requested)
"""The default syscall filter (issue 16, item 2): every call it denies fails with EPERM inside a
sandbox, clone3 with ENOSYS (so that the C library falls back to clone), and calls that work
for an unprivileged process without the filter (checked here, on the host, in a child with the
sandbox uid) fail inside. Every language still runs (tests/managers/cpu/test_cpu_sandbox.py)."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import json
import os
import struct
import subprocess
import sys

import pytest
from _cpu_fixture import mgr  # noqa: F401
from _cpu_helpers import TEST_UID, action, allot

from arl_tangram.core.actions import ActionKind
from arl_tangram.managers.cpu import CpuManager
from arl_tangram.managers.cpu.zygote import seccomp

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


def _numbers(names: tuple[str, ...]) -> dict[str, int]:
    lib = seccomp._lib()
    out = {}
    for n in names:
        nr = lib.seccomp_syscall_resolve_name(n.encode())
        if nr >= 0:
            out[n] = nr
    return out


# Calls an unprivileged process can make with success (or an errno other than EPERM) when no
# filter is in the way: each one proves the filter, not the missing privilege, said no.
LIVE = r'''
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
NR = json.loads(NRS)
def call(name, *args):
    ctypes.set_errno(0)
    rc = libc.syscall(NR[name], *args)
    return [rc, ctypes.get_errno() if rc == -1 else 0]
out = {}
out["ptrace"] = call("ptrace", 0, 0, 0, 0)                            # PTRACE_TRACEME
out["unshare"] = call("unshare", 0x10000000)                          # CLONE_NEWUSER
out["keyctl"] = call("keyctl", 0, ctypes.c_long(-2), 1)               # process keyring id
buf, dst = ctypes.create_string_buffer(b"x" * 8), ctypes.create_string_buffer(8)
class Iov(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
local, remote = Iov(ctypes.addressof(dst), 8), Iov(ctypes.addressof(buf), 8)
out["process_vm_readv"] = call("process_vm_readv", os.getpid(), ctypes.byref(local), 1,
                               ctypes.byref(remote), 1, 0)
out["kcmp"] = call("kcmp", os.getpid(), os.getpid(), 0, 0, 0)        # KCMP_FILE: fd 0 vs 0
handle = ctypes.create_string_buffer(64)                               # handle_bytes = 0
mount_id = ctypes.c_int()
out["name_to_handle_at"] = call("name_to_handle_at", -100, b"/", handle, ctypes.byref(mount_id), 0)
out["userfaultfd"] = call("userfaultfd", 1)                           # UFFD_USER_MODE_ONLY
params = ctypes.create_string_buffer(120)
out["io_uring_setup"] = call("io_uring_setup", 1, params)
out["clone3"] = call("clone3", 0, 0)
print(json.dumps(out))
'''


def _live_code() -> str:
    names = ("ptrace", "unshare", "keyctl", "process_vm_readv", "kcmp", "name_to_handle_at",
             "userfaultfd", "io_uring_setup", "clone3")
    return f"NRS = {json.dumps(json.dumps(_numbers(names)))}\n" + LIVE


async def test_calls_that_work_unfiltered_fail_with_eperm_inside(mgr: CpuManager) -> None:
    code = _live_code()
    # the control: the same program, unprivileged (the sandbox uid), no filter, on the host
    # (a system python: the sandbox uid may not read the service's installation)
    py = next(p for p in ("/usr/bin/python3", sys.executable) if os.access(p, os.X_OK))
    ctl = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=60,
                         user=TEST_UID, group=TEST_UID, cwd="/")
    assert ctl.returncode == 0, ctl.stderr
    outside = json.loads(ctl.stdout)
    r = await mgr.run(action(code), allot())
    assert r.run_result is not None and r.run_result.return_code == 0, r.to_dict()
    inside = json.loads(r.run_result.stdout)
    assert inside.pop("clone3") == [-1, errno.ENOSYS], inside
    outside.pop("clone3")
    assert all(v == [-1, errno.EPERM] for v in inside.values()), inside
    proven = [k for k, v in outside.items() if v != [-1, errno.EPERM]]
    # on this kind of machine at least ptrace, keyctl, process_vm_readv, kcmp and
    # name_to_handle_at work unfiltered: the filter, not a missing privilege, denies them
    assert len(proven) >= 4, (outside, inside)


async def test_every_denied_call_fails_with_eperm(mgr: CpuManager) -> None:
    nrs = _numbers(seccomp.DENY)
    assert {"ptrace", "keyctl", "add_key", "request_key", "bpf", "perf_event_open",
            "userfaultfd", "unshare", "setns", "mount", "umount2", "pivot_root", "kexec_load",
            "init_module", "finit_module", "delete_module", "open_by_handle_at",
            "process_vm_readv", "process_vm_writev", "reboot", "swapon", "swapoff", "acct",
            "quotactl"} <= set(nrs)
    code = (f"import ctypes, json\nNR = {nrs!r}\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "bad = {}\nfor n, nr in NR.items():\n    ctypes.set_errno(0)\n"
            "    rc = libc.syscall(nr, 0, 0, 0, 0, 0, 0)\n    e = ctypes.get_errno()\n"
            "    if (rc, e) != (-1, 1):\n        bad[n] = (rc, e)\n"
            "st = open('/proc/self/status').read()\n"
            "print(json.dumps({'bad': bad, 'mode': [l for l in st.splitlines() "
            "if l.startswith('Seccomp')]}))\n")
    for extra in ({}, {"fetch_files": ["none"]}):  # direct (PID 1) and a child of the init
        r = await mgr.run(action(code, **extra), allot())
        assert r.run_result is not None and r.run_result.return_code == 0, r.to_dict()
        got = json.loads(r.run_result.stdout)
        assert got["bad"] == {}, got
        assert "Seccomp:\t2" in got["mode"], got


async def test_namespaces_cannot_be_made_by_programs(mgr: CpuManager) -> None:
    """clone/unshare with a namespace flag from a program (util-linux `unshare`), and Python's
    own fork still works."""
    code = ("import os, subprocess\n"
            "p = subprocess.run(['unshare', '-U', 'true'], capture_output=True, text=True)\n"
            "print(p.returncode != 0, 'Operation not permitted' in p.stderr)\n"
            "pid = os.fork()\nif pid == 0:\n    os._exit(7)\n"
            "print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n")
    r = await mgr.run(action(code), allot())
    assert r.run_result is not None and r.run_result.stdout == "True True\n7\n", r.to_dict()


async def test_filter_program_is_built_from_libseccomp() -> None:
    prog = seccomp.build()
    assert len(prog.bpf) % 8 == 0 and len(prog.bpf) > 8 * len(prog.denied)
    assert set(prog.denied) <= set(seccomp.DENY) and "ptrace" in prog.denied


# --- the address families no namespace confines (issue 35, M6) ---------------------------------

AF_UNIX, AF_INET, AF_NETLINK, AF_ALG, AF_VSOCK = 1, 2, 16, 38, 40
SOCK_STREAM, SOCK_DGRAM, SOCK_RAW, SOCK_SEQPACKET = 1, 2, 3, 5

# Each socket(2)/socketpair(2) call through the raw system call (the family as a full 64-bit
# register: "vsock_high" sets a bit above the int the kernel reads, so a rule that compared all
# 64 bits would let it through); "ok" or the errno.
SOCKETS = r'''
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
NR = json.loads(NRS)
CASES = json.loads(CASES_JSON)
out = {}
for name, (call, family, kind) in CASES.items():
    ctypes.set_errno(0)
    if call == "socket":
        rc = libc.syscall(ctypes.c_long(NR["socket"]), ctypes.c_long(family), ctypes.c_long(kind),
                          ctypes.c_long(0))
        fds = [rc]
    else:
        sv = (ctypes.c_int * 2)(-1, -1)
        rc = libc.syscall(ctypes.c_long(NR["socketpair"]), ctypes.c_long(family),
                          ctypes.c_long(kind), ctypes.c_long(0), sv)
        fds = list(sv)
    if rc < 0:
        out[name] = ctypes.get_errno()
    else:
        out[name] = "ok"
        for fd in fds:
            os.close(fd)
print(json.dumps(out))
'''
SOCKET_CASES = {
    "vsock": ("socket", AF_VSOCK, SOCK_STREAM),
    "alg": ("socket", AF_ALG, SOCK_SEQPACKET),
    "vsock_high": ("socket", AF_VSOCK | 1 << 32, SOCK_STREAM),
    "vsock_pair": ("socketpair", AF_VSOCK, SOCK_STREAM),
    "alg_pair": ("socketpair", AF_ALG, SOCK_SEQPACKET),
    "inet": ("socket", AF_INET, SOCK_STREAM),
    "inet_dgram": ("socket", AF_INET, SOCK_DGRAM),
    "unix": ("socket", AF_UNIX, SOCK_STREAM),
    "unix_pair": ("socketpair", AF_UNIX, SOCK_STREAM),
    "netlink": ("socket", AF_NETLINK, SOCK_RAW),
}
SOCKETS_INSIDE = {"vsock": errno.EPERM, "alg": errno.EPERM, "vsock_high": errno.EPERM,
                  "vsock_pair": errno.EPERM, "alg_pair": errno.EPERM, "inet": "ok",
                  "inet_dgram": "ok", "unix": "ok", "unix_pair": "ok", "netlink": "ok"}


def sockets_code() -> str:
    return (f"NRS = {json.dumps(json.dumps(_numbers(('socket', 'socketpair'))))}\n"
            f"CASES_JSON = {json.dumps(json.dumps(SOCKET_CASES))}\n" + SOCKETS)


async def test_unconfined_socket_families_are_eperm_inside(mgr: CpuManager) -> None:
    code = sockets_code()
    # the control: the same calls on the host as the sandbox uid, no filter. Where the machine
    # has vsock (this VM: /dev/vsock), the socket is made there: the filter, not a missing
    # family, says no inside.
    py = next(p for p in ("/usr/bin/python3", sys.executable) if os.access(p, os.X_OK))
    ctl = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=60,
                         user=TEST_UID, group=TEST_UID, cwd="/")
    assert ctl.returncode == 0, ctl.stderr
    outside = json.loads(ctl.stdout)
    if os.path.exists("/dev/vsock"):
        assert outside["vsock"] == "ok" and outside["vsock_high"] == "ok", outside
    for extra in ({}, {"fetch_files": ["none"]}):  # direct (PID 1) and a child of the init
        r = await mgr.run(action(code, **extra), allot())
        assert r.run_result is not None and r.run_result.return_code == 0, r.to_dict()
        assert json.loads(r.run_result.stdout) == SOCKETS_INSIDE, (extra, r.to_dict())
    # a session's persistent interpreter (a worker forked by the init)
    await mgr.open_session("m6", allot(), ttl_s=60)
    try:
        r = await mgr.run(action(code, kind=ActionKind.TOOL, session="m6"), allot())
        assert r.run_result is not None, r.to_dict()
        assert json.loads(r.run_result.stdout.strip().splitlines()[-1]) == SOCKETS_INSIDE, \
            r.to_dict()
    finally:
        await mgr.close_session("m6")


# The same code through another architecture's entry: i386 `int 0x80` (getpid is 20 there) and
# x32 (`syscall` with bit 30 of the number set: getpid 39). Each runs in a forked child; the
# parent reports how the child ended. The filter's action for a foreign architecture is
# KILL_PROCESS: the child dies of SIGSYS (on the host, i386 getpid returns the pid: this kernel
# runs i386 code, so the filter is what stops it).
FOREIGN_ARCH = r'''
import ctypes, json, mmap, os
CODES = {"i386": bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3]),
         "x32": bytes([0xb8, 39, 0, 0, 0x40, 0x0f, 0x05, 0xc3])}
out = {}
for name, code in CODES.items():
    pid = os.fork()
    if pid == 0:
        m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        m.write(code)
        f = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
        f()
        os._exit(0)
    st = os.waitpid(pid, 0)[1]
    out[name] = ["signal", os.WTERMSIG(st)] if os.WIFSIGNALED(st) else ["exit", os.WEXITSTATUS(st)]
print(json.dumps(out))
'''


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="i386/x32 entries exist on x86_64 only")
async def test_foreign_architecture_calls_kill_the_process(mgr: CpuManager) -> None:
    py = next(p for p in ("/usr/bin/python3", sys.executable) if os.access(p, os.X_OK))
    ctl = subprocess.run([py, "-c", FOREIGN_ARCH], capture_output=True, text=True, timeout=60,
                         user=TEST_UID, group=TEST_UID, cwd="/")
    assert ctl.returncode == 0, ctl.stderr
    assert json.loads(ctl.stdout)["i386"] == ["exit", 0], ctl.stdout  # unfiltered: it runs
    for extra in ({}, {"fetch_files": ["none"]}):
        r = await mgr.run(action(FOREIGN_ARCH, **extra), allot())
        assert r.run_result is not None and r.run_result.return_code == 0, r.to_dict()
        assert json.loads(r.run_result.stdout) == {"i386": ["signal", 31], "x32": ["signal", 31]}


# The filter read back: a classic-BPF interpreter runs the very program the fork server
# exports (`seccomp.build`: `build_apart` sends the same bytes) on a system call's
# `struct seccomp_data` and gives its verdict, so each rule is checked as the kernel reads it.
AUDIT_ARCH_X86_64, AUDIT_ARCH_I386 = 0xC000003E, 0x40000003
RET_ALLOW, RET_KILL_PROCESS = 0x7FFF0000, 0x80000000


def _ret_errno(e: int) -> int:
    return 0x00050000 | e


def verdict(bpf: bytes, nr: int, args: tuple[int, ...] = (), arch: int = AUDIT_ARCH_X86_64) -> int:
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * 6)[:6])
    insns = [struct.unpack_from("<HBBI", bpf, i) for i in range(0, len(bpf), 8)]
    a, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            a = struct.unpack_from("<I", data, k)[0]
        elif code == 0x54:  # BPF_ALU | BPF_AND | BPF_K
            a &= k
        elif code == 0x05:  # BPF_JMP | BPF_JA
            pc += k
        elif code in (0x15, 0x25, 0x35, 0x45):  # JEQ, JGT, JGE, JSET (K)
            hit = {0x15: a == k, 0x25: a > k, 0x35: a >= k, 0x45: bool(a & k)}[code]
            pc += jt if hit else jf
        elif code == 0x06:  # BPF_RET | BPF_K
            return k
        elif code == 0x16:  # BPF_RET | BPF_A
            return a
        else:
            raise AssertionError(f"opcode {code:#x} at {pc - 1}: not in the interpreter")


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the numbers below are x86_64's")
async def test_filter_read_back_gives_each_rule_its_verdict() -> None:
    bpf = seccomp.build().bpf
    nr = _numbers(("socket", "socketpair", "clone", "clone3", "getpid", "ptrace", "read",
                   "io_uring_setup"))
    eperm = _ret_errno(errno.EPERM)
    for call in ("socket", "socketpair"):
        for family in (AF_VSOCK, AF_ALG, AF_VSOCK | 1 << 32, AF_ALG | 0xFFFF_FFFF_0000_0000):
            assert verdict(bpf, nr[call], (family, SOCK_STREAM, 0)) == eperm, (call, family)
        for family in (AF_UNIX, AF_INET, 10, AF_NETLINK, 17, 39, 41, AF_VSOCK << 8):
            assert verdict(bpf, nr[call], (family, SOCK_STREAM, 0)) == RET_ALLOW, (call, family)
    for name, n in _numbers(seccomp.DENY).items():
        assert verdict(bpf, n) == eperm, name
    assert verdict(bpf, nr["clone"], (0x10000000 | 17,)) == eperm  # CLONE_NEWUSER
    assert verdict(bpf, nr["clone"], (17,)) == RET_ALLOW
    assert verdict(bpf, nr["clone3"]) == _ret_errno(errno.ENOSYS)
    for n in (nr["getpid"], nr["read"]):
        assert verdict(bpf, n) == RET_ALLOW
    # another architecture's entry, whatever the call: the process is killed
    for n in (20, 0, 26, 102):  # i386 getpid, restart_syscall, ptrace, socketcall
        assert verdict(bpf, n, arch=AUDIT_ARCH_I386) == RET_KILL_PROCESS, n
    for n in (nr["getpid"], nr["socket"], nr["ptrace"], 512, 545):  # x32: bit 30 set
        assert verdict(bpf, n | 0x40000000) == RET_KILL_PROCESS, n


_PTRACE_SEIZE, _PTRACE_INTERRUPT, _PTRACE_DETACH = 0x4206, 0x4207, 17
_PTRACE_SECCOMP_GET_FILTER = 0x420C


def installed_filter(pid: int) -> bytes:
    """The seccomp program the kernel holds for ``pid`` (its first and only filter), read with
    PTRACE_SECCOMP_GET_FILTER (root: CAP_SYS_ADMIN): seize, stop, read, detach."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.restype = ctypes.c_long
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]

    def pt(req: int, addr: int | None = None, data: object = None) -> int:
        rc = libc.ptrace(req, pid, addr, data)
        if rc < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"ptrace({req:#x}): {os.strerror(e)}")
        return int(rc)

    pt(_PTRACE_SEIZE)
    try:
        pt(_PTRACE_INTERRUPT)
        os.waitpid(pid, 0x40000000)  # __WALL: the group-stop of the interrupt
        n = pt(_PTRACE_SECCOMP_GET_FILTER, 0, None)
        buf = ctypes.create_string_buffer(8 * n)
        assert pt(_PTRACE_SECCOMP_GET_FILTER, 0, buf) == n
        with pytest.raises(OSError):  # (one filter: there is no second)
            pt(_PTRACE_SECCOMP_GET_FILTER, 1, None)
        return buf.raw
    finally:
        libc.ptrace(_PTRACE_DETACH, pid, None, None)


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the numbers are x86_64's")
async def test_the_filter_in_force_is_the_one_read_back(mgr: CpuManager) -> None:
    """The program the kernel holds for a running action (on the direct path its sandbox's
    PID 1, else the init's child) is byte for byte the exported program that
    `test_filter_read_back_gives_each_rule_its_verdict` interprets."""
    want = seccomp.build().bpf
    code = "import time\ntime.sleep(30)\n"
    for extra in ({}, {"fetch_files": ["none"]}):
        a = action(code, **extra)
        task = asyncio.ensure_future(mgr.run(a, allot()))
        try:
            pid = None
            for _ in range(400):
                sb = mgr._running.get(a.id)
                if sb is not None:
                    kids = _children(sb.pid)
                    pid = kids[0] if extra and kids else sb.pid if not extra else None
                    if pid is not None and _seccomp_mode(pid) == 2:
                        break
                await asyncio.sleep(0.025)
            assert pid is not None and _seccomp_mode(pid) == 2, (extra, pid)
            got = installed_filter(pid)
            assert got == want, extra
            # and what the kernel holds says no to the unconfined families, kills i386 entries
            nr = _numbers(("socket", "socketpair"))
            for call in ("socket", "socketpair"):
                for family in (AF_VSOCK, AF_ALG):
                    assert verdict(got, nr[call], (family, SOCK_STREAM, 0)) \
                        == _ret_errno(errno.EPERM), (extra, call, family)
                assert verdict(got, nr[call], (AF_UNIX, SOCK_STREAM, 0)) == RET_ALLOW
            assert verdict(got, 20, arch=AUDIT_ARCH_I386) == RET_KILL_PROCESS
        finally:
            await mgr.cancel(a.id)
            await task


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _seccomp_mode(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Seccomp:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1
