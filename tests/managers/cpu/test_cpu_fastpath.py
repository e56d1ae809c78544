"""The compiled set-up path (`managers/cpu/zygote/_fastpath.c`) and the compact direct request: same
results, same isolation as the Python path they replace."""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from _cpu_helpers import TEST_UID, action, allot

from arl_tangram.core.errors import IsolationUnavailable
from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig, wire

pytestmark = pytest.mark.integration

BASE = {"PATH": "/bin", "HOME": "/workdir"}


def _req(**kw: object) -> dict:
    req = {"op": "run", "lang": {"name": "python", "file": "main.py", "inproc": True,
                                 "compile": None, "run": None},
           "code": "print(1)", "stdin": "", "files": {}, "fetch_files": [], "env": dict(BASE),
           "cases": None, "limits": {"uid": 61000, "gid": 61000, "cpu_s": 11, "fsize": 1 << 20,
                                     "nofile": 64, "output": 1 << 16, "cpus": 1.0}}
    req.update(kw)
    return req


def test_compact_frame_only_where_it_carries_everything() -> None:
    frame = wire.encode_direct(_req(code="print('é')", stdin="x\n"), BASE)
    assert frame is not None
    body = frame[4:]
    assert int.from_bytes(frame[:4], "big") == len(body)
    assert body.startswith(wire.DIRECT_MAGIC)
    head = wire.DIRECT.unpack_from(body)
    assert head[1:8] == (61000, 61000, 11, 1 << 20, 64, 1.0, 0)  # 0: the tmpfs as mounted
    n_name, n_code, n_in = head[8:]
    rest = body[wire.DIRECT.size:]
    assert rest == b"main.py" + "print('é')".encode() + b"x\n"
    assert (n_name, n_code, n_in) == (7, len("print('é')".encode()), 2)
    # a small memory limit's smaller tmpfs goes in the compact form too (it was the general
    # form's, at +0.7 ms of CPU and +130 page faults per action: issue 42)
    small = wire.encode_direct(_req(tmpfs_mb=64), BASE)
    assert small is not None and wire.DIRECT.unpack_from(small[4:])[7] == 64
    # the general form wherever the compact one would lose something
    assert wire.encode_direct(_req(files={"a.txt": "eA=="}), BASE) is None
    assert wire.encode_direct(_req(env={"PATH": "/usr/bin"}), BASE) is None
    assert wire.encode_direct(_req(), None) is None
    assert wire.encode_direct(_req(code="x = '\ud800'"), BASE) is None  # not UTF-8 encodable
    lang = {"name": "python", "file": "sub/main.py", "inproc": True}
    assert wire.encode_direct(_req(lang=lang), BASE) is None


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=[True, False],
                        ids=["compiled", "python"])
async def mgr(request: pytest.FixtureRequest) -> AsyncIterator[CpuManager]:
    if os.geteuid() != 0:
        pytest.skip("sandboxes need root (namespaces, cgroups)")
    m = CpuManager(CpuManagerConfig(work_root=tempfile.mkdtemp(prefix="tangram-cpu-test-"),
                                    sandbox_uid=TEST_UID, sandbox_gid=TEST_UID, warm_min=1,
                                    warm_max=4, compiled_setup=request.param,
                                    sandbox_id_count=0))  # (one uid: TEST_UID, pinned below)
    try:
        await m.start()
    except IsolationUnavailable as e:
        pytest.skip(f"isolation unavailable here: {e}")
    yield m
    await m.aclose()


PROBE = r"""
import os, sys, resource, ctypes, errno
print("héllo ✓", sys.argv, __file__, os.getcwd(), sys.path[0], os.cpu_count())
print(os.getuid(), os.getgid(), os.getgroups(), os.getsid(0) == os.getpid())
print(sorted(int(f) for f in os.listdir("/proc/self/fd")))
print(resource.getrlimit(resource.RLIMIT_CORE), resource.getrlimit(resource.RLIMIT_NOFILE)[0] > 0)
print(open("/proc/self/status").read().split("NoNewPrivs:")[1].split()[0],
      open("/proc/self/status").read().split("Seccomp:")[1].split()[0])
print(open("/proc/self/cgroup").read().strip().endswith(":/"))
print(repr(sys.stdin.read()), oct(os.stat(__file__).st_mode & 0o777), os.stat(__file__).st_uid)
libc = ctypes.CDLL(None, use_errno=True)
print(libc.unshare(0x10000000), ctypes.get_errno() == errno.EPERM)
print("to stderr", file=sys.stderr)
sys.exit(3)
"""


@pytest.mark.asyncio(loop_scope="module")
async def test_direct_action_sees_the_same_sandbox(mgr: CpuManager) -> None:
    r = await mgr.run(action(PROBE, stdin="in ✓\n"), allot(cpu=2))
    assert r.run_result is not None, r.to_dict()
    out = r.run_result.stdout.splitlines()
    assert out[0] == "héllo ✓ ['/workdir/main.py'] /workdir/main.py /workdir /workdir 2"
    assert out[1] == f"{TEST_UID} {TEST_UID} [] True"
    # stdin, the two pipes, the listing's own fd, the exit report's socket (close-on-exec)
    assert out[2] == "[0, 1, 2, 3, 900]"
    assert out[3] == "(0, 0) True"
    assert out[4] == "1 2"  # no_new_privs, seccomp filter mode
    assert out[5] == "True"  # its own cgroup namespace
    assert out[6] == f"'in ✓\\n' 0o644 {TEST_UID}"
    assert out[7] == "-1 True"  # the syscall filter denies a user namespace
    assert r.run_result.stderr == "to stderr\n"
    assert r.run_result.return_code == 3 and r.status == "Failed"


@pytest.mark.asyncio(loop_scope="module")
async def test_a_small_memory_limit_shrinks_the_tmpfs_on_the_direct_path(mgr: CpuManager) -> None:
    # 128 MiB of memory: /workdir + /tmp is remounted to half of it before the code runs
    # (`payload.tmpfs_mb`); 512 MiB: left at the size it was mounted with (workdir_max_mb)
    code = ("import os\nfor p in ('/tmp', '/workdir'):\n    s = os.statvfs(p)\n"
            "    print(s.f_blocks * s.f_frsize >> 20, s.f_files)")
    for mem, mb in ((128, 64), (512, mgr.config.workdir_max_mb), (100, 50)):
        r = await mgr.run(action(code), allot(memory_mb=mem))
        assert r.status == "Success" and r.run_result is not None, r.to_dict()
        assert r.run_result.stdout == f"{mb} {mb * 256}\n" * 2, (mem, r.run_result.stdout)


@pytest.mark.asyncio(loop_scope="module")
async def test_general_form_still_runs_in_a_direct_sandbox(mgr: CpuManager) -> None:
    # extra files: the general (marshal) request, in the same kind of sandbox
    r = await mgr.run(action("print(open('data/x.txt').read())", files={"data/x.txt": "aGk="}),
                      allot())
    assert r.status == "Success" and r.run_result is not None, r.to_dict()
    assert r.run_result.stdout == "hi\n"
    # a lone surrogate in the code cannot go as UTF-8: the general form carries it
    r = await mgr.run(action("s = '\\ud800'\nprint(len(s))"), allot())
    assert r.status == "Success" and r.run_result is not None and r.run_result.stdout == "1\n"
    r = await mgr.run(action("echo $((6*7))", language="bash"), allot())
    assert r.status == "Success" and r.run_result is not None and r.run_result.stdout == "42\n"


@pytest.mark.asyncio(loop_scope="module")
async def test_code_runs_as_python_main_would(mgr: CpuManager) -> None:
    # (the compiled path runs a compact action's code through the C API: same outcomes)
    # no flag of ours reaches the code: child.py's `from __future__ import annotations` did
    r = await mgr.run(action("def f(x: int): pass\nprint(f.__annotations__['x'] is int)"),
                      allot())
    assert r.run_result is not None and r.run_result.stdout == "True\n", r.to_dict()
    # a traceback shows the code's frames only
    r = await mgr.run(action("def f():\n    1 / 0\nf()\n"), allot())
    assert r.run_result is not None and r.run_result.return_code == 1, r.to_dict()
    tb = r.run_result.stderr
    assert tb.startswith("Traceback (most recent call last):\n") and "ZeroDivisionError" in tb
    assert tb.count('File "') == 2 and 'main.py", line 3' in tb  # <module>, f
    r = await mgr.run(action("x = (\n"), allot())
    assert r.run_result is not None and r.run_result.return_code == 1
    assert "SyntaxError" in r.run_result.stderr and "Traceback" not in r.run_result.stderr
    # SystemExit with a message, atexit handlers, unflushed output, a non-daemon thread
    code = ("import atexit, sys, threading\natexit.register(lambda: print('at exit'))\n"
            "threading.Thread(target=lambda: print('thread')).start()\n"
            "sys.stdout.write('no newline')\nsys.exit('bye')\n")
    r = await mgr.run(action(code), allot())
    assert r.run_result is not None and r.run_result.return_code == 1, r.to_dict()
    out = r.run_result.stdout
    assert r.run_result.stderr == "bye\n"
    assert "thread\n" in out and "no newline" in out and out.endswith("at exit\n"), out
