# ruff: noqa: F811  (the module-scoped `mgr` fixture is imported, then requested)
"""Hostile code against real sandboxes: each attack is contained, leaves no process and no work
directory behind, and a normal action succeeds right after it."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket

import pytest
from _cpu_fixture import OUTPUT_CAP, mgr  # noqa: F401
from _cpu_helpers import action, allot, describe_procs, no_leftovers, pod_pid, work_root_left

from arl_tangram.core.actions import ActionKind, Status
from arl_tangram.core.resources import Resources
from arl_tangram.managers.cpu import CpuManager, RunResult

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]
PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
os.environ.setdefault("TANGRAM_TEST_SECRET", "s3cret")  # a "token" of the service (collection time)


async def contained(mgr: CpuManager, r: RunResult) -> None:
    """The common aftermath check of every attack."""
    left = await no_leftovers()
    assert left == [], f"sandbox processes outlived the action: {describe_procs(left)}"
    if r.executor_pod_name:
        pid = pod_pid(r)
        for _ in range(40):
            if not os.path.exists(f"/proc/{pid}"):
                break
            await asyncio.sleep(0.05)
        assert not os.path.exists(f"/proc/{pid}"), "sandbox init still alive"
    assert work_root_left(mgr.config.work_root) == []
    assert os.listdir(os.path.join(mgr.config.work_root, "rootfs")) == []  # host never sees a mount
    ok = await mgr.run(action("print('still fine')"), allot())
    assert ok.status == "Success" and ok.run_result is not None
    assert ok.run_result.stdout == "still fine\n"


async def test_fork_bomb(mgr: CpuManager) -> None:
    code = ("import os\nn = 0\nwhile True:\n    try:\n        os.fork(); n += 1\n"
            "    except OSError:\n        pass\n")
    r = await mgr.run(action(code, run_timeout=2), allot())
    assert r.action_status is Status.TIMED_OUT
    r2 = await mgr.run(action(":(){ :|:& };:", language="bash", run_timeout=2), allot())
    assert r2.run_result is not None  # the script returns at once; its bomb dies with the sandbox
    await contained(mgr, r)
    await contained(mgr, r2)


async def test_memory_balloon(mgr: CpuManager) -> None:
    code = "a = []\nwhile True:\n    a.append(bytearray(8 << 20))\n"
    r = await mgr.run(action(code, memory_limit_MB=64, run_timeout=10), allot(memory_mb=1024))
    assert r.memory_exceeded and r.status == "Failed", r.to_dict()
    assert r.peak_memory_mb is not None and r.peak_memory_mb < 100
    await contained(mgr, r)


async def test_infinite_loop(mgr: CpuManager) -> None:
    r = await mgr.run(action("while True: pass", run_timeout=1), allot(cpu=0.5))
    assert r.run_result is not None and r.run_result.status == "TimeLimitExceeded"
    assert r.action_status is Status.TIMED_OUT
    await contained(mgr, r)


async def test_disk_filler(mgr: CpuManager) -> None:
    before = shutil.disk_usage("/tmp").free
    code = ("import os\nf = open('big', 'wb')\ntry:\n    while True:\n"
            "        f.write(b'x' * (1 << 20)); f.flush()\nexcept OSError as e:\n"
            "    print('stopped', e.strerror, os.path.getsize('big') >> 20)\n")
    r = await mgr.run(action(code, run_timeout=10), allot(memory_mb=512))
    assert r.run_result is not None and "stopped" in r.run_result.stdout, r.to_dict()
    assert int(r.run_result.stdout.split()[-1]) <= mgr.config.workdir_max_mb
    assert shutil.disk_usage("/tmp").free > before - (64 << 20)
    await contained(mgr, r)


async def test_giant_stdout(mgr: CpuManager) -> None:
    code = "import sys\nwhile True:\n    sys.stdout.write('y' * 65536)\n"
    r = await mgr.run(action(code, run_timeout=1), allot())
    assert r.output_truncated and r.run_result is not None
    assert len(r.run_result.stdout) <= OUTPUT_CAP
    await contained(mgr, r)


async def test_network_is_unreachable(mgr: CpuManager) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.setblocking(False)
    port = srv.getsockname()[1]
    code = ("import socket\nfor host in ('127.0.0.1', '8.8.8.8', '1.1.1.1'):\n"
            "    try:\n        s = socket.create_connection((host, PORT if host == '127.0.0.1' else 53),"
            " timeout=1)\n        print('CONNECTED', host)\n    except OSError as e:\n"
            "        print('blocked', host, e.errno)\n"
            "print(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]))")
    r = await mgr.run(action(code.replace("PORT", str(port)), run_timeout=10), allot())
    try:
        with pytest.raises(BlockingIOError):
            srv.accept()
    finally:
        srv.close()
    assert r.run_result is not None and "CONNECTED" not in r.run_result.stdout
    assert r.run_result.stdout.count("blocked") == 3 and "['lo']" in r.run_result.stdout
    await contained(mgr, r)


async def test_host_files_are_not_readable(mgr: CpuManager) -> None:
    src = os.path.join(PROJECT, "src", "arl_tangram", "__init__.py")
    code = (f"import os\nfor p in ('/etc/shadow', '/root/.bashrc', {src!r}, {PROJECT + '/pyproject.toml'!r}):\n"
            "    try:\n        print(p, 'READ', len(open(p).read()))\n    except OSError as e:\n"
            "        print(p, 'denied', e.errno)\n"
            "print('root:', sorted(os.listdir('/root')) if os.path.isdir('/root') else None)\n"
            f"print('project:', os.path.exists({PROJECT + '/src'!r}))\n")
    r = await mgr.run(action(code), allot())
    out = r.run_result.stdout if r.run_result else ""
    for line in out.splitlines():
        if "READ" in line:
            assert line.startswith("/etc/shadow") and line.endswith(" 0"), out  # masked: empty
    assert ".bashrc" not in out.split("root:")[1] and "project: False" in out
    await contained(mgr, r)


async def test_cannot_write_outside_workdir(mgr: CpuManager) -> None:
    targets = ["/etc/tangram-pwn", "/usr/tangram-pwn", "/tangram-pwn", "/root/tangram-pwn",
               f"{PROJECT}/tangram-pwn", "/proc/sys/kernel/hostname", "/dev/tangram-pwn"]
    code = (f"for p in {targets!r}:\n    try:\n        open(p, 'w').write('x'); print('WROTE', p)\n"
            "    except OSError as e:\n        print('denied', p)\n")
    r = await mgr.run(action(code), allot())
    assert r.run_result is not None and "WROTE" not in r.run_result.stdout, r.run_result.stdout
    for p in targets[:5]:
        assert not os.path.exists(p)
    await contained(mgr, r)


async def test_kill_everything(mgr: CpuManager) -> None:
    bystander = asyncio.create_task(mgr.run(action("import time; time.sleep(1.5); print('alive')"),
                                            allot()))
    await asyncio.sleep(0.3)
    r = await mgr.run(action("import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('after')"),
                      allot())
    assert r.run_result is not None
    b = await bystander
    assert b.status == "Success" and b.run_result is not None and b.run_result.stdout == "alive\n"
    await contained(mgr, r)


async def test_daemon_does_not_outlive_its_action(mgr: CpuManager) -> None:
    code = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        os.close(1); os.close(2)\n        time.sleep(60)\n    os._exit(0)\n"
            "print('parent done')\n")
    r = await mgr.run(action(code), allot())
    assert r.status == "Success", r.to_dict()
    bash = await mgr.run(action("nohup sleep 60 >/dev/null 2>&1 &\necho started", language="bash"),
                         allot())
    assert bash.status == "Success"
    await contained(mgr, r)


async def test_privilege_tricks(mgr: CpuManager) -> None:
    code = ("import os, subprocess\n"
            "try:\n    os.setuid(0); print('SETUID OK')\nexcept OSError:\n    print('setuid denied')\n"
            "st = open('/proc/self/status').read()\n"
            "print([l for l in st.splitlines() if l.startswith(('CapEff', 'NoNewPrivs'))])\n"
            "for cmd in (['sudo', 'id'], ['su', '-c', 'id'], ['mount', '-t', 'tmpfs', 'x', '/tmp']):\n"
            "    try:\n        p = subprocess.run(cmd, capture_output=True, text=True, timeout=5)\n"
            "        print(cmd[0], p.returncode, 'uid=0' in p.stdout)\n"
            "    except OSError as e:\n        print(cmd[0], 'missing')\n")
    r = await mgr.run(action(code), allot())
    out = r.run_result.stdout if r.run_result else ""
    assert "setuid denied" in out and "SETUID OK" not in out, out
    assert "CapEff:\\t0000000000000000" in out and "NoNewPrivs:\\t1" in out, out
    assert "True" not in out, out
    await contained(mgr, r)


async def test_session_leaking_memory(mgr: CpuManager) -> None:
    await mgr.open_session("leak", Resources(cpu=1, memory_mb=96), ttl_s=60)
    results = []
    for _ in range(6):
        results.append(await mgr.run(action("hog = globals().setdefault('hog', [])\n"
                                            "hog.append(bytearray(30 << 20))\nprint(len(hog))",
                                            kind=ActionKind.TOOL, session="leak"), allot()))
        if results[-1].status != "Success":
            break
    assert results[0].status == "Success"
    assert results[-1].status != "Success" and results[-1].memory_exceeded, results[-1].to_dict()
    await mgr.close_session("leak")
    await contained(mgr, results[-1])


async def test_reused_network_namespace_keeps_nothing(mgr: CpuManager) -> None:
    """Network namespaces are lent to one sandbox at a time and reused: whatever an action
    leaves in one (an abstract unix socket, a sysctl change, a raised loopback) must be gone or
    impossible by the time another action gets the same namespace."""
    plant = ("import os, socket, ctypes\n"
             "print('NS', os.readlink('/proc/self/ns/net'))\n"
             "s = socket.socket(socket.AF_UNIX); s.bind('\\0tangram-left'); s.listen()\n"
             "u = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); u.bind('\\0tangram-dgram')\n"
             "for p in ('/proc/sys/net/core/somaxconn', '/proc/sys/net/ipv4/ip_forward'):\n"
             "    try:\n        open(p, 'w').write('1'); print('WROTE', p)\n"
             "    except OSError:\n        print('denied', p)\n"
             "libc = ctypes.CDLL('libc.so.6', use_errno=True)\n"
             "print('userns', libc.unshare(0x10000000))\n"  # CLONE_NEWUSER: no power over our netns
             "try:\n    open('/proc/sys/net/core/somaxconn', 'w').write('7'); print('WROTE userns')\n"
             "except OSError:\n    print('denied userns')\n"
             "import fcntl, struct\n"
             "try:\n    fcntl.ioctl(socket.socket(), 0x8914, struct.pack('16sH', b'lo', 1)); print('LO UP')\n"
             "except OSError:\n    print('lo stays down')\n")
    r = await mgr.run(action(plant), allot())
    out = r.run_result.stdout if r.run_result else ""
    assert "WROTE" not in out and "LO UP" not in out and out.count("denied") == 3, r.to_dict()
    ns = out.split("NS ", 1)[1].split()[0]
    probe = ("import os, socket\nprint('NS', os.readlink('/proc/self/ns/net'))\n"
             "print('unix:', [l.split()[-1] for l in open('/proc/net/unix').read().splitlines()[1:]])\n"
             "for name in ('\\0tangram-left', '\\0tangram-dgram'):\n"
             "    try:\n        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM if 'left' in name"
             " else socket.SOCK_DGRAM); c.connect(name); print('REACHED', name)\n"
             "    except OSError as e:\n        print('gone', e.errno)\n"
             "print(open('/proc/sys/net/core/somaxconn').read().strip())\n")
    with open("/proc/sys/net/core/somaxconn") as f:
        base = f.read().strip()  # a fresh netns' default here
    for _ in range(60):  # FIFO reuse: within (namespaces made) actions we get it back
        r2 = await mgr.run(action(probe), allot())
        out2 = r2.run_result.stdout if r2.run_result else ""
        if f"NS {ns}" in out2:
            break
    else:
        pytest.fail(f"network namespace {ns} was never reused")
    assert "REACHED" not in out2 and out2.count("gone") == 2, out2
    assert "tangram" not in out2.split("unix:", 1)[1].split("\n", 1)[0], out2
    assert out2.strip().splitlines()[-1] in (base, "4096"), out2
    await contained(mgr, r2)


async def test_service_environment_is_not_visible(mgr: CpuManager) -> None:
    """Python actions are forks of the fork server: the environment its interpreter was started
    with stays in their memory (top of the stack), whatever os.environ says. It must hold
    nothing of the service's environment (tokens, configuration)."""
    assert os.environ.get("TANGRAM_TEST_SECRET") == "s3cret"  # set before the manager started
    code = ("import os, ctypes\nprint(sorted(os.environ))\n"
            "libc = ctypes.CDLL('libc.so.6'); libc.getauxval.restype = ctypes.c_ulong\n"
            "top = libc.getauxval(31)\n"  # AT_EXECFN: just above the exec's environment strings
            "print(ctypes.string_at(top - 16384, 16384).count(b's3cret'))\n")
    r = await mgr.run(action(code), allot())
    out = r.run_result.stdout.splitlines() if r.run_result else []
    assert out[1:] == ["0"], r.to_dict()
    assert "TANGRAM_TEST_SECRET" not in out[0] and "HOME" in out[0]
    await contained(mgr, r)
