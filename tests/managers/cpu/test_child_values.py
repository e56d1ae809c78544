"""Exact values of a sandbox child's steps (`sandbox/child.py`, issue 43): the exit code of code
that raised, the status report's bytes (plain and framed), `killpg`'s tolerated errors, the base
environment, `exec_python`'s globals, path, argv, cpu_count and environment, `exec_job`'s
shutdown (threads, atexit, a failed flush), and the compiled path's arguments (`setup` with
`FAST`, `fast_drop`, `filter_bpf`). The children run as forks of the test process."""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
from types import SimpleNamespace

import pytest

from arl_tangram.managers.cpu import _linux
from arl_tangram.managers.cpu.sandbox import child
from arl_tangram.managers.cpu.sandbox.child import Job, Limits

# Its tests fork and run Python in the child: after the suite's earlier tests in one process,
# those forks took 36.6 s (0.5 s alone; tests/conftest.py on `own_process`).
pytestmark = pytest.mark.own_process

LIM = Limits(uid=65534, gid=65533, cpu_s=10, fsize=1 << 20, nofile=1024, output=0, cpus=1.0)


def test_code_failed_codes(capsys) -> None:
    assert child.code_failed(SystemExit(None), None) == 0
    assert child.code_failed(SystemExit(3), None) == 3
    assert child.code_failed(SystemExit(256 + 7), None) == 7
    assert child.code_failed(SystemExit(-1), None) == 255
    assert capsys.readouterr().err == ""
    assert child.code_failed(SystemExit("bye"), None) == 1
    assert capsys.readouterr().err == "bye\n"
    assert child.code_failed(ValueError("bad"), None) == 1
    assert capsys.readouterr().err == "ValueError: bad\n"


def test_report_plain_and_framed() -> None:
    r, w = os.pipe()
    ino = os.fstat(w).st_ino
    child.report((w, ino), 3)
    assert os.read(r, 100) == (3).to_bytes(4, "big")
    child.report((w, ino), 256 + 9)
    assert os.read(r, 100) == (9).to_bytes(4, "big")
    child.report((w, ino), 300, framed=True)
    body = b'{"rc":44}'
    assert os.read(r, 100) == len(body).to_bytes(4, "big") + body
    child.report((w, ino + 1), 1)  # not our socket any more: nothing
    os.set_blocking(r, False)
    with pytest.raises(BlockingIOError):
        os.read(r, 100)
    os.close(w)
    child.report((w, ino), 1)  # closed: nothing raised
    os.close(r)


def test_killpg_tolerates_only_gone_and_refused(monkeypatch) -> None:
    sent = []

    def killpg(pg, sig):
        sent.append((pg, sig))
        raise OSError(err[0], "x")

    monkeypatch.setattr(child.os, "killpg", killpg)
    for e in (errno.ESRCH, errno.EPERM):
        err = [e]
        child.killpg(5)
    err = [errno.EINVAL]
    with pytest.raises(OSError):
        child.killpg(6)
    assert sent == [(5, signal.SIGKILL), (5, signal.SIGKILL), (6, signal.SIGKILL)]


def _fork(fn) -> tuple[int, bytes]:
    """Run ``fn`` in a fork; (exit code, what it wrote to fd 1)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(w, 1)
            os.dup2(w, 2)
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
            sys.stderr = sys.stdout
            fn()
            sys.stdout.flush()
        except BaseException:
            import traceback

            traceback.print_exc()
            sys.stdout.flush()
            os._exit(99)
        os._exit(0)
    os.close(w)
    buf = b""
    while chunk := os.read(r, 1 << 16):
        buf += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), buf


def test_set_base_env_replaces_the_environment() -> None:
    keep = os.environ.get("MUTANT_UNDER_TEST")

    def fn():
        env = {"A": "1", **({"MUTANT_UNDER_TEST": keep} if keep else {})}
        child.set_base_env(env)
        print(json.dumps([dict(os.environ), child.BASE_ENV, child.BASE_ENV is env]))

    rc, out = _fork(fn)
    environ, base, same = json.loads(out)
    assert rc == 0 and environ == base and base["A"] == "1" and same is False
    assert set(base) <= {"A", "MUTANT_UNDER_TEST"}


def test_exec_python_globals_path_argv_and_cpus(tmp_path) -> None:
    code = (
        "import os, sys\nprint(__name__, __file__, sys.argv, sys.path[0], os.cpu_count(),\n"
        "      'annotations' in globals(), os.environ.get('T53'))\n"
    )
    code2 = "print(__file__, x if 'x' in dir() else None)\nx = 1\n"

    def fn():
        job = Job(
            python=[(code, "a.py"), ("x = 5\n", "b.py"), (code2, "c.py")],
            env={**os.environ, "T53": "v"},
        )
        rc = child.exec_python(job, Limits(**{**_fields(LIM), "cpus": 2.001}))
        sys.stdout.flush()
        print("rc", rc)

    rc, out = _fork(fn)
    assert rc == 0
    lines = out.decode().splitlines()
    assert lines[0] == "__main__ a.py ['a.py'] /workdir 3 False v"
    assert lines[1] == "c.py 5"  # one namespace for every part
    assert lines[2] == "rc 0"


def _fields(lim: Limits) -> dict:
    return {
        k: getattr(lim, k) for k in ("uid", "gid", "cpu_s", "fsize", "nofile", "output", "cpus")
    }


def test_exec_python_cpus_round_up_and_never_below_one() -> None:
    def fn():
        for c in (0.0, 0.5, 1.0, 1.0005, 1.001, 3.0):
            child.exec_python(
                Job(python=[("import os\nprint(os.cpu_count())", "m")], env=dict(os.environ)),
                Limits(**{**_fields(LIM), "cpus": c}),
            )
        sys.stdout.flush()

    rc, out = _fork(fn)
    assert rc == 0 and out.split() == [b"1", b"1", b"1", b"1", b"2", b"3"]


def test_exec_python_keeps_the_base_environment_object(monkeypatch) -> None:
    def fn():
        base = dict(os.environ)
        child.BASE_ENV = base
        os.environ["EXTRA"] = "kept"  # a job whose env is the base: os.environ left alone
        child.exec_python(
            Job(python=[("import os\nprint(os.environ.get('EXTRA'))", "m")], env=base), LIM
        )
        child.exec_python(
            Job(python=[("import os\nprint(os.environ.get('EXTRA'))", "m")], env=dict(base)), LIM
        )
        child.exec_python(
            Job(
                python=[("import os\nprint(os.environ.get('EXTRA'), os.environ['NEW'])", "m")],
                env={**base, "NEW": "1"},
            ),
            LIM,
        )
        sys.stdout.flush()

    rc, out = _fork(fn)
    assert rc == 0 and out.split() == [b"kept", b"kept", b"None", b"1"]


def test_exec_python_exit_codes_and_traceback() -> None:
    def fn():
        rc = child.exec_python(
            Job(python=[("import sys\nsys.exit(4)", "m")], env=dict(os.environ)), LIM
        )
        rc2 = child.exec_python(
            Job(python=[("def f():\n    1/0\nf()", "t.py")], env=dict(os.environ)), LIM
        )
        rc3 = child.exec_python(Job(python=None, env=dict(os.environ)), LIM)
        sys.stdout.flush()
        print("rcs", rc, rc2, rc3)

    rc, out = _fork(fn)
    text = out.decode()
    assert rc == 0 and text.endswith("rcs 4 1 0\n")
    assert text.startswith(
        'Traceback (most recent call last):\n  File "t.py", line 3, in <module>\n'
    )
    assert "exec_python" not in text and "ZeroDivisionError: division by zero" in text


def test_exec_job_runs_atexit_and_joins_threads_then_reports() -> None:
    src = (
        "import atexit, threading, time\n"
        "atexit.register(lambda: print('atexit'))\n"
        "def late():\n    time.sleep(0.2)\n    print('thread')\n"
        "threading.Thread(target=late).start()\nprint('main')\n"
    )
    r, w = os.pipe()

    def fn():
        child.exec_job(Job(python=[(src, "m")], env=dict(os.environ)), LIM, (w, os.fstat(w).st_ino))

    rc, out = _fork(fn)
    os.close(w)
    assert rc == 0 and out.split() == [b"main", b"thread", b"atexit"]
    assert os.read(r, 16) == bytes(4)
    os.close(r)


def test_exec_job_codes(tmp_path) -> None:
    r, w = os.pipe()

    def exits():
        child.exec_job(
            Job(python=[("import sys\nsys.exit(6)", "m")], env=dict(os.environ)),
            LIM,
            (w, os.fstat(w).st_ino),
            framed=True,
        )

    rc, _ = _fork(exits)
    assert rc == 6
    body = b'{"rc":6}'
    assert os.read(r, 64) == len(body).to_bytes(4, "big") + body
    os.close(r)
    os.close(w)

    def flush_fails():
        sys.stdout = SimpleNamespace(flush=lambda: 1 / 0, write=lambda s: len(s))
        child.exec_job(Job(python=[("pass", "m")], env=dict(os.environ)), LIM)

    rc, _ = _fork(flush_fails)
    assert rc == 120

    def flush_fails_after_error():
        sys.stderr = SimpleNamespace(flush=lambda: 1 / 0, write=lambda s: len(s))
        child.exec_job(Job(python=[("raise SystemExit(9)", "m")], env=dict(os.environ)), LIM)

    rc, _ = _fork(flush_fails_after_error)
    assert rc == 9

    def bad_exec():
        child.exec_job(Job(argv=[str(tmp_path / "nope")], env={}), LIM)

    rc, out = _fork(bad_exec)
    assert rc == 127
    assert (
        out
        == f"sandbox: cannot start: [Errno 2] No such file or directory: '{tmp_path / 'nope'}'\n".encode()
    )


def test_default_signals_are_reset(monkeypatch) -> None:
    def fn():
        for s in (
            signal.SIGINT,
            signal.SIGTERM,
            signal.SIGPIPE,
            signal.SIGXFSZ,
            signal.SIGXCPU,
            signal.SIGCHLD,
        ):
            signal.signal(s, signal.SIG_IGN)
        child.default_signals()
        print(
            [
                signal.getsignal(s) == signal.SIG_DFL
                for s in (
                    signal.SIGINT,
                    signal.SIGTERM,
                    signal.SIGPIPE,
                    signal.SIGXFSZ,
                    signal.SIGXCPU,
                    signal.SIGCHLD,
                )
            ]
        )
        sys.stdout.flush()

    rc, out = _fork(fn)
    assert rc == 0 and out == b"[True, True, True, True, True, True]\n"


def test_the_compiled_path_gets_exact_arguments(monkeypatch) -> None:
    calls = []
    fast = SimpleNamespace(
        detach=lambda *a: calls.append(("detach", a)), drop=lambda *a: calls.append(("drop", a))
    )
    monkeypatch.setattr(child, "FAST", fast)
    monkeypatch.setattr(child, "default_signals", lambda: calls.append(("signals", ())))
    monkeypatch.setattr(child, "FILTER", None)
    lim = Limits(uid=11, gid=12, cpu_s=13, fsize=14, nofile=15, output=16)
    child.setup(lim, (7, 8, 9), keep=2)
    assert calls == [
        ("detach", (7, 8, 9, 2)),
        ("signals", ()),
        ("drop", (b"/workdir", b"1000", 14, 15, 12, 13, 11, None)),
    ]
    calls.clear()
    monkeypatch.setattr(child, "FILTER", SimpleNamespace(bpf=b"BPF", ref=None))
    monkeypatch.setattr(child, "CWD", "/srv/w")
    child.fast_drop(lim)
    assert calls == [("drop", (b"/srv/w", b"1000", 14, 15, 12, 13, 11, b"BPF"))]
    assert child.filter_bpf() == b"BPF"
    monkeypatch.setattr(child, "FILTER", None)
    assert child.filter_bpf() is None
    calls.clear()
    child.setup(lim, (1, 2, 3))
    assert calls[0] == ("detach", (1, 2, 3, 0))


def test_the_python_path_detaches_then_drops(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(child, "FAST", None)
    monkeypatch.setattr(child, "detach", lambda fds, keep: calls.append(("detach", fds, keep)))
    monkeypatch.setattr(child, "drop_privileges", lambda lim: calls.append(("drop", lim)))
    child.setup(LIM, (4, 5, 6), keep=1)
    assert calls == [("detach", (4, 5, 6), 1), ("drop", LIM)]
    calls.clear()
    monkeypatch.setattr(child, "pre_drop", lambda lim: calls.append(("pre", lim)))
    monkeypatch.setattr(child, "final_drop", lambda lim: calls.append(("final", lim)))
    monkeypatch.undo()
    monkeypatch.setattr(child, "pre_drop", lambda lim: calls.append(("pre", lim)))
    monkeypatch.setattr(child, "final_drop", lambda lim: calls.append(("final", lim)))
    child.drop_privileges(LIM)
    assert calls == [("pre", LIM), ("final", LIM)]


@pytest.mark.needs_root
def test_detach_and_drop_in_a_fork(tmp_path) -> None:
    os.chmod(tmp_path, 0o755)
    r0, w0 = os.pipe()

    def fn():
        child.CWD = str(tmp_path)
        keep = os.dup(w0)  # (a fd that must survive as fd 3 + keep... not kept: closed)
        child.detach((r0, 1, 2), keep=0)
        import resource

        child.drop_privileges(
            Limits(uid=65534, gid=65533, cpu_s=3, fsize=4096, nofile=64, output=0)
        )
        with open("/proc/self/status") as f:
            st = {ln.split(":")[0]: ln.split(":", 1)[1].strip() for ln in f}
        with open("/proc/self/oom_score_adj") as f:
            oom = f.read().strip()
        print(
            json.dumps(
                {
                    "fds": sorted(int(x) for x in os.listdir("/proc/self/fd")),
                    "kept": keep,
                    "sid": os.getsid(0) == os.getpid(),
                    "cwd": os.getcwd(),
                    "uid": os.getresuid(),
                    "gid": os.getresgid(),
                    "groups": os.getgroups(),
                    "core": resource.getrlimit(resource.RLIMIT_CORE),
                    "fsize": resource.getrlimit(resource.RLIMIT_FSIZE),
                    "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
                    "cpu": resource.getrlimit(resource.RLIMIT_CPU),
                    "oom": oom,
                    "nnp": st["NoNewPrivs"],
                    "ns": os.readlink("/proc/self/ns/cgroup"),
                }
            )
        )
        sys.stdout.flush()

    rc, out = _fork(fn)
    os.close(r0)
    os.close(w0)
    got = json.loads(out)
    assert rc == 0, out
    assert got["fds"] == [0, 1, 2, 3]  # (3: listdir's own; every other fd closed)
    assert got["sid"] and got["cwd"] == str(tmp_path) and got["oom"] == "1000"
    assert got["uid"] == [65534] * 3 and got["gid"] == [65533] * 3 and got["groups"] == []
    assert (got["core"], got["fsize"], got["nofile"], got["cpu"]) == (
        [0, 0],
        [4096, 4096],
        [64, 64],
        [3, 4],
    )
    assert got["nnp"] == "1" and got["ns"] != os.readlink("/proc/self/ns/cgroup")


@pytest.mark.needs_root
def test_detach_keeps_fds_3_up_to_keep() -> None:
    def fn():
        fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(4)]
        for i, fd in enumerate(fds):
            os.dup2(fd, 3 + i, inheritable=True)
        child.CWD = "/"
        child.detach((0, 1, 2), keep=2)
        print(sorted(int(x) for x in os.listdir("/proc/self/fd")))
        sys.stdout.flush()

    rc, out = _fork(fn)
    assert rc == 0 and out == b"[0, 1, 2, 3, 4, 5]\n"  # 3, 4 kept; 5: listdir's own


def test_constants() -> None:
    assert child.WORKDIR == "/workdir"
    assert (
        tuple(
            int(s)
            for s in (
                signal.SIGPIPE,
                signal.SIGXFSZ,
                signal.SIGXCPU,
                signal.SIGINT,
                signal.SIGTERM,
                signal.SIGCHLD,
            )
        )
        == _linux.CHILD_DEFAULT_SIGNALS
    )
    j = Job()
    assert (
        j.argv,
        j.python,
        j.stdin,
        j.env,
        j.timeout,
        j.pid,
        j.status,
        j.return_code,
        j.started,
        j.elapsed,
        bytes(j.out),
        bytes(j.err),
        j.truncated,
        j.done,
    ) == (None, None, b"", {}, 10.0, 0, "", None, 0.0, None, b"", b"", False, False)
    assert (
        LIM.cpus == 1.0 and Limits(uid=0, gid=0, cpu_s=0, fsize=0, nofile=0, output=0).cpus == 1.0
    )
    j.out += "é".encode() + b"\xff"
    assert j.result()["stdout"] == "é\ufffd"


def test_result_is_exactly_the_wire_dict() -> None:
    j = Job(status="Finished", elapsed=0.25, return_code=3, truncated=True)
    j.out += b"o\xff"
    j.err += "é".encode() + b"\xfe"
    assert j.result() == {
        "status": "Finished",
        "execution_time": 0.25,
        "return_code": 3,
        "stdout": "o\ufffd",
        "stderr": "é\ufffd",
        "truncated": True,
    }


def test_run_child_that_cannot_start_says_why_on_stderr_and_exits_127(monkeypatch) -> None:
    def fn():
        def setup(limits, fds):
            raise OSError(1, "refused")

        child.setup = setup
        child.run_child(Job(python=[("print('ran')", "m")], env=dict(os.environ)), LIM, (0, 1, 2))

    rc, out = _fork(fn)
    assert rc == 127 and out == b"sandbox: cannot start: [Errno 1] refused\n"


def test_detach_puts_the_given_fds_on_0_and_1() -> None:
    r0, w0 = os.pipe()
    r1, w1 = os.pipe()
    os.write(w0, b"in")

    def fn():
        child.CWD = "/"
        ino = os.fstat(r0).st_ino
        child.detach((r0, w1, 2), keep=0)
        os.write(1, b"%d %s" % (os.fstat(0).st_ino == ino, os.read(0, 2)))

    rc, out = _fork(fn)
    os.close(w1)
    got = os.read(r1, 100)
    for fd in (r0, w0, r1):
        os.close(fd)
    assert rc == 0 and out == b"" and got == b"1 in"


def test_exec_python_globals_are_exactly_name_builtins_file() -> None:
    def fn():
        src = "import builtins\nprint(sorted(globals()), __builtins__ is builtins)\n"
        child.exec_python(Job(python=[(src, "g.py")], env=dict(os.environ)), LIM)
        sys.stdout.flush()

    rc, out = _fork(fn)
    assert rc == 0 and out == b"['__builtins__', '__file__', '__name__', 'builtins'] True\n"


def test_run_child_sets_up_with_its_limits_and_fds_then_runs_the_job(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(child, "setup", lambda limits, fds: calls.append(("setup", limits, fds)))
    monkeypatch.setattr(child, "exec_job", lambda job, limits: calls.append(("job", job, limits)))
    job = Job(python=[("pass", "m")])
    child.run_child(job, LIM, (5, 6, 7))
    assert len(calls) == 2
    assert calls[0][0] == "setup" and calls[0][1] is LIM and calls[0][2] == (5, 6, 7)
    assert calls[1][0] == "job" and calls[1][1] is job and calls[1][2] is LIM


def test_a_start_failure_with_stderr_closed_still_exits_127(tmp_path) -> None:
    def setup_fails():
        os.close(2)

        def setup(limits, fds):
            raise OSError(1, "refused")

        child.setup = setup
        child.run_child(Job(python=[("print('ran')", "m")], env=dict(os.environ)), LIM, (0, 1, 2))

    rc, out = _fork(setup_fails)
    assert rc == 127 and out == b""

    def exec_fails():
        os.close(2)
        child.exec_job(Job(argv=[str(tmp_path / "nope")], env={}), LIM)

    rc, out = _fork(exec_fails)
    assert rc == 127 and out == b""


def test_exec_python_replaces_only_the_first_path_entry() -> None:
    def fn():
        sys.path[:] = ["/first", "/second", "/third"]
        src = "import sys\nprint(sys.path)\n"
        child.exec_python(Job(python=[(src, "p.py")], env=dict(os.environ)), LIM)
        sys.stdout.flush()

    rc, out = _fork(fn)
    assert rc == 0 and out == b"['/workdir', '/second', '/third']\n"


def test_exec_python_does_not_inherit_this_modules_future_import() -> None:
    # (child.py has `from __future__ import annotations`: inherited, the code's annotations
    # would be strings)
    def fn():
        src = "def f(x: int) -> None:\n    pass\nprint(f.__annotations__)\n"
        child.exec_python(Job(python=[(src, "a.py")], env=dict(os.environ)), LIM)
        sys.stdout.flush()

    rc, out = _fork(fn)
    assert rc == 0 and out == b"{'x': <class 'int'>, 'return': None}\n"


def test_final_drop_steps_and_the_filter_installed_last(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(child.resource, "setrlimit", lambda *a: calls.append(("rlimit", *a)))
    monkeypatch.setattr(child._linux, "unshare", lambda f: calls.append(("unshare", f)))
    monkeypatch.setattr(child.os, "setresuid", lambda *a: calls.append(("uid", *a)))
    monkeypatch.setattr(child._linux, "die_with_parent", lambda: calls.append(("die",)))
    monkeypatch.setattr(child._linux, "set_no_new_privs", lambda: calls.append(("nnp",)))
    monkeypatch.setattr(child._linux, "install_filter", lambda ref: calls.append(("filter", ref)))
    ref = object()
    monkeypatch.setattr(child, "FILTER", SimpleNamespace(ref=ref))
    child.final_drop(LIM)
    assert calls == [
        ("rlimit", child.resource.RLIMIT_CPU, (10, 11)),
        ("unshare", _linux.CLONE_NEWCGROUP),
        ("uid", 65534, 65534, 65534),
        ("die",),
        ("nnp",),
        ("filter", ref),
    ]
    assert calls[-1][1] is ref
    calls.clear()
    monkeypatch.setattr(child, "FILTER", None)
    child.final_drop(LIM)
    assert [c[0] for c in calls] == ["rlimit", "unshare", "uid", "die", "nnp"]
