# ruff: noqa: F811  (the module-scoped `mgr` fixture is imported, then requested)
"""A raw clone(2) with a namespace flag fails with EPERM inside a sandbox (issue 27, audit S2).

The filter's `clone` rule is the only thing between a sandboxed program and a new user
namespace (an unprivileged process may make one; with it, every other namespace). util-linux
`unshare` uses unshare(2), denied wholesale, so it does not test this rule: here Python calls
the clone system call itself through ctypes, with each flag alone and with CLONE_NEWUSER, and a
plain clone (no namespace flag) as the control that the call itself works."""

from __future__ import annotations

import json

import pytest
from _cpu_fixture import mgr  # noqa: F401
from _cpu_helpers import action, allot

from arl_tangram.managers.cpu import CpuManager

pytestmark = [pytest.mark.integration, pytest.mark.needs_root, pytest.mark.asyncio(loop_scope="module")]

# linux/sched.h
FLAGS = {"NEWNS": 0x00020000, "NEWCGROUP": 0x02000000, "NEWUTS": 0x04000000,
         "NEWIPC": 0x08000000, "NEWUSER": 0x10000000, "NEWPID": 0x20000000,
         "NEWNET": 0x40000000, "NEWTIME": 0x00000080}

PROBE = r'''
import ctypes, errno, json, os, platform
libc = ctypes.CDLL(None, use_errno=True)
NR_CLONE = {"x86_64": 56, "aarch64": 220, "riscv64": 220, "ppc64le": 120, "s390x": 120}[platform.machine()]
SIGCHLD = 17
FLAGS = json.loads(FLAGS_JSON)

def clone(flags):
    ctypes.set_errno(0)
    z = ctypes.c_long(0)
    r = libc.syscall(ctypes.c_long(NR_CLONE), ctypes.c_ulong(flags | SIGCHLD), z, z, z, z)
    if r == 0:  # the child: leave at once, whatever it is
        os._exit(0)
    if r > 0:
        try:
            os.waitpid(r, 0)
        except ChildProcessError:  # (SIGCHLD ignored: reaped already)
            pass
        return "child"
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))

out = {"plain": clone(0)}
for name, f in FLAGS.items():
    out[name] = clone(f)
    out[name + "+NEWUSER"] = clone(f | FLAGS["NEWUSER"])
print(json.dumps(out))
'''


async def test_raw_clone_with_each_namespace_flag_is_eperm(mgr: CpuManager) -> None:
    code = f"FLAGS_JSON = {json.dumps(json.dumps(FLAGS))}\n" + PROBE
    r = await mgr.run(action(code), allot())
    assert r.run_result is not None and r.run_result.return_code == 0, r.to_dict()
    got = json.loads(r.run_result.stdout)
    assert got.pop("plain") == "child", "the control: a clone without a namespace flag works"
    want = {name: "EPERM" for name in got}
    assert got == want, {k: v for k, v in got.items() if v != "EPERM"}
    assert {k for k in got if "+" not in k} == set(FLAGS)
