# ruff: noqa: F811  (the module-scoped `mgr` fixture is imported, then requested)
"""The default syscall filter (issue 16, item 2): every call it denies fails with EPERM inside a
sandbox, clone3 with ENOSYS (so that the C library falls back to clone), and calls that work
for an unprivileged process without the filter (checked here, on the host, in a child with the
sandbox uid) fail inside. Every language still runs (tests/managers/test_cpu_sandbox.py)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest
from _cpu_fixture import mgr  # noqa: F401
from _cpu_helpers import TEST_UID, action, allot

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
