"""Exact values of a child forked in advance (`sandbox/prepared.py`, issue 43), run from the test
process itself (so a mutant of `prepared` or `child` runs in the forked child too): what the job's
code sees once handed over (uid, gid, groups, rlimits, OOM score, session, fds, cwd, cgroup
namespace, no_new_privs, the death signal, cpu_count, the environment), the exit code reported
on the control socket, the pipe sizes, a job over 60000 bytes, and a child already gone."""

from __future__ import annotations

import fcntl
import json
import os
import select
import time

import pytest

from arl_tangram.managers.cpu.sandbox import child, prepared
from arl_tangram.managers.cpu.sandbox.child import Job, Limits

pytestmark = [pytest.mark.needs_root, pytest.mark.own_process]  # (tests/conftest.py)

BASE = Limits(uid=65534, gid=65533, cpu_s=7, fsize=1 << 30, nofile=1024, output=0, cpus=1.0)

PROBE = r"""
import ctypes, json, os, resource, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
sig = ctypes.c_int(-1)
libc.prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
fds = sorted(int(x) for x in os.listdir("/proc/self/fd"))
status = {ln.split(":")[0]: ln.split(":", 1)[1].strip() for ln in open("/proc/self/status")}
out = {
    "res_uid": os.getresuid(), "res_gid": os.getresgid(), "groups": os.getgroups(),
    "core": resource.getrlimit(resource.RLIMIT_CORE),
    "fsize": resource.getrlimit(resource.RLIMIT_FSIZE),
    "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
    "cpu": resource.getrlimit(resource.RLIMIT_CPU),
    "oom": open("/proc/self/oom_score_adj").read().strip(),
    "sid_is_pid": os.getsid(0) == os.getpid(), "pgrp_is_pid": os.getpgrp() == os.getpid(),
    "fds": fds, "status_cloexec": not os.get_inheritable(900),
    "cwd": os.getcwd(), "cgroup_ns": os.readlink("/proc/self/ns/cgroup"),
    "nnp": status["NoNewPrivs"], "pdeathsig": sig.value, "ncpu": os.cpu_count(),
    "env": os.environ.get("T53"), "argv": sys.argv, "name": __name__,
    "sigint": signal.getsignal(signal.SIGINT) == signal.SIG_DFL,
    "sigpipe": signal.getsignal(signal.SIGPIPE) == signal.SIG_DFL,
    "stdin": sys.stdin.read(),
}
print(json.dumps(out))
print("to-err", file=sys.stderr)
sys.exit(%d)
"""


def _std_on_fds(monkeypatch):
    """The child's sys.std* on fds 0-2, as in a sandbox (pytest's capture files are fds that
    the child closes; set in the test's body: pytest sets its own again after set-up)."""
    import sys

    monkeypatch.setattr(sys, "stdin", open(0, closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))  # noqa: SIM115


def _read_all(fd: int) -> bytes:
    os.set_blocking(fd, True)
    buf = b""
    while True:
        b = os.read(fd, 1 << 16)
        if not b:
            return buf
        buf += b


def _run(monkeypatch, tmp_path, job: Job, lim: Limits, stdin: bytes = b""):
    _std_on_fds(monkeypatch)
    monkeypatch.setattr(child, "CWD", str(tmp_path))
    os.chmod(tmp_path, 0o755)
    prep = prepared.prepare(BASE)
    assert isinstance(prep, prepared.Prepared) and prep.pid > 0
    before = time.monotonic()
    got = prep.hand_over(job, lim)
    assert got is not None
    pidfd, in_w, out_r, err_r, ctl = got
    assert (in_w, out_r, err_r) == prep.fds and ctl == prep.ctl
    assert job.pid == prep.pid and before <= job.started <= time.monotonic()
    assert [os.get_blocking(fd) for fd in (in_w, out_r, err_r, ctl)] == [False] * 4
    assert fcntl.fcntl(out_r, fcntl.F_GETPIPE_SZ) == 1 << 20
    assert fcntl.fcntl(err_r, fcntl.F_GETPIPE_SZ) == 1 << 20
    os.set_blocking(in_w, True)
    os.write(in_w, stdin)
    os.close(in_w)
    out, err = _read_all(out_r), _read_all(err_r)
    os.set_blocking(ctl, True)
    select.select([ctl], [], [], 10)
    rc = os.read(ctl, 16)
    _, status = os.waitpid(prep.pid, 0)
    for fd in (pidfd, out_r, err_r, ctl):
        os.close(fd)
    return out, err, rc, status


def test_the_job_runs_dropped_limited_and_detached(monkeypatch, tmp_path) -> None:
    env = dict(os.environ, T53="yes")  # (MUTANT_UNDER_TEST kept: mutmut's trampolines read it)
    job = Job(python=[(PROBE % 5, "main.py")], env=env)
    lim = Limits(uid=65534, gid=65533, cpu_s=5, fsize=1 << 20, nofile=128, output=0, cpus=2.5)
    out, err, rc, status = _run(monkeypatch, tmp_path, job, lim, b"some input")
    assert rc == (5).to_bytes(4, "big")
    assert os.waitstatus_to_exitcode(status) == 5
    assert err == b"to-err\n"
    facts = json.loads(out)
    assert facts["res_uid"] == [65534] * 3 and facts["res_gid"] == [65533] * 3
    assert facts["groups"] == []
    assert facts["core"] == [0, 0]
    assert facts["fsize"] == [1 << 20, 1 << 20] and facts["nofile"] == [128, 128]
    assert facts["cpu"] == [5, 6]
    assert facts["oom"] == "1000"
    assert facts["sid_is_pid"] and facts["pgrp_is_pid"]
    assert facts["fds"] == [0, 1, 2, 3, 900]  # (3: listdir's own)
    assert facts["status_cloexec"] is True
    assert facts["cwd"] == str(tmp_path)
    assert facts["cgroup_ns"] != os.readlink("/proc/self/ns/cgroup")
    assert facts["nnp"] == "1" and facts["pdeathsig"] == 9
    assert facts["ncpu"] == 3  # ceil(2.5)
    assert facts["env"] == "yes" and facts["argv"] == ["main.py"] and facts["name"] == "__main__"
    assert facts["sigint"] and facts["sigpipe"]
    assert facts["stdin"] == "some input"


def test_limits_the_job_does_not_lower_stay_the_sandboxs(monkeypatch, tmp_path) -> None:
    env = dict(os.environ)
    big = Limits(uid=65534, gid=65533, cpu_s=9, fsize=1 << 40, nofile=4096, output=0, cpus=1.0)
    pad = "#" + "x" * 70000 + "\n"  # a job of more than 60000 bytes: written in pieces
    job = Job(python=[(pad + PROBE % 0, "big.py")], env=env)
    out, err, rc, _ = _run(monkeypatch, tmp_path, job, big)
    assert err == b"to-err\n"
    assert rc == bytes(4)
    facts = json.loads(out)
    assert facts["fsize"] == [1 << 30, 1 << 30] and facts["nofile"] == [1024, 1024]  # the smaller
    assert facts["cpu"] == [9, 10] and facts["ncpu"] == 1 and facts["argv"] == ["big.py"]
    assert facts["env"] is None


def test_only_fsize_lowered_still_sets_both(monkeypatch, tmp_path) -> None:
    env = dict(os.environ)
    lim = Limits(uid=65534, gid=65533, cpu_s=4, fsize=1 << 25, nofile=1024, output=0, cpus=1.0)
    job = Job(python=[(PROBE % 0, "m.py")], env=env)
    out, *_ = _run(monkeypatch, tmp_path, job, lim)
    facts = json.loads(out)
    assert facts["fsize"] == [1 << 25, 1 << 25] and facts["nofile"] == [1024, 1024]
    lim = Limits(uid=65534, gid=65533, cpu_s=4, fsize=1 << 30, nofile=64, output=0, cpus=1.0)
    out, *_ = _run(monkeypatch, tmp_path, Job(python=[(PROBE % 0, "m.py")], env=env), lim)
    assert json.loads(out)["nofile"] == [64, 64]


def test_an_argv_job_is_executed(monkeypatch, tmp_path) -> None:
    _std_on_fds(monkeypatch)
    monkeypatch.setattr(child, "CWD", str(tmp_path))
    prep = prepared.prepare(BASE)
    job = Job(argv=["/bin/sh", "-c", "echo $T53 $(id -u) $(id -g); exit 3"], env={"T53": "sh"})
    pidfd, in_w, out_r, err_r, ctl = prep.hand_over(job, BASE)
    os.close(in_w)
    assert _read_all(out_r) == b"sh 65534 65533\n"
    _, status = os.waitpid(prep.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 3
    for fd in (pidfd, out_r, err_r, ctl):
        os.close(fd)


def test_a_prepared_child_that_cannot_set_up_exits_0_and_hand_over_says_none(
    monkeypatch, tmp_path
) -> None:
    monkeypatch.setattr(child, "CWD", str(tmp_path / "absent"))  # chdir fails in the child
    killed = []
    real = child.killpg
    monkeypatch.setattr(child, "killpg", lambda pid: killed.append(pid) or real(pid))
    prep = prepared.prepare(BASE)
    _, status = os.waitpid(prep.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    job = Job(python=[("print(1)", "m.py")], env={})
    assert prep.hand_over(job, BASE) is None
    assert killed == [prep.pid] and job.pid == 0
    for fd in (prep.ctl, *prep.fds):
        with pytest.raises(OSError):
            os.fstat(fd)


def test_read_exact_reads_in_pieces_and_says_eof() -> None:
    r, w = os.pipe()
    os.write(w, b"abc")
    assert prepared._read_exact(r, 2) == b"ab"
    assert prepared._read_exact(r, 0) == b""
    os.write(w, b"de")
    os.close(w)
    assert prepared._read_exact(r, 3) == b"cde"
    with pytest.raises(EOFError):
        prepared._read_exact(r, 1)
    os.close(r)


def test_read_exact_joins_short_reads(monkeypatch) -> None:
    parts = [b"a", b"bc", b"d"]
    asked = []

    def read(fd, n):
        asked.append(n)
        return parts.pop(0)

    monkeypatch.setattr(prepared.os, "read", read)
    assert prepared._read_exact(7, 4) == b"abcd"
    assert asked == [4, 3, 1]


def test_warm_child_runs_quietly(capsys) -> None:
    prepared.warm_child()
    assert capsys.readouterr() == ("", "")


def test_the_hand_over_message(monkeypatch) -> None:
    r, w = os.pipe()
    sent = []
    real_write = os.write

    def write(fd, data):
        sent.append(bytes(data))
        return real_write(fd, data)

    monkeypatch.setattr(prepared.os, "write", write)
    monkeypatch.setattr(prepared.os, "pidfd_open", lambda pid: 77)
    monkeypatch.setattr(prepared.os, "set_blocking", lambda fd, b: None)
    a, b, c = os.pipe()[0], 11, 12
    prep = prepared.Prepared(os.getpid(), w, (a, b, c))
    job = Job(python=[("x" * 100000, "f")], env={"A": "1"})
    lim = Limits(uid=1, gid=2, cpu_s=3, fsize=4, nofile=5, output=6, cpus=7.5)
    import marshal
    import threading

    got = []
    t = threading.Thread(target=lambda: got.append(_read_all_n(r)))
    t.start()
    assert prepared._hand_over(job, lim, prep) == (77, a, b, c, w)
    os.close(w)
    t.join()
    data = got[0]
    n = int.from_bytes(data[:4], "big")
    assert marshal.loads(data[4:]) == {
        "argv": None,
        "python": [("x" * 100000, "f")],
        "env": {"A": "1"},
        "cpu_s": 3,
        "fsize": 4,
        "nofile": 5,
        "cpus": 7.5,
    }
    assert n == len(data) - 4
    assert len(sent[0]) == 4 + 60000  # the header and the first 60000 bytes at once
    os.close(r)
    os.close(a)


def _read_all_n(fd: int) -> bytes:
    buf = b""
    while True:
        b = os.read(fd, 1 << 16)
        if not b:
            return buf
        buf += b


def test_prepare_makes_its_ends_close_on_exec_where_python_does() -> None:
    # (what the init keeps: four ends of ours, none inheritable by the code it execs)
    prep = prepared.prepare(BASE)  # the child cannot chdir to /workdir here: it exits 0
    try:
        assert [os.get_inheritable(fd) for fd in (prep.ctl, *prep.fds)] == [False] * 4
        assert os.readlink(f"/proc/self/fd/{prep.ctl}").startswith("socket:")
        for fd in prep.fds:
            assert os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
        assert fcntl.fcntl(prep.fds[0], fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY
        assert fcntl.fcntl(prep.fds[1], fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
    finally:
        os.waitpid(prep.pid, 0)
        for fd in (prep.ctl, *prep.fds):
            os.close(fd)


def test_a_prepared_child_takes_its_job_with_few_open_files(monkeypatch, tmp_path) -> None:
    """With `max_open_files` below 900 (here 256) the prepared child still takes its job: its
    status socket goes below the open-files limit (it exited before, and every action fell back
    to a fork on demand)."""
    few = Limits(uid=65534, gid=65533, cpu_s=7, fsize=1 << 30, nofile=256, output=0, cpus=1.0)
    _std_on_fds(monkeypatch)
    monkeypatch.setattr(child, "CWD", str(tmp_path))
    os.chmod(tmp_path, 0o755)
    prep = prepared.prepare(few)
    got = prep.hand_over(Job(python=[("print('ran')", "m.py")], env=dict(os.environ)), few)
    assert got is not None
    pidfd, in_w, out_r, err_r, ctl = got
    os.close(in_w)
    out = _read_all(out_r)
    os.waitpid(prep.pid, 0)
    for fd in (pidfd, out_r, err_r, ctl):
        os.close(fd)
    assert out == b"ran\n"


def test_prepare_returns_in_the_parent_only() -> None:
    # (in a process of its own: were the two sides swapped, this process would run the child's
    # set-up, fail it and `_exit(0)`, which a test in the test process cannot see)
    import subprocess
    import sys

    code = (
        "import os\nfrom arl_tangram.managers.cpu.sandbox import prepared\n"
        "from arl_tangram.managers.cpu.sandbox.child import Limits\n"
        "p = prepared.prepare(Limits(uid=65534, gid=65533, cpu_s=7, fsize=1 << 30, nofile=1024,"
        " output=0))\n"
        "print('parent', p.pid != os.getpid() and p.pid > 0, flush=True)\n"
        "os.waitpid(p.pid, 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout == "parent True\n", out.stderr[-2000:]
