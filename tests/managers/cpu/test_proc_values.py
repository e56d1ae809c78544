"""Exact values of a sandbox's job driver (`sandbox/proc.py`, issue 43), run from the test
process itself (its children are forks of it, so a mutant of `proc` or `child` runs there too):
exit codes and signals, the output cap's edge per stream, stdin fed in pieces, the job's own
time limit and the action's deadline, parallel jobs, stop on failure, descendants that hold the
pipes, a prepared first job, and a child that cannot start."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import sys
import time
from types import SimpleNamespace

import pytest

from arl_tangram.managers.cpu.sandbox import child, prepared, proc
from arl_tangram.managers.cpu.sandbox.child import Job, Limits

pytestmark = [pytest.mark.needs_root, pytest.mark.own_process]  # (tests/conftest.py)


def _lim(output: int = 100) -> Limits:
    return Limits(
        uid=65534, gid=65533, cpu_s=10, fsize=1 << 20, nofile=1024, output=output, cpus=1.0
    )


@pytest.fixture
def here(monkeypatch, tmp_path):
    os.chmod(tmp_path, 0o755)
    monkeypatch.setattr(child, "CWD", str(tmp_path))
    monkeypatch.setattr(child, "FAST", None)
    return tmp_path


def _std(monkeypatch) -> None:
    """sys.std* on fds 0-2 in the children (pytest's capture files are fds a child closes; set
    in the test's body: pytest sets its own again after set-up)."""
    monkeypatch.setattr(sys, "stdin", open(0, closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))  # noqa: SIM115


def _py(src: str, **kw) -> Job:
    return Job(python=[(src, "main.py")], env=dict(os.environ), **kw)


def test_a_job_runs_to_its_exit_code_with_its_output(monkeypatch, here) -> None:
    _std(monkeypatch)
    d = proc.Driver(_lim())
    assert (d.parallel, d.prepared, d.deadline, d.cut, d.live) == (1, None, float("inf"), False, {})
    j = _py("import os, sys\nprint('out', os.getuid())\nprint('err', file=sys.stderr)\nsys.exit(3)")
    t0 = time.monotonic()
    d.run([j])
    assert j.done and j.status == "Finished" and j.return_code == 3
    assert bytes(j.out) == b"out 65534\n" and bytes(j.err) == b"err\n" and not j.truncated
    assert j.pid > 0 and t0 <= j.started and 0 < j.elapsed < 5
    assert round(j.elapsed, 6) == j.elapsed
    assert d.live == {} and d.cut is False
    assert j.result() == {
        "status": "Finished",
        "execution_time": j.elapsed,
        "return_code": 3,
        "stdout": "out 65534\n",
        "stderr": "err\n",
        "truncated": False,
    }
    with pytest.raises((ValueError, RuntimeError, KeyError, OSError, AttributeError, TypeError)):
        d.sel.register(0, 1)  # the selector is closed


def test_parallel_is_at_least_one() -> None:
    assert proc.Driver(_lim(), parallel=0).parallel == 1
    assert proc.Driver(_lim(), parallel=-2).parallel == 1
    assert proc.Driver(_lim(), parallel=3).parallel == 3


def test_a_signal_is_a_negative_code(monkeypatch, here) -> None:
    _std(monkeypatch)
    j = _py("import os\nos.kill(os.getpid(), 9)")
    proc.Driver(_lim()).run([j])
    assert (j.status, j.return_code) == ("Finished", -9)


def test_an_argv_job(monkeypatch, here) -> None:
    j = Job(argv=["/bin/sh", "-c", "echo a; echo b >&2; exit 4"], env={})
    proc.Driver(_lim()).run([j])
    assert (bytes(j.out), bytes(j.err), j.return_code, j.status) == (b"a\n", b"b\n", 4, "Finished")


@pytest.mark.parametrize(("n", "out", "cut"), [(9, 10, False), (10, 10, True), (300_000, 10, True)])
def test_the_output_cap_is_per_stream(monkeypatch, here, n: int, out: int, cut: bool) -> None:
    _std(monkeypatch)
    j = _py(f"import sys\nprint('x' * {n})\nprint('y' * {n}, file=sys.stderr)")
    proc.Driver(_lim(10)).run([j])
    assert bytes(j.out) == (b"x" * n + b"\n")[:out] and bytes(j.err) == (b"y" * n + b"\n")[:out]
    assert j.truncated is cut and j.return_code == 0


def test_stdin_is_fed_in_pieces(monkeypatch, here) -> None:
    _std(monkeypatch)
    data = os.urandom(300_000)
    j = _py(
        "import hashlib, sys\nb = sys.stdin.buffer.read()\nprint(len(b), hashlib.sha256(b).hexdigest())",
        stdin=data,
    )
    proc.Driver(_lim(200)).run([j])
    assert bytes(j.out) == f"{len(data)} {hashlib.sha256(data).hexdigest()}\n".encode()


def test_stdin_to_a_child_that_does_not_read(monkeypatch, here) -> None:
    _std(monkeypatch)
    j = _py("print('bye')", stdin=b"z" * 300_000)
    t0 = time.monotonic()
    proc.Driver(_lim()).run([j])
    assert (bytes(j.out), j.return_code, j.status) == (b"bye\n", 0, "Finished")
    assert time.monotonic() - t0 < 5


def test_no_stdin_is_an_eof(monkeypatch, here) -> None:
    _std(monkeypatch)
    j = _py("import sys\nprint(repr(sys.stdin.read()))")
    proc.Driver(_lim()).run([j])
    assert bytes(j.out) == b"''\n"


def test_a_job_past_its_own_time_is_killed(monkeypatch, here) -> None:
    _std(monkeypatch)
    j = _py("import time\nprint('started', flush=True)\ntime.sleep(30)", timeout=0.4)
    d = proc.Driver(_lim())
    t0 = time.monotonic()
    d.run([j])
    took = time.monotonic() - t0
    assert j.status == "TimeLimitExceeded" and j.return_code == -9 and j.done
    assert bytes(j.out) == b"started\n"
    assert 0.4 <= took < 3 and 0.4 <= j.elapsed < 3
    assert d.cut is False  # its own limit, not the action's


def test_the_deadline_kills_the_live_job_and_leaves_the_rest(monkeypatch, here) -> None:
    _std(monkeypatch)
    a, b = _py("import time\ntime.sleep(30)"), _py("print(1)")
    d = proc.Driver(_lim(), deadline=time.monotonic() + 0.4)
    d.run([a, b])
    assert a.status == "TimeLimitExceeded" and a.return_code == -9 and a.done
    assert b.done is False and b.status == "" and b.pid == 0
    assert d.cut is True and d.live == {}


def test_a_deadline_already_past_starts_nothing(monkeypatch, here) -> None:
    a = _py("print(1)")
    d = proc.Driver(_lim(), deadline=time.monotonic() - 1)
    d.run([a])
    assert d.cut is True and a.done is False and a.pid == 0


def test_a_job_ending_before_the_deadline_is_not_cut(monkeypatch, here) -> None:
    _std(monkeypatch)
    a = _py("print(1)", timeout=30)
    d = proc.Driver(_lim(), deadline=time.monotonic() + 20)
    d.run([a])
    assert d.cut is False and a.status == "Finished"


def test_parallel_jobs_overlap_and_serial_ones_do_not(monkeypatch, here) -> None:
    _std(monkeypatch)
    src = "import time\ntime.sleep(0.4)\nprint('done')"
    jobs = [_py(src) for _ in range(3)]
    t0 = time.monotonic()
    proc.Driver(_lim(), parallel=3).run(jobs)
    par = time.monotonic() - t0
    assert [bytes(j.out) for j in jobs] == [b"done\n"] * 3
    jobs = [_py(src) for _ in range(3)]
    t0 = time.monotonic()
    proc.Driver(_lim(), parallel=1).run(jobs)
    ser = time.monotonic() - t0
    assert par < 1.1 <= ser, (par, ser)
    starts = sorted(j.started for j in jobs)
    assert starts[1] - starts[0] >= 0.4 and starts[2] - starts[1] >= 0.4


def test_stop_on_failure_skips_the_rest(monkeypatch, here) -> None:
    _std(monkeypatch)
    fail, ok = _py("import sys\nsys.exit(1)"), _py("print(1)")
    seen = []

    def stop(job):
        seen.append(job)
        return job.return_code != 0

    proc.Driver(_lim()).run([fail, ok], stop)
    assert seen == [fail] and fail.return_code == 1 and fail.status == "Finished"
    assert ok.done is False and ok.pid == 0
    # a job still running when another fails is killed as skipped
    slow, fail = _py("import time\ntime.sleep(30)"), _py("import sys\nsys.exit(2)")
    t0 = time.monotonic()
    proc.Driver(_lim(), parallel=2).run([slow, fail], stop)
    assert time.monotonic() - t0 < 5
    assert (slow.status, slow.return_code, slow.done) == ("Skipped", -9, True)
    assert (fail.status, fail.return_code) == ("Finished", 2)


def test_an_error_in_the_rule_kills_the_live_jobs_and_propagates(monkeypatch, here) -> None:
    _std(monkeypatch)
    slow, quick = _py("import time\ntime.sleep(30)"), _py("print(1)")

    def stop(job):
        raise LookupError("the rule broke")

    d = proc.Driver(_lim(), parallel=2)
    t0 = time.monotonic()
    with pytest.raises(LookupError, match="the rule broke"):
        d.run([slow, quick], stop)
    assert time.monotonic() - t0 < 5
    # the finally kills what is still running, with no status of its own
    assert (slow.status, slow.return_code, slow.done) == ("Finished", -9, True)
    assert (quick.status, quick.return_code, bytes(quick.out)) == ("Finished", 0, b"1\n")
    assert d.live == {}


def test_no_stop_without_a_rule(monkeypatch, here) -> None:
    _std(monkeypatch)
    fail, ok = _py("import sys\nsys.exit(1)"), _py("print(1)")
    proc.Driver(_lim()).run([fail, ok])
    assert fail.return_code == 1 and ok.return_code == 0 and bytes(ok.out) == b"1\n"


def test_descendants_holding_the_pipes_are_killed_after_the_grace(monkeypatch, here) -> None:
    from arl_tangram.managers.cpu import _linux

    # (the killed grandchild is an orphan: reaped here, as a sandbox's init reaps it, not by
    # whatever subreaper runs the tests, mutmut's runner for one, which takes it for its own)
    _linux.prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    try:
        j = Job(argv=["/bin/sh", "-c", "echo hi; sleep 30 & exit 0"], env={})
        t0 = time.monotonic()
        proc.Driver(_lim()).run([j])
        assert time.monotonic() - t0 < 3
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.01)
    finally:
        _linux.prctl(36, 0)
    assert (bytes(j.out), j.return_code, j.status) == (b"hi\n", 0, "Finished")
    assert proc._GRACE_S == 0.05 and proc._LAZY_S == 0.005


def test_a_child_that_cannot_start_says_why_and_exits_127(monkeypatch, here) -> None:
    monkeypatch.setattr(child, "CWD", "/nonexistent-t53")
    j = _py("print(1)")
    proc.Driver(_lim(1000)).run([j])
    assert j.return_code == 127 and bytes(j.out) == b""
    assert (
        bytes(j.err)
        == b"sandbox: cannot start: [Errno 2] No such file or directory: '/nonexistent-t53'\n"
    )


def test_spawn_returns_nonblocking_ends(monkeypatch, here) -> None:
    j = Job(argv=["/bin/sh", "-c", "cat; echo done"], env={})
    t0 = time.monotonic()
    pidfd, in_w, out_r, err_r = proc._spawn(j, _lim())
    assert t0 <= j.started <= time.monotonic() and j.pid > 0
    assert [os.get_blocking(fd) for fd in (in_w, out_r, err_r)] == [False] * 3
    os.write(in_w, b"ab")
    os.close(in_w)
    os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
    os.set_blocking(out_r, True)
    assert os.read(out_r, 100) == b"abdone\n"
    for fd in (pidfd, out_r, err_r):
        os.close(fd)


def test_a_prepared_first_job_reports_through_its_socket(monkeypatch, here) -> None:
    _std(monkeypatch)
    lim = _lim(1000)
    prep = prepared.prepare(lim)
    d = proc.Driver(lim, prepared=prep)
    a = _py("import os, sys\nprint('first', os.getpid())\nprint('e', file=sys.stderr)\nsys.exit(5)")
    b = _py("print('second')", stdin=b"in")
    d.run([a, b])
    assert d.prepared is None
    assert a.pid == prep.pid and bytes(a.out) == f"first {prep.pid}\n".encode()
    assert (bytes(a.err), a.return_code, a.status) == (b"e\n", 5, "Finished")
    assert b.pid != prep.pid and (bytes(b.out), b.return_code) == (b"second\n", 0)
    assert round(a.elapsed, 6) == a.elapsed and a.elapsed < 5


def test_a_prepared_job_with_much_output_and_a_time_limit(monkeypatch, here) -> None:
    _std(monkeypatch)
    lim = _lim(1 << 20)
    d = proc.Driver(lim, prepared=prepared.prepare(lim))
    a = _py(
        "import sys\nsys.stdout.write('z' * 500000)\nsys.stdout.flush()\nimport time\ntime.sleep(30)",
        timeout=0.5,
    )
    d.run([a])
    assert a.status == "TimeLimitExceeded" and bytes(a.out) == b"z" * 500000 and a.return_code == -9


def test_a_prepared_child_gone_falls_back_to_a_fork(monkeypatch, here) -> None:
    _std(monkeypatch)
    monkeypatch.setattr(child, "CWD", "/nonexistent-t53")
    lim = _lim(1000)
    prep = prepared.prepare(lim)  # exits 0: it cannot chdir
    os.waitpid(prep.pid, 0)
    monkeypatch.setattr(child, "CWD", str(here))
    a = _py("print('forked')")
    d = proc.Driver(lim, prepared=prep)
    d.run([a])
    assert a.pid != prep.pid and bytes(a.out) == b"forked\n" and a.return_code == 0


def test_status_of_a_short_or_empty_report(monkeypatch) -> None:
    d = proc.Driver(_lim())
    r, w = os.pipe()
    os.set_blocking(r, False)
    st = {"ctl": r, "rc": b""}
    d._status(st)  # nothing there yet
    assert st == {"ctl": r, "rc": b""}
    os.write(w, b"\0\0")
    d._status(st)
    assert st["rc"] == b"\0\0" and st["ctl"] == r
    os.write(w, b"\0\7\1\2\3\4\5\6\7")
    d._status(st)
    assert st["rc"] == b"\0\0\0\7\1\2\3\4\5\6" and st["ctl"] == -1  # 8 bytes read: enough
    r, w = os.pipe()
    os.close(w)
    st = {"ctl": r, "rc": b"\1"}
    d._status(st)
    assert st == {"ctl": -1, "rc": b"\1"}
    with pytest.raises(OSError):
        os.fstat(r)
    d.sel.close()


def test_read_returns_the_chunk_size(monkeypatch) -> None:
    d = proc.Driver(_lim(5))
    r, w = os.pipe()
    os.set_blocking(r, False)
    j = Job()
    st = {"job": j, "open": {r}}
    assert d._read(st, r, "out") == 0  # nothing yet
    os.write(w, b"abcdefgh")
    assert d._read(st, r, "err") == 8
    assert bytes(j.err) == b"abcde" and j.truncated and bytes(j.out) == b""
    os.write(w, b"ij")
    assert d._read(st, r, "err") == 2 and bytes(j.err) == b"abcde"
    os.close(w)
    assert d._read(st, r, "err") == 0 and st["open"] == set()
    with pytest.raises(OSError):
        os.fstat(r)
    fd = os.open("/", os.O_RDONLY)  # a read that fails (EISDIR): an end of file, nothing added
    st["open"] = {fd}
    assert d._read(st, fd, "out") == 0 and st["open"] == set() and bytes(j.out) == b""
    with pytest.raises(OSError):
        os.fstat(fd)
    d.sel.close()


def test_wake_time(monkeypatch) -> None:
    d = proc.Driver(_lim())
    assert d._wake_time({"exited_at": 10.0, "deadline": 1.0, "lazy_until": 0.5}) == 10.05
    assert d._wake_time({"exited_at": None, "deadline": 7.0, "lazy_until": 3.0}) == 3.0
    assert d._wake_time({"exited_at": None, "deadline": 2.0, "lazy_until": 3.0}) == 2.0
    assert d._wake_time({"exited_at": None, "deadline": 7.0, "lazy_until": 0.0}) == 7.0
    d.sel.close()


def test_status_of_an_unreadable_or_an_exact_report(tmp_path) -> None:
    d = proc.Driver(_lim())
    fd = os.open(tmp_path, os.O_RDONLY)  # read(2) of a directory: EISDIR, an OSError
    st = {"ctl": fd, "rc": b"\0"}
    d._status(st)
    assert st == {"ctl": -1, "rc": b"\0"}  # nothing added, and the end closed
    with pytest.raises(OSError):
        os.fstat(fd)
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.write(w, b"\0\0\0\5")  # exactly the 4 bytes of a code: enough, the end closed
    st = {"ctl": r, "rc": b""}
    d._status(st)
    assert st == {"ctl": -1, "rc": b"\0\0\0\5"}
    os.close(w)
    d.sel.close()


def _sleeper() -> int:
    """A child in a process group of its own, sleeping (the driver kills its group)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)
            time.sleep(30)
        finally:
            os._exit(0)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)
    return pid


def test_reap_of_a_child_reaped_elsewhere_is_a_zero_exit() -> None:
    d = proc.Driver(_lim())
    pid = os.fork()
    if pid == 0:
        os._exit(9)
    pidfd = os.pidfd_open(pid)
    os.waitpid(pid, 0)  # reaped here: the driver's wait4 finds no such child
    j = Job(pid=pid, started=time.monotonic())
    st = {"job": j, "pidfd": pidfd, "lazy_until": 0.0, "exited_at": None}
    d.sel.register(pidfd, 1, (st, "exit"))
    d._reap(st)
    assert (j.return_code, j.status, st["pidfd"]) == (0, "Finished", -1)
    assert st["exited_at"] is not None and 0 <= j.elapsed < 5
    with pytest.raises(OSError):
        os.fstat(pidfd)
    d.sel.close()


def test_a_reported_exit_code_finishes_the_job() -> None:
    d = proc.Driver(_lim(1 << 20))
    pid = _sleeper()
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    fcntl.fcntl(out_w, 1031, 1 << 18)  # F_SETPIPE_SZ: room for more than one 64 KiB chunk
    os.write(out_w, b"o" * 200000)  # all read before the job is done: 3 full chunks and the rest
    os.write(err_w, b"e")
    os.close(out_w)
    os.close(err_w)
    for fd in (out_r, err_r):
        os.set_blocking(fd, False)
    j = Job(pid=pid, started=time.monotonic())
    pidfd = os.pidfd_open(pid)
    st = {
        "job": j,
        "pidfd": pidfd,
        "rc": b"\0\0\1\3",
        "open": {out_r, err_r},
        "out": out_r,
        "err": err_r,
        "in": -1,
        "ctl": -1,
        "exited_at": None,
    }
    d.live[pid] = st
    d.sel.register(pidfd, 1, (st, "exit"))
    d._reported(st)
    assert st["pidfd"] == -1 and d.sel.get_map() is not None and len(d.sel.get_map()) == 0
    with pytest.raises(OSError):
        os.fstat(pidfd)
    assert (j.return_code, j.status, j.done) == (259, "Finished", True)
    assert (bytes(j.out), bytes(j.err), j.truncated) == (b"o" * 200000, b"e", False)
    assert isinstance(j.elapsed, float) and 0 <= j.elapsed < 5 and round(j.elapsed, 6) == j.elapsed
    assert st["open"] == set() and st["exited_at"] is not None and d.live == {}
    assert os.waitpid(pid, 0)[1] == 9  # its process group killed (SIGKILL)
    d.sel.close()


def test_read_fills_the_last_byte_of_room() -> None:
    d = proc.Driver(_lim(5))
    r, w = os.pipe()
    os.set_blocking(r, False)
    j = Job()
    st = {"job": j, "open": {r}}
    os.write(w, b"abcd")
    assert d._read(st, r, "out") == 4 and not j.truncated
    os.write(w, b"ef")
    assert d._read(st, r, "out") == 2 and bytes(j.out) == b"abcde" and j.truncated
    os.close(w)
    os.close(r)
    d.sel.close()


def test_a_time_limit_kill_overrides_an_earlier_status() -> None:
    d = proc.Driver(_lim())
    pid = _sleeper()
    j = Job(pid=pid, started=time.monotonic(), status="Skipped")
    st = {"job": j, "pidfd": -1, "open": set(), "in": -1, "ctl": -1}
    d.live[pid] = st
    d._kill(st, "TimeLimitExceeded")
    assert (j.status, j.done, d.live) == ("TimeLimitExceeded", True, {})
    assert os.waitpid(pid, 0)[1] == 9
    d.sel.close()


def test_output_of_a_descendant_within_the_grace_is_kept(monkeypatch, here) -> None:
    _std(monkeypatch)
    # the child exits at once; a grandchild in a session of its own (not killed with the
    # child's group) writes 0.2 s later, within the grace (2 s here, not 50 ms: no race on a
    # loaded machine), and exits
    monkeypatch.setattr(proc, "_GRACE_S", 2.0)
    # (the child exits only once the grandchild has left its process group: else the group's
    # kill at the child's exit could come first, and nothing would be written)
    src = (
        "import os, time\n"
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    os.write(w, b'x')\n"
        "    time.sleep(0.2)\n"
        "    os.write(1, b'late')\n"
        "    os._exit(0)\n"
        "os.read(r, 1)\n"
        "os._exit(0)"
    )
    j = _py(src)
    from arl_tangram.managers.cpu import _linux

    _linux.prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: the orphan reaped here (as in the test above)
    try:
        proc.Driver(_lim()).run([j])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.01)
    finally:
        _linux.prctl(36, 0)
    assert (j.return_code, bytes(j.out)) == (0, b"late")


def test_finish_closes_an_unfed_stdin() -> None:
    d = proc.Driver(_lim())
    r, w = os.pipe()
    j = Job(pid=12345678)
    st = {"job": j, "open": set(), "in": w, "ctl": -1}
    d.live[j.pid] = st
    d._finish(st)
    assert (st["in"], j.status, j.done, d.live) == (-1, "Finished", True, {})
    with pytest.raises(OSError):
        os.fstat(w)
    os.close(r)
    d.sel.close()


def test_reap_of_a_lazy_child_watches_its_pipes() -> None:
    d = proc.Driver(_lim())
    pid = os.fork()
    if pid == 0:
        os._exit(3)
    pidfd = os.pidfd_open(pid)
    os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOWAIT)
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    j = Job(pid=pid, started=time.monotonic())
    st = {"job": j, "pidfd": pidfd, "lazy_until": time.monotonic() + 60, "exited_at": None}
    st.update({"open": {out_r, err_r}, "out": out_r, "err": err_r})
    d.sel.register(pidfd, 1, (st, "exit"))
    d._reap(st)
    assert (j.return_code, j.status, st["lazy_until"], st["pidfd"]) == (3, "Finished", 0.0, -1)
    assert d.sel.get_key(out_r).data == (st, "out") and d.sel.get_key(err_r).data == (st, "err")
    for fd in (out_r, out_w, err_r, err_w):
        os.close(fd)
    d.sel.close()


def test_a_step_finishes_a_reported_job_before_its_deadline_kills_it() -> None:
    d = proc.Driver(_lim())
    pid = _sleeper()
    j = Job(pid=pid, started=time.monotonic())
    st = {"job": j, "pidfd": -1, "rc": b"\0\0\0\4", "open": set(), "out": -1, "err": -1}
    st.update({"in": -1, "ctl": -1, "exited_at": None, "lazy_until": 0.0})
    st["deadline"] = time.monotonic() + 0.05  # past by the time the step looks
    d.live[pid] = st
    assert d._step() == [j]
    assert (j.status, j.return_code, j.done, d.live) == ("Finished", 4, True, {})
    assert os.waitpid(pid, 0)[1] == 9
    d.sel.close()


def test_a_kill_keeps_a_status_already_given() -> None:
    d = proc.Driver(_lim())
    pid = _sleeper()
    j = Job(pid=pid, started=time.monotonic(), status="Finished")
    st = {"job": j, "pidfd": -1, "open": set(), "in": -1, "ctl": -1}
    d.live[pid] = st
    d._kill(st, "Skipped")
    assert (j.status, j.done) == ("Finished", True)
    assert os.waitpid(pid, 0)[1] == 9
    d.sel.close()


def test_feeding_a_closed_stdin_drops_the_rest() -> None:
    d = proc.Driver(_lim())
    r, w = os.pipe()
    os.close(r)  # the child closed its stdin: the write fails (EPIPE)
    st = {"stdin": memoryview(b"abc"), "in": w}
    d.sel.register(w, 2, (st, "in"))
    d._feed(st)
    assert (bytes(st["stdin"]), st["in"], len(d.sel.get_map())) == (b"", -1, 0)
    with pytest.raises(OSError):
        os.fstat(w)
    d.sel.close()


def test_a_descendant_holding_the_pipes_does_not_hold_the_job(monkeypatch, here) -> None:
    _std(monkeypatch)
    # a grandchild in a session of its own (not killed with the child's group) keeps stdout
    # open: the job is done after the grace, not when the grandchild goes
    src = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    os.write(1, b'%d' % os.getpid())\n"
        "    time.sleep(30)\n"
        "    os._exit(0)\n"
        "time.sleep(0.2)\n"
        "os._exit(0)"
    )
    j = _py(src)
    from arl_tangram.managers.cpu import _linux

    _linux.prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: the orphan reaped here
    try:
        t0 = time.monotonic()
        proc.Driver(_lim()).run([j])
        took = time.monotonic() - t0
        os.kill(int(bytes(j.out)), 9)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.01)
    finally:
        _linux.prctl(36, 0)
    assert j.return_code == 0 and took < 5


def test_finish_unregisters_every_fd_it_closes() -> None:
    # (a number left in the selector's map after its close would be refused when a later job's
    # pipe reuses it: "already registered")
    d = proc.Driver(_lim())
    (out_r, out_w), (err_r, err_w), (in_r, in_w) = os.pipe(), os.pipe(), os.pipe()
    j = Job(pid=12345679)
    st = {"job": j, "open": {out_r, err_r}, "out": out_r, "err": err_r, "in": in_w, "ctl": -1}
    d.sel.register(out_r, 1, (st, "out"))
    d.sel.register(err_r, 1, (st, "err"))
    d.sel.register(in_w, 2, (st, "in"))
    d.live[j.pid] = st
    d._finish(st)
    assert (len(d.sel.get_map()), st["open"], st["in"], j.done, d.live) == (0, set(), -1, True, {})
    for fd in (out_r, err_r, in_w):
        with pytest.raises(OSError):
            os.fstat(fd)
    for fd in (out_w, err_w, in_r):
        os.close(fd)
    d.sel.close()


def test_a_step_at_the_action_deadline_exactly_kills_and_cuts(monkeypatch) -> None:
    # the clock stands at the deadline: the job's deadline is reached (>=), and it is the
    # action's, so the run is cut even with no job left to start
    monkeypatch.setattr(proc, "time", SimpleNamespace(monotonic=lambda: 100.0))
    d = proc.Driver(_lim(), deadline=100.0)
    pid = _sleeper()
    j = Job(pid=pid, started=99.0, timeout=10.0)
    st = {"job": j, "pidfd": -1, "rc": b"", "open": set(), "out": -1, "err": -1}
    st.update({"in": -1, "ctl": -1, "exited_at": None, "lazy_until": 0.0, "deadline": 100.0})
    d.live[pid] = st
    assert d._step() == [j]
    assert (j.status, j.done, d.cut, d.live) == ("TimeLimitExceeded", True, True, {})
    assert os.waitpid(pid, 0)[1] == 9
    d.sel.close()


def test_a_deadline_reached_exactly_starts_nothing(monkeypatch, here) -> None:
    _std(monkeypatch)
    monkeypatch.setattr(proc, "time", SimpleNamespace(monotonic=lambda: 100.0))
    a = _py("print(1)")
    d = proc.Driver(_lim(), deadline=100.0)
    d.run([a])
    assert (d.cut, a.done, a.pid, a.status, d.live) == (True, False, 0, "", {})


def test_a_step_at_the_end_of_the_grace_exactly_finishes_the_job(monkeypatch) -> None:
    monkeypatch.setattr(proc, "time", SimpleNamespace(monotonic=lambda: 100.5))
    monkeypatch.setattr(proc, "_GRACE_S", 0.5)
    d = proc.Driver(_lim())
    r, w = os.pipe()  # a descendant still holds the output: nothing comes
    j = Job(pid=12345680, started=99.0, status="Finished", return_code=0)
    st = {"job": j, "pidfd": -1, "rc": b"", "open": {r}, "out": r, "err": -1, "in": -1}
    st.update({"ctl": -1, "exited_at": 100.0, "lazy_until": 0.0, "deadline": 200.0})
    d.sel.register(r, 1, (st, "out"))
    d.live[j.pid] = st
    assert d._step() == [j]
    assert (j.done, st["open"], d.live, len(d.sel.get_map())) == (True, set(), {}, 0)
    os.close(w)
    d.sel.close()
