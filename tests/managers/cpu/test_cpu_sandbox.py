# ruff: noqa: F811  (the module-scoped `mgr` fixture is imported, then requested)
"""Integration tests of the CPU manager on real sandboxes: semantics, languages, sessions, batches."""

from __future__ import annotations

import asyncio
import base64
import glob
import os

import pytest
from _cpu_fixture import OUTPUT_CAP, mgr  # noqa: F401
from _cpu_helpers import action, allot, no_leftovers, pod_pid, work_root_left

from arl_tangram.core.actions import ActionKind, Status
from arl_tangram.core.resources import Resources
from arl_tangram.managers.cpu import CpuManager
from arl_tangram.managers.cpu.host.pool import LEFTOVER_MAX

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


async def test_isolation_report_is_complete(mgr: CpuManager) -> None:
    rep = mgr.isolation_report()
    for key in ("pid_namespace", "mount_namespace", "network_namespace", "ipc_namespace",
                "uts_namespace", "readonly_system", "unprivileged_user", "no_new_privs",
                "cgroup_memory", "cgroup_pids", "cgroup_cpu", "host_paths_hidden"):
        assert rep[key] is True, (key, rep)
    assert rep["cgroup_version"] in ("v1", "v2")


async def test_run_code_semantics(mgr: CpuManager) -> None:
    files = {"data/in.txt": base64.b64encode(b"hello").decode()}
    code = ("import sys\nd = open('data/in.txt').read()\nopen('out.txt','w').write(d.upper())\n"
            "print(sys.stdin.read().strip(), d)\nprint('warn', file=sys.stderr)\n")
    r = await mgr.run(action(code, stdin="abc\n", files=files, fetch_files=["out.txt", "nope"]),
                      allot())
    d = r.to_dict()
    assert d["status"] == "Success", d
    assert d["run_result"]["stdout"] == "abc hello\n" and d["run_result"]["stderr"] == "warn\n"
    assert d["compile_result"] is None and d["run_result"]["return_code"] == 0
    assert base64.b64decode(d["files"]["out.txt"]) == b"HELLO" and "nope" not in d["files"]
    assert r.cpu_time is not None and r.peak_memory_mb is not None
    assert r.action_status is Status.SUCCEEDED


async def test_failure_exception_and_exit_code(mgr: CpuManager) -> None:
    r = await mgr.run(action("def f():\n    raise ValueError('bad')\nf()\n"), allot())
    assert r.status == "Failed" and r.run_result is not None
    assert r.run_result.return_code == 1 and "ValueError: bad" in r.run_result.stderr
    assert 'main.py", line 2' in r.run_result.stderr
    r = await mgr.run(action("import sys; sys.exit(3)"), allot())
    assert r.run_result is not None and r.run_result.return_code == 3
    assert r.action_status is Status.FAILED


async def test_death_by_signal_reports_the_signal(mgr: CpuManager) -> None:
    # A crash gives no exit report of its own: the code is -signal, its output so far is kept.
    code = "import ctypes, sys\nprint('before', flush=True)\nctypes.string_at(0)\n"
    r = await mgr.run(action(code), allot())
    assert r.status == "Failed" and r.run_result is not None, r.to_dict()
    assert r.run_result.return_code == -11 and r.run_result.stdout == "before\n"
    assert r.run_result.status == "Finished"


async def test_a_broken_report_that_runs_on_is_killed_at_its_limit(mgr: CpuManager) -> None:
    # The action closes its report socket (every fd past stderr) and runs on: it is no sandbox
    # error, it is an action past its time limit, killed, its output so far kept.
    code = ("import os, time\nprint('so far', flush=True)\nos.closerange(3, 4096)\n"
            "time.sleep(60)\n")
    r = await mgr.run(action(code, run_timeout=1), allot())
    assert r.status == "Failed" and r.run_result is not None, r.to_dict()
    assert r.run_result.status == "TimeLimitExceeded" and r.run_result.return_code == -9
    assert r.run_result.stdout == "so far\n" and r.run_result.execution_time >= 1.0


async def test_bad_payload_is_a_sandbox_error_naming_the_field(mgr: CpuManager) -> None:
    r = await mgr.run(action("x", language="cobol"), allot())
    assert r.status == "SandboxError" and "payload.language" in r.message
    r = await mgr.run(action("x", files={"../x": ""}), allot())
    assert r.status == "SandboxError" and "payload.files" in r.message


async def test_missing_toolchain_gives_clear_error(mgr: CpuManager) -> None:
    if "go" in mgr.languages():
        pytest.skip("go is installed here")
    r = await mgr.run(action("package main", language="go"), allot())
    assert r.status == "SandboxError" and "go" in r.message and "not installed" in r.message


LANG_PROGRAMS = {
    "python": "print(input()[::-1])",
    "bash": "read x; echo $x | rev",
    "cpp": "#include <iostream>\n#include <algorithm>\nint main(){std::string s;std::cin>>s;"
           "std::reverse(s.begin(),s.end());std::cout<<s<<std::endl;}",
    "c": "#include <stdio.h>\n#include <string.h>\nint main(){char s[64];scanf(\"%63s\",s);"
         "for(int i=strlen(s)-1;i>=0;i--)putchar(s[i]);puts(\"\");}",
    "nodejs": "const s=require('fs').readFileSync(0,'utf8').trim();"
              "console.log(s.split('').reverse().join(''))",
    "java": "import java.util.*;\npublic class Rev { public static void main(String[] a) {"
            "Scanner sc=new Scanner(System.in);System.out.println(new StringBuilder(sc.next())"
            ".reverse());}}",
    "rust": "use std::io::*;\nfn main(){let mut s=String::new();stdin().read_line(&mut s)"
            ".unwrap();println!(\"{}\",s.trim().chars().rev().collect::<String>());}",
}


@pytest.mark.parametrize("lang", sorted(LANG_PROGRAMS))
async def test_languages(mgr: CpuManager, lang: str) -> None:
    if lang not in mgr.languages():
        pytest.skip(f"{lang} toolchain not installed")
    r = await mgr.run(action(LANG_PROGRAMS[lang], language=lang, stdin="tangram\n",
                             run_timeout=20, compile_timeout=60), allot(memory_mb=1024))
    assert r.status == "Success", r.to_dict()
    assert r.run_result is not None and r.run_result.stdout.strip() == "margnat"


async def test_pytest_language(mgr: CpuManager) -> None:
    if "pytest" not in mgr.languages():
        pytest.skip("pytest not importable")
    ok = "def test_a():\n    assert 1 + 1 == 2\n"
    r = await mgr.run(action(ok, language="pytest", run_timeout=30), allot(memory_mb=512))
    assert r.status == "Success", r.to_dict()
    r = await mgr.run(action(ok + "def test_b():\n    assert 0\n", language="pytest",
                             run_timeout=30), allot(memory_mb=512))
    assert r.status == "Failed" and r.run_result is not None and "1 failed" in r.run_result.stdout


async def test_compile_error(mgr: CpuManager) -> None:
    r = await mgr.run(action("int main( {", language="cpp"), allot(memory_mb=512))
    assert r.status == "Failed" and r.run_result is None
    assert r.compile_result is not None and r.compile_result.return_code != 0
    assert "error" in r.compile_result.stderr


async def test_elastic_allotment_is_visible(mgr: CpuManager) -> None:
    code = ("import os, subprocess\nprint(os.environ['TANGRAM_CPUS'], os.environ['OMP_NUM_THREADS'],"
            " os.cpu_count(), subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip())")
    r = await mgr.run(action(code), allot(cpu=3))
    assert r.run_result is not None and r.run_result.stdout.split() == ["3", "3", "3", "3"]


async def test_cancel_kills_the_action(mgr: CpuManager) -> None:
    a = action("while True: pass", run_timeout=60)
    task = asyncio.create_task(mgr.run(a, allot()))
    await asyncio.sleep(0.5)
    await mgr.cancel(a.id)
    r = await asyncio.wait_for(task, 5)
    assert r.status == "SandboxError" and "cancel" in r.message
    assert await no_leftovers() == []


async def test_resize_changes_cpu_quota(mgr: CpuManager) -> None:
    a = action("import time; time.sleep(1.5)")
    task = asyncio.create_task(mgr.run(a, allot(cpu=1)))
    await asyncio.sleep(0.4)
    sb = mgr._running[a.id]
    assert sb.slot is not None
    await mgr.resize(a.id, Resources(cpu=2.5))
    name = "cpu.cfs_quota_us" if sb.slot.version == "v1" else "cpu.max"
    with open(f"{sb.slot.dirs['cpu']}/{name}") as f:
        quota = f.read().split()[0]
    assert int(quota) == 250_000
    assert (await task).status == "Success"


async def test_warm_pool_follows_target(mgr: CpuManager) -> None:
    mgr.set_warm_target("python", 5)
    for _ in range(100):
        if mgr.warm_state()["sandbox"] >= 5:
            break
        await asyncio.sleep(0.05)
    assert mgr.warm_state()["sandbox"] >= 5
    mgr.set_warm_target("python", 2)


async def test_refill_comes_after_the_result_and_still_comes(mgr: CpuManager) -> None:
    """Giving a sandbox back does not wake the refill before the action's result is delivered
    (the refill would run first); the wake comes shortly after."""
    pool = mgr._pool
    assert pool is not None
    mgr.set_warm_target("python", 4)
    try:
        for _ in range(100):
            if len(pool.ready) >= 4:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.05)  # (the fill loop is back waiting)
        assert len(pool.ready) >= 4 and not pool._wake.is_set()
        r = await mgr.run(action("print(1)"), allot())  # takes one of 4: no wake by `take`
        assert r.status == "Success", r.to_dict()
        assert not pool._wake.is_set()  # released, but the refill waits for its turn
        assert pool._kick is not None  # ... which is due
        await asyncio.sleep(0.1)
        assert pool._kick is None and len(pool.ready) >= 3  # the fill loop was woken
    finally:
        mgr.set_warm_target("python", 2)


async def test_take_during_a_refill_gets_one_of_the_batch(mgr: CpuManager) -> None:
    """A take that finds the pool empty while a refill batch is in flight gets a sandbox of that
    batch (no cold spawn of its own); a take cancelled meanwhile leaves nothing behind."""
    pool = mgr._pool
    assert pool is not None
    taken = []
    mgr.set_warm_target("python", 6)
    try:
        for _ in range(400):
            while pool.ready:
                taken.append(pool.ready.popleft())
            if pool._filling:
                break
            pool._wake.set()
            await asyncio.sleep(0.005)
        assert pool._filling and not pool.ready
        cold_task = pool._cold_task
        first = asyncio.create_task(pool.take())
        second = asyncio.create_task(pool.take())
        await asyncio.sleep(0)
        second.cancel()
        sb = await first
        assert pool._cold_task is cold_task  # no cold spawn was asked for
        assert not sb.dead and sb.slot is not None and sb in pool.live
        with pytest.raises(asyncio.CancelledError):
            await second
        assert not pool._takers
        taken.append(sb)
    finally:
        for sb in taken:
            pool.release(sb)
        mgr.set_warm_target("python", 2)
    r = await mgr.run(action("print(1)"), allot())
    assert r.status == "Success", r.to_dict()


async def test_each_action_gets_a_fresh_sandbox(mgr: CpuManager) -> None:
    code = "import os\nprint(os.listdir('.'), os.listdir('/tmp'))\nopen('/tmp/mark','w').write('x')"
    r1 = await mgr.run(action(code), allot())
    r2 = await mgr.run(action(code), allot())
    assert r1.run_result is not None and r2.run_result is not None
    assert r2.run_result.stdout == "['main.py'] []\n" and r1.run_result.stdout == r2.run_result.stdout
    await asyncio.sleep(0.2)
    assert not os.path.exists(f"/proc/{pod_pid(r1)}") and not os.path.exists(f"/proc/{pod_pid(r2)}")
    assert work_root_left(mgr.config.work_root) == []


async def test_fork_server_binds_eagerly_and_actions_do_not_see_it(mgr: CpuManager) -> None:
    """The fork server runs with LD_BIND_NOW (its sandboxes never enter the dynamic linker's
    lazy binding), and no action's environment (Python's os.environ, a program it starts, a
    non-Python action) carries the variable."""
    zygote = mgr.fork.zygote
    assert zygote is not None and zygote.hello.get("bind_now") is True
    with open(f"/proc/{zygote.proc.pid}/environ", "rb") as f:  # scrubbed once started
        assert b"LD_BIND_NOW" not in f.read()
    with open(f"/proc/{zygote.proc.pid}/cmdline", "rb") as f:
        assert f.read().rstrip(b"\0") == b"tangram-sandbox"
    code = ("import os, subprocess\nprint(os.environ.get('LD_BIND_NOW'))\n"
            "print(subprocess.run(['sh', '-c', 'echo ${LD_BIND_NOW-unset}'], capture_output=True,"
            " text=True).stdout.strip())\n")
    r = await mgr.run(action(code), allot())
    assert r.run_result is not None and r.run_result.stdout == "None\nunset\n", r.to_dict()
    r = await mgr.run(action("echo ${LD_BIND_NOW-unset}", language="bash"), allot())
    assert r.run_result is not None and r.run_result.stdout == "unset\n", r.to_dict()


async def test_burst_beyond_the_warm_pool_gets_fresh_sandboxes(mgr: CpuManager) -> None:
    """More actions at once than warm sandboxes: the rest are spawned together on demand; each
    still gets a sandbox of its own, and every sandbox's end is seen (its slot recycled)."""
    code = "import os\nprint(os.listdir('.'), os.listdir('/tmp'))\nopen('/tmp/mark', 'w')"
    rs = await asyncio.gather(*(mgr.run(action(code), allot(cpu=0.5)) for _ in range(24)))
    assert all(r.status == "Success" and r.run_result is not None
               and r.run_result.stdout == "['main.py'] []\n" for r in rs), [r.to_dict() for r in rs]
    assert len({r.executor_pod_name for r in rs}) == len(rs)
    pool = mgr._pool
    assert pool is not None
    for _ in range(100):
        busy = [sb for sb in pool.live if sb not in pool.ready and not sb.released]
        ended = [sb for sb in pool.live if sb.released]  # released, end not yet seen
        if not busy and not ended:
            break
        await asyncio.sleep(0.05)
    assert not busy and not ended, (busy, ended)
    assert await no_leftovers() == []


async def test_reused_cgroup_slot_keeps_no_limit_or_stat(mgr: CpuManager) -> None:
    """Cgroup slots are reused, their limits rewritten only where they differ and their counters
    reset: an action never sees an earlier action's limits, CPU time, peak memory or OOM kill."""
    # (its CPU time, 0.8 s, far above what a later 80 MB action takes even on a loaded machine
    # -- 0.27 s seen -- so that a counter not reset shows)
    tight = await mgr.run(action("import time\nt = time.process_time()\n"
                                 "while time.process_time() - t < 0.8: pass\n"
                                 "x = bytearray(100 << 20)\n"), allot(cpu=0.5, memory_mb=48))
    assert tight.memory_exceeded and (tight.cpu_time or 0) >= 0.8, tight.to_dict()
    pool = mgr._pool
    assert pool is not None and pool.cgroups is not None
    # An action that reads a file first leaves its page cache charged to its slot after it is
    # gone (what once made a later 80 MB action report 256 MB, its limit): such a slot is not
    # reused. Evict a big system file from the page cache, have an action read it whole.
    big = _big_uncached_file()
    if big is not None:
        r = await mgr.run(action(f"f = open({big!r}, 'rb')\nwhile f.read(1 << 20): pass\n"),
                          allot(cpu=2))
        assert r.status == "Success" and (r.peak_memory_mb or 0) > 24, r.to_dict()
        for _ in range(100):  # its slot recycled (or retired)
            if not [sb for sb in pool.live if sb.released]:
                break
            await asyncio.sleep(0.05)
        assert all(s.charged_bytes() <= LEFTOVER_MAX for s in pool.free_slots), \
            [(s.name, s.charged_bytes()) for s in pool.free_slots]
    made = pool.cgroups._count
    for _ in range(12):  # more than the pool holds: slots freed by earlier actions come back
        r = await mgr.run(action("x = bytearray(80 << 20)\nprint(len(x))"), allot(cpu=2))
        assert r.status == "Success" and not r.memory_exceeded, r.to_dict()
        assert (r.cpu_time or 0) < 0.75 and 60 < (r.peak_memory_mb or 0) < 200, r.to_dict()
    assert pool.cgroups._count - made < 12  # (so some of those ran in reused slots)


def _big_uncached_file() -> str | None:
    """A system file of 24-300 MB visible in sandboxes, evicted from the page cache now."""
    cands = [*glob.glob("/usr/lib/jvm/*/lib/modules"), *glob.glob("/usr/lib/gcc/*/*/cc1plus"),
             *glob.glob("/usr/lib/x86_64-linux-gnu/libLLVM*.so*"), *glob.glob("/usr/bin/*")]
    for path in cands:
        try:
            if os.path.isfile(path) and 24 << 20 <= os.path.getsize(path) <= 300 << 20:
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
                return path
        except OSError:
            continue
    return None


# test batches --------------------------------------------------------------------------------
SUM_CPP = ("#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a+b<<std::endl;}")


async def test_batch_compiles_once_with_per_case_results(mgr: CpuManager) -> None:
    cases = [{"stdin": f"{i} {i}\n", "expected_stdout": f"{2 * i}\n"} for i in range(6)]
    cases[3]["expected_stdout"] = "wrong\n"
    a = action(SUM_CPP, kind=ActionKind.TEST, language="cpp", cases=cases)
    r = await mgr.run(a, allot(cpu=2, memory_mb=512))
    assert r.compile_result is not None and r.compile_result.return_code == 0
    assert r.cases is not None and [c.passed for c in r.cases] == [True] * 3 + [False] + [True] * 2
    assert r.status == "Failed" and "5/6" in r.message
    assert r.to_dict()["cases"][0]["run_result"]["stdout"] == "0\n"


async def test_batch_stop_on_first_failure(mgr: CpuManager) -> None:
    cases = [{"assert": "assert f(1) == 2"}, {"assert": "assert f(2) == 5"}] + [
        {"assert": "import time; time.sleep(0.3); assert f(3) == 4"}] * 6
    a = action("def f(x):\n    return x * 2\n", kind=ActionKind.TEST, cases=cases,
               stop_on_first_failure=True)
    r = await mgr.run(a, allot(cpu=1))
    assert r.cases is not None and r.cases[0].passed and not r.cases[1].passed
    assert r.cases[1].run is not None and "AssertionError" in r.cases[1].run.stderr
    assert all(c.skipped for c in r.cases[2:])
    r = await mgr.run(action("x = input()\nprint(int(x) + 1)", kind=ActionKind.TEST,
                             cases=[{"stdin": "1", "expected_stdout": "2"},
                                    {"stdin": "5", "expected_stdout": "6\n"}]), allot())
    assert r.status == "Success" and r.action_status is Status.SUCCEEDED


# sessions ------------------------------------------------------------------------------------
async def test_python_session_keeps_variables(mgr: CpuManager) -> None:
    await mgr.open_session("py1", Resources(cpu=1, memory_mb=256), ttl_s=60)
    r = await mgr.run(action("x = 41", kind=ActionKind.TOOL, session="py1"), allot())
    assert r.status == "Success", r.to_dict()
    r = await mgr.run(action("x += 1\nx", kind=ActionKind.TOOL, session="py1"), allot())
    assert r.run_result is not None and r.run_result.stdout == "42\n"
    r = await mgr.run(action("print(y)", kind=ActionKind.TOOL, session="py1"), allot())
    assert r.status == "Failed" and r.run_result is not None and "NameError" in r.run_result.stderr
    r = await mgr.run(action("print(x)", kind=ActionKind.TOOL, session="py1"), allot())
    assert r.run_result is not None and r.run_result.stdout == "42\n"  # survives an error
    await mgr.close_session("py1")
    r = await mgr.run(action("print(x)", kind=ActionKind.TOOL, session="py1"), allot())
    assert r.status == "SandboxError" and "py1" in r.message


async def test_bash_session_keeps_cwd_and_files(mgr: CpuManager) -> None:
    await mgr.open_session("sh1", Resources(cpu=1, memory_mb=256), ttl_s=60)
    run = lambda c: mgr.run(action(c, kind=ActionKind.TOOL, session="sh1", language="bash"),  # noqa: E731
                            allot())
    assert (await run("mkdir -p repo/src && cd repo && echo hi > src/f.txt && export V=7")).status \
        == "Success"
    r = await run("pwd; cat src/f.txt; echo $V")
    assert r.run_result is not None and r.run_result.stdout == "/workdir/repo\nhi\n7\n"
    r = await run("false")
    assert r.status == "Failed" and r.run_result is not None and r.run_result.return_code == 1
    r = await run("sleep 5", ) if False else await mgr.run(
        action("sleep 5", kind=ActionKind.TOOL, session="sh1", language="bash", run_timeout=0.5),
        allot())
    assert r.action_status is Status.TIMED_OUT
    await mgr.close_session("sh1")


async def test_session_ttl_expires(mgr: CpuManager) -> None:
    await mgr.open_session("ttl1", Resources(cpu=1, memory_mb=128), ttl_s=0.3)
    assert "ttl1" in mgr.session_ids()
    for _ in range(40):
        if "ttl1" not in mgr.session_ids():
            break
        await asyncio.sleep(0.1)
    assert "ttl1" not in mgr.session_ids()
    assert await no_leftovers() == []


async def test_output_cap_is_reported(mgr: CpuManager) -> None:
    r = await mgr.run(action("print('x' * 1000000)"), allot())
    assert r.output_truncated and r.run_result is not None
    assert len(r.run_result.stdout) == OUTPUT_CAP and r.status == "Success"
