"""Start-up check of the sandbox's isolation: what is really in force, measured from inside.

Invariant: every feature the report calls True was observed by code running in a real sandbox
(or, for cgroups, by the manager on the sandbox's slot); a feature that could not be observed is
False with nothing assumed, and `missing` lists the ones a full-isolation start requires.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..config import CpuManagerConfig
from .cgroups import CgroupTree
from .pool import WarmPool

SYSTEM_RO_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc")

REQUIRED = ("root", "fork_server", "pid_namespace", "mount_namespace", "network_namespace",
            "ipc_namespace", "uts_namespace", "readonly_system", "private_workdir",
            "unprivileged_user", "no_new_privs", "rlimits", "cgroup_memory", "cgroup_pids",
            "cgroup_cpu", "host_paths_hidden", "syscall_filter")

_PROBE = r"""
import json, os, resource, socket
r = {}
r["pid1"] = os.getppid() == 1
r["uid"] = os.getuid()
r["hostname"] = socket.gethostname()
st = open("/proc/self/status").read()
r["nnp"] = "NoNewPrivs:\t1" in st
r["core0"] = resource.getrlimit(resource.RLIMIT_CORE) == (0, 0)
r["ifaces"] = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:])
try:
    s = socket.socket(); s.settimeout(0.5); s.connect(("127.0.0.1", 1)); r["lo_up"] = True
except OSError as e:
    r["lo_up"] = e.errno not in (101, 99)
try:
    open("/usr/tangram-probe", "w"); r["ro"] = False
except OSError:
    r["ro"] = True
r["cwd"] = os.getcwd()
import ctypes
_libc = ctypes.CDLL(None, use_errno=True)  # keyctl(KEYCTL_GET_KEYRING_ID, session, 0): denied
_nr = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine, 250)
r["filter"] = _libc.syscall(_nr, 0, -3, 0) == -1 and ctypes.get_errno() == 1
open("probe.txt", "w").write("x")
r["hidden"] = [p for p in PATHS if os.path.exists(p)]
print(json.dumps(r))
"""


async def probe(pool: WarmPool, hello: dict[str, Any], cgroups: CgroupTree,
                cfg: CpuManagerConfig) -> dict[str, Any]:
    """Run a probe program in a fresh sandbox; returns what it saw (or an 'error')."""
    here = os.path.abspath(__file__)  # .../arl_tangram/managers/cpu/host/isolation.py
    pkg = here.rsplit(os.sep, 4)[0]  # the package's directory: .../arl_tangram
    hidden = [p for p in ("/root/.bashrc", "/home", pkg, cfg.work_root) if os.path.exists(p)]
    code = f"PATHS = {hidden!r}\n" + _PROBE
    req = {"op": "run", "lang": {"name": "python", "file": "main.py", "compile": None,
                                 "run": None, "inproc": True},
           "code": code, "stdin": "", "files": {}, "fetch_files": [], "compile_timeout": 10,
           "run_timeout": 10, "env": {"PATH": "/usr/bin:/bin"}, "cases": None,
           "limits": {"uid": cfg.sandbox_uid, "gid": cfg.sandbox_gid, "cpu_s": 10,
                      "fsize": 1 << 20, "nofile": 64, "output": 1 << 16, "cpus": 1.0}}
    limits: dict[str, Any] = req["limits"]  # type: ignore[assignment]
    try:
        sb = await pool.spawn()
    except Exception as e:
        return {"error": f"cannot spawn a sandbox: {e}"}
    uid = getattr(sb, "uid", -1)
    if cfg.sandbox_id_count and uid >= 0:  # its own host ids (`host/ids.py`)
        limits["uid"] = limits["gid"] = uid
    try:
        reply = await sb.request(req)
        out = (reply.get("run_result") or {}).get("stdout", "")
        seen: dict[str, Any] = json.loads(out) if out.strip() else {"error": str(reply)}
        seen["cgroup"] = sb.slot is not None
    except Exception as e:
        seen = {"error": f"probe failed: {type(e).__name__}: {e}"}
    finally:
        pool.release(sb)
    return seen


def report(hello: dict[str, Any], seen: dict[str, Any] | None, cgroups: CgroupTree,
           cfg: CpuManagerConfig) -> dict[str, bool | str]:
    s = seen or {}
    ok = "error" not in s and bool(s)
    cg = cgroups.version is not None and bool(s.get("cgroup"))
    r: dict[str, bool | str] = {
        "root": os.geteuid() == 0,
        "fork_server": bool(hello.get("ok")),
        "pid_namespace": ok and bool(s.get("pid1")),
        "mount_namespace": ok and bool(s.get("ro")),
        "network_namespace": ok and s.get("ifaces") == ["lo"] and not s.get("lo_up"),
        "ipc_namespace": ok and bool(s.get("pid1")),  # entered with the same unshare call
        "uts_namespace": ok and s.get("hostname") == cfg.hostname,
        "readonly_system": ok and bool(s.get("ro")),
        "private_workdir": ok and s.get("cwd") == "/workdir",
        "unprivileged_user": ok and s.get("uid") == _expected_uid(s, cfg),
        "no_new_privs": ok and bool(s.get("nnp")),
        "rlimits": ok and bool(s.get("core0")),
        "cgroup_version": cgroups.version or "none",
        "cgroup_memory": cg,
        "cgroup_pids": cg,
        "cgroup_cpu": cg,
        "host_paths_hidden": ok and not s.get("hidden"),
        "syscall_filter": ok and bool(hello.get("filter")) and bool(s.get("filter")),
    }
    problems = [str(x) for x in (hello.get("error"), s.get("error"), cgroups.problem,
                                 hello.get("filter_error")) if x]
    if not cfg.syscall_filter:
        problems.append("the syscall filter is off (syscall_filter=False)")
    if s.get("hidden"):
        problems.append(f"host paths visible in the sandbox: {s['hidden']}")
    if problems:
        r["problems"] = "; ".join(problems)
    return r


def _expected_uid(s: dict[str, Any], cfg: CpuManagerConfig) -> int | None:
    """The uid the probe's code had to run as: one of the node's sandbox ids (its sandbox's
    own, `host/ids.py`; never root), else the shared `sandbox_uid`."""
    if not cfg.sandbox_id_count:
        return cfg.sandbox_uid
    uid = s.get("uid")
    b = cfg.sandbox_id_base
    return uid if isinstance(uid, int) and b <= uid < b + cfg.sandbox_id_count else None


def missing(rep: dict[str, bool | str]) -> list[str]:
    return [k for k in REQUIRED if rep.get(k) is not True]
