"""Exact values of a sandbox init's helpers (`sandbox/init.py`, issue 43), in the test process
with the work directory moved to a temporary one (and `_kill_all` never called outside a PID
namespace of its own): the main file's name, argv templates, output normalising, jobs built
from a request, limits, files written (modes, owners, parents), files fetched (what is refused),
the tmpfs remount's options, a run with a compile stage and cases (pass, fail, expected output,
stop on first failure, the deadline's words), the warm-up and rehearsal, and `serve` itself in
a PID namespace of its own (one-shot exit, kept ops, unknown op, errors reported)."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import socket
import sys
import time

import pytest

from arl_tangram.managers.cpu import _linux, wire
from arl_tangram.managers.cpu.sandbox import child, init
from arl_tangram.managers.cpu.sandbox.child import Limits

# (forks the test process and runs Python in the child: tests/conftest.py)
pytestmark = pytest.mark.own_process

PY = {"name": "python", "file": "main.py", "compile": None, "run": None, "inproc": True}
SH = {
    "name": "sh",
    "file": "main.sh",
    "compile": None,
    "run": ["/bin/sh", "{file}"],
    "inproc": False,
}
LIMD = {
    "uid": 65534,
    "gid": 65533,
    "cpu_s": 10,
    "fsize": 1 << 20,
    "nofile": 1024,
    "output": 1000,
    "cpus": 1.0,
}


@pytest.fixture
def wd(monkeypatch, tmp_path):
    w = tmp_path / "workdir"
    w.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(w, 0o777)
    monkeypatch.setattr(child, "WORKDIR", str(w))
    monkeypatch.setattr(child, "CWD", str(w))
    monkeypatch.setattr(child, "FAST", None)
    monkeypatch.setattr(init, "WORKDIR_SLASH", str(w) + "/")
    killed = []
    monkeypatch.setattr(init, "_kill_all", lambda: killed.append(1))
    return w


def _std(monkeypatch) -> None:
    monkeypatch.setattr(sys, "stdin", open(0, closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))  # noqa: SIM115


def test_constants() -> None:
    assert init.SANDBOX_DIR == "/sandbox" and init.INODES_PER_MB == 256
    assert init._KEPT_OPS == ("prepare", "session", "image", "keep")
    assert init.WORKDIR_SLASH == "/workdir/"


def test_main_file() -> None:
    java = {"name": "java", "file": "Main.java"}
    assert init._main_file(java, "public class Foo {}") == "Foo.java"
    assert init._main_file(java, "public  final abstract class  Bar extends X") == "Bar.java"
    assert init._main_file(java, "class Foo {}") == "Main.java"
    assert init._main_file(java, "public\nclass\tQ1_x{") == "Q1_x.java"
    assert init._main_file(PY, "public class Foo") == "main.py"


def test_argv() -> None:
    assert init._argv(["cc", "{file}", "-o", "{stem}", "{stem}.{file}"], "a.b.c") == [
        "cc",
        "a.b.c",
        "-o",
        "a.b",
        "a.b.a.b.c",
    ]
    assert init._argv(["{stem}"], "noext") == ["noext"]


def test_norm() -> None:
    assert init._norm("  a  \n b \t\n\n") == "a\n b"
    assert init._norm("x\r\ny\r\n") == "x\ny"
    assert init._norm("") == ""


def test_job_from_a_request(monkeypatch) -> None:
    monkeypatch.setattr(child, "WORKDIR", "/workdir")
    req = {"env": {"A": "1"}, "run_timeout": 2.5, "code": "print(1)"}
    j = init._job(req, PY, "main.py", "in", None)
    assert j.python == [("print(1)", "/workdir/main.py")] and j.argv is None
    assert (j.stdin, j.env, j.timeout) == (b"in", {"A": "1"}, 2.5)
    j = init._job(req, PY, "main.py", "", "assert True")
    assert j.python == [("print(1)", "/workdir/main.py"), ("assert True", "<test>")]
    j = init._job(req, SH, "main.sh", "é", None)
    assert j.argv == ["/bin/sh", "main.sh"] and j.python is None and j.stdin == "é".encode()
    assert j.timeout == 2.5


def test_limits() -> None:
    assert init._limits({"limits": LIMD}) == Limits(**LIMD)
    assert init._base_limits({"uid": 5, "gid": 6, "workdir_mb": 3, "nofile": 77}) == Limits(
        uid=5, gid=6, cpu_s=1 << 24, fsize=3 << 20, nofile=77, output=0
    )


def test_read_sample_reads_a_frame_back() -> None:
    msg = {"op": "run", "x": [1, 2.5, None, "s"]}
    before = set(os.listdir("/proc/self/fd"))
    assert init._read_sample(wire.encode_request(msg)) == msg
    assert set(os.listdir("/proc/self/fd")) == before


@pytest.mark.needs_root
def test_write_main_and_files(wd) -> None:
    init._write_main(str(wd / "m.py"), "print('é')", 4000, 4001)
    st = os.stat(wd / "m.py")
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (4000, 4001, 0o644)
    assert (wd / "m.py").read_text() == "print('é')"
    init._write_main(str(wd / "m.py"), "x", 4000, 4001)
    assert (wd / "m.py").read_text() == "x"  # truncated
    os.symlink("/etc/passwd", wd / "ln")
    with pytest.raises(OSError):
        init._write_main(str(wd / "ln"), "x", 4000, 4001)  # no following a link
    req = {
        "code": "main",
        "files": {
            "a/b/c.txt": base64.b64encode(b"deep").decode(),
            "top": base64.b64encode(b"\0\1").decode(),
        },
    }
    init._write_files(req, "sub/main.py", 4000, 4001)
    assert (wd / "sub/main.py").read_bytes() == b"main"
    assert (wd / "a/b/c.txt").read_bytes() == b"deep" and (wd / "top").read_bytes() == b"\0\1"
    for p in ("a", "a/b", "sub", "a/b/c.txt", "top", "sub/main.py"):
        st = os.stat(wd / p)
        assert (st.st_uid, st.st_gid) == (4000, 4001), p
    assert os.stat(wd).st_uid == 0  # the work directory itself is left alone
    assert os.stat(wd / "top").st_mode & 0o7777 == 0o644
    os.makedirs(wd / "pre")
    init._write_files({"code": "", "files": {"pre/x": ""}}, "m", 4000, 4001)
    assert os.stat(wd / "pre").st_uid == 0  # an existing parent keeps its owner
    init._write_files({"code": "only"}, "solo.py", 1, 2)
    assert (wd / "solo.py").read_bytes() == b"only"


def test_fetch(wd, tmp_path) -> None:
    (wd / "a.txt").write_bytes(b"AB")
    (wd / "d").mkdir()
    (wd / "d" / "big").write_bytes(b"z" * ((1 << 20) + 3))
    (tmp_path / "outside").write_text("secret")
    os.symlink(str(tmp_path / "outside"), wd / "esc")
    os.symlink("a.txt", wd / "inside-link")
    os.mkfifo(wd / "fifo")
    got = init._fetch(
        ["a.txt", "d/big", "esc", "../outside", "missing", "d", "fifo", "inside-link"]
    )
    assert set(got) == {"a.txt", "d/big", "inside-link"}
    assert base64.b64decode(got["a.txt"]) == b"AB"
    assert base64.b64decode(got["d/big"]) == b"z" * ((1 << 20) + 3)
    assert base64.b64decode(got["inside-link"]) == b"AB"
    assert init._fetch([]) == {}
    (tmp_path / "workdirx").mkdir()
    (tmp_path / "workdirx" / "f").write_text("no")
    assert init._fetch(["../workdirx/f"]) == {}  # a sibling whose name starts the same


def test_fit_tmpfs(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(_linux, "mount", lambda *a: calls.append(a))
    monkeypatch.setattr(init, "_tmpfs_mb", [0])
    init._fit_tmpfs({})
    init._fit_tmpfs({"tmpfs_mb": 0})
    assert calls == []
    init._fit_tmpfs({"tmpfs_mb": 64})
    assert calls == [
        (
            "tmpfs",
            "/sandbox",
            "tmpfs",
            _linux.MS_REMOUNT | _linux.MS_NOSUID | _linux.MS_NODEV,
            "size=64m,nr_inodes=16384",
        )
    ]
    assert init._tmpfs_mb == [64]
    init._fit_tmpfs({"tmpfs_mb": 64})  # already that size
    assert len(calls) == 1
    init._fit_tmpfs({"tmpfs_mb": 32})
    assert calls[-1][4] == "size=32m,nr_inodes=8192" and init._tmpfs_mb == [32]


def _req(**kw):
    r = {
        "op": "run",
        "lang": PY,
        "code": "print('hi')",
        "stdin": "",
        "files": {},
        "fetch_files": [],
        "compile_timeout": 5.0,
        "run_timeout": 5.0,
        "env": dict(os.environ),
        "cases": None,
        "stop_on_first_failure": False,
        "limits": dict(LIMD),
    }
    r.update(kw)
    return r


@pytest.mark.needs_root
def test_run_one_action(monkeypatch, wd) -> None:
    _std(monkeypatch)
    (wd / "keep.txt").write_text("k")
    r = init._run(
        _req(
            code="import sys\nprint(sys.stdin.read()[::-1])", stdin="abc", fetch_files=["keep.txt"]
        ),
        None,
    )
    assert set(r) == {"compile_result", "run_result", "cases", "files"}
    assert r["compile_result"] is None and r["cases"] is None
    assert r["run_result"]["stdout"] == "cba\n" and r["run_result"]["status"] == "Finished"
    assert r["run_result"]["return_code"] == 0
    assert r["files"] == {"keep.txt": base64.b64encode(b"k").decode()}
    assert (wd / "main.py").read_text() == "import sys\nprint(sys.stdin.read()[::-1])"


@pytest.mark.needs_root
def test_run_with_a_compile_stage(monkeypatch, wd) -> None:
    lang = {
        "name": "sh",
        "file": "p.sh",
        "compile": ["/bin/sh", "-c", "cp {file} {stem}.out; echo built"],
        "run": ["/bin/sh", "{stem}.out"],
        "inproc": False,
    }
    r = init._run(_req(lang=lang, code="echo ran", env={"PATH": "/bin:/usr/bin"}), None)
    assert r["compile_result"]["stdout"] == "built\n" and r["compile_result"]["return_code"] == 0
    assert r["run_result"]["stdout"] == "ran\n"
    lang = dict(lang, compile=["/bin/sh", "-c", "echo bad >&2; exit 2"])
    r = init._run(_req(lang=lang, code="x", env={}), None)
    assert r == {"compile_result": r["compile_result"], "run_result": None, "cases": None}
    assert r["compile_result"]["stderr"] == "bad\n" and r["compile_result"]["return_code"] == 2
    lang = dict(lang, compile=["/bin/sh", "-c", "sleep 30"])
    r = init._run(_req(lang=lang, code="x", env={}, total_timeout=0.3), None)
    assert r["timed_out"] == "timeout_s (0.3 s) ran out while compiling"
    assert r["compile_result"]["status"] == "TimeLimitExceeded" and r["run_result"] is None
    r = init._run(_req(lang=lang, code="x", env={}, compile_timeout=0.3), None)
    assert "timed_out" not in r and r["compile_result"]["status"] == "TimeLimitExceeded"


@pytest.mark.needs_root
def test_run_cases(monkeypatch, wd) -> None:
    _std(monkeypatch)
    code = "import sys\nn = int(sys.stdin.read() or 0)\nprint(n * 2, ' ')\n"
    cases = [
        {"stdin": "1", "expected_stdout": "2"},
        {"stdin": "2", "expected_stdout": "5"},
        {"stdin": "3"},
        {"stdin": "4", "assert": "assert n == 4"},
        {"stdin": "5", "assert": "assert n == 0"},
    ]
    r = init._run(_req(code=code, cases=cases), None)
    assert [c["passed"] for c in r["cases"]] == [True, False, True, True, False]
    assert [c["index"] for c in r["cases"]] == [0, 1, 2, 3, 4]
    assert [c["skipped"] for c in r["cases"]] == [False] * 5
    assert r["cases"][1]["run_result"]["stdout"] == "4  \n"
    assert r["cases"][4]["run_result"]["return_code"] == 1
    assert "AssertionError" in r["cases"][4]["run_result"]["stderr"]
    assert r["run_result"] is None and "timed_out" not in r
    r = init._run(_req(code=code, cases=cases[:3], stop_on_first_failure=True), None)
    assert [(c["passed"], c["skipped"]) for c in r["cases"]] == [
        (True, False),
        (False, False),
        (False, True),
    ]
    assert r["cases"][2]["run_result"] is None


@pytest.mark.needs_root
def test_run_cases_cut_by_the_deadline(monkeypatch, wd) -> None:
    _std(monkeypatch)
    code = "import sys, time\nif sys.stdin.read() == 'slow':\n    time.sleep(30)\nprint('ok')"
    cases = [{"stdin": "fast"}, {"stdin": "slow"}, {"stdin": "fast"}]
    r = init._run(_req(code=code, cases=cases, total_timeout=1.5), None)
    assert r["timed_out"] == "timeout_s (1.5 s) ran out: 1 of 3 cases finished"
    assert r["cases"][0]["passed"] and r["cases"][1]["run_result"]["status"] == "TimeLimitExceeded"
    assert r["cases"][2]["skipped"] is True


@pytest.mark.needs_root
def test_run_cases_in_parallel_by_cores(monkeypatch, wd) -> None:
    _std(monkeypatch)
    code = "import time\ntime.sleep(0.5)\nprint(1)"
    lim = dict(LIMD, cpus=2.2)  # three at once
    t0 = time.monotonic()
    r = init._run(_req(code=code, cases=[{}] * 3, limits=lim), None)
    assert time.monotonic() - t0 < 1.4 and all(c["passed"] for c in r["cases"])
    lim = dict(LIMD, cpus=1.0)
    t0 = time.monotonic()
    init._run(_req(code=code, cases=[{}] * 3, limits=lim), None)
    assert time.monotonic() - t0 >= 1.5


@pytest.mark.needs_root
def test_warm_and_rehearse_leave_nothing(monkeypatch, wd, capsys) -> None:
    monkeypatch.setattr(init, "_reap_all", lambda: None)
    init._warm({"uid": 65534, "gid": 65533})
    init.rehearse({"uid": 65534, "gid": 65533}, times=2)
    assert capsys.readouterr() == ("", "")


# ---- serve, as PID 1 of a PID namespace of its own ----------------------------------------------


def _serve(cfg: dict, frames: list[bytes], tmp) -> tuple[list[dict], int]:
    """Run `init.serve` as PID 1 of a new PID namespace; send ``frames``; the replies and its
    exit code."""
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        try:
            a.close()
            _linux.unshare(_linux.CLONE_NEWPID)
            inner = os.fork()
            if inner == 0:
                child.WORKDIR = child.CWD = str(tmp)
                init.WORKDIR_SLASH = str(tmp) + "/"
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
                init.serve(b.fileno(), cfg)
                os._exit(42)
            _, st = os.waitpid(inner, 0)
            os._exit(os.waitstatus_to_exitcode(st))
        except BaseException:
            os._exit(99)
    b.close()
    for f in frames:
        a.sendall(f)
    a.shutdown(socket.SHUT_WR)  # then the manager hangs up: the init exits
    replies = []
    a.settimeout(20)
    buf = b""
    while True:
        try:
            chunk = a.recv(1 << 16)
        except (TimeoutError, ConnectionResetError):  # (reset: it exited with a frame unread)
            break
        if not chunk:
            break
        buf += chunk
    while len(buf) >= 4:
        n = int.from_bytes(buf[:4], "big")
        replies.append(json.loads(buf[4 : 4 + n]))
        buf = buf[4 + n :]
    a.close()
    _, st = os.waitpid(pid, 0)
    return replies, os.waitstatus_to_exitcode(st)


CFG = {"uid": 65534, "gid": 65533, "workdir_mb": 16, "nofile": 1024}


@pytest.mark.needs_root
def test_serve_answers_a_one_shot_and_exits(tmp_path) -> None:
    os.chmod(tmp_path, 0o777)
    req = _req(code="print('one')", env={**os.environ})
    replies, rc = _serve(CFG, [wire.encode_request(req), wire.encode_request(req)], tmp_path)
    assert rc == 0 and len(replies) == 1
    assert replies[0]["run_result"]["stdout"] == "one\n"


@pytest.mark.needs_root
def test_serve_keeps_serving_after_kept_ops_and_names_an_unknown_one(tmp_path) -> None:
    os.chmod(tmp_path, 0o777)
    frames = [
        wire.encode_request({"op": "prepare"}),
        wire.encode_request({"op": "keep"}),
        wire.encode_request({"op": "nope"}),
        wire.encode_request({"op": "prepare"}),
    ]
    replies, rc = _serve(CFG, frames, tmp_path)
    assert rc == 0
    assert replies == [
        {"ok": True},
        {"ok": True},
        {"error": "unknown op 'nope': expected run, prepare, session or image"},
    ]


@pytest.mark.needs_root
def test_serve_reports_an_error_and_exits_on_a_bad_frame(tmp_path) -> None:
    os.chmod(tmp_path, 0o777)
    replies, rc = _serve(CFG, [wire.encode_request({"op": "run"})], tmp_path)
    assert rc == 0 and replies == [{"error": "KeyError: 'limits'"}]
    replies, rc = _serve(CFG, [b"\0\0\0\2xx"], tmp_path)
    assert rc == 0 and replies == []
    replies, rc = _serve(CFG, [], tmp_path)  # the manager hung up
    assert rc == 0 and replies == []


@pytest.mark.needs_root
def test_serve_prepares_once_and_runs_the_action_in_the_prepared_child(tmp_path) -> None:
    os.chmod(tmp_path, 0o777)
    req = _req(code="import os\nprint(os.getpid())", env={**os.environ})
    frames = [
        wire.encode_request({"op": "prepare"}),
        wire.encode_request({"op": "prepare"}),
        wire.encode_request(req),
    ]
    replies, rc = _serve(CFG, frames, tmp_path)
    assert rc == 0 and replies[:2] == [{"ok": True}, {"ok": True}]
    # pid 1 is the init; the prepared child was forked first (its warm-up's children reaped)
    assert replies[2]["run_result"]["stdout"] == "2\n"


@pytest.mark.needs_root
def test_serve_direct_prepare_forks_nothing(tmp_path) -> None:
    os.chmod(tmp_path, 0o777)
    req = _req(code="import os\nprint(os.getpid())", env={**os.environ})
    frames = [wire.encode_request({"op": "prepare"}), wire.encode_request(req)]
    replies, rc = _serve({**CFG, "direct": True}, frames, tmp_path)
    assert rc == 0 and replies[0] == {"ok": True}
    assert replies[1]["run_result"]["stdout"] == "2\n"  # forked on demand: the first child


# ---- issue 43 item 2 (helper-61): the sample's survivors ----------------------------------------


def test_an_argv_job_carries_the_requests_env(monkeypatch) -> None:
    monkeypatch.setattr(child, "WORKDIR", "/workdir")
    j = init._job({"env": {"B": "2"}, "run_timeout": 1.5, "code": ""}, SH, "main.sh", "", None)
    assert (j.argv, j.env, j.timeout, j.stdin) == (["/bin/sh", "main.sh"], {"B": "2"}, 1.5, b"")


@pytest.mark.needs_root
def test_a_cases_expected_output_is_compared_after_replacing_bad_bytes(monkeypatch, wd) -> None:
    _std(monkeypatch)
    code = "import sys\nsys.stdout.buffer.write(b'\\xff' + sys.stdin.read().encode())"
    cases = [{"stdin": "2", "expected_stdout": "\ufffd2"}, {"stdin": "3", "expected_stdout": "3"}]
    r = init._run(_req(code=code, cases=cases), None)
    assert [c["passed"] for c in r["cases"]] == [True, False]


# -- sessions (`_session`), in the test process


def _sreq(code: str, **kw) -> dict:
    r = {
        "op": "session",
        "lang": {"name": "python"},
        "code": code,
        "run_timeout": 10.0,
        "env": {"TANGRAM_CPUS": "3"},
        "limits": dict(LIMD),
    }
    r.update(kw)
    return r


@pytest.mark.needs_root
def test_session_keeps_one_worker_per_language(monkeypatch, wd) -> None:
    _std(monkeypatch)
    mounts = []
    monkeypatch.setattr(_linux, "mount", lambda *a: mounts.append(a))
    monkeypatch.setattr(init, "_tmpfs_mb", [0])
    sessions: dict = {}
    try:
        r = init._session(_sreq("x = 20\nx + 1", tmpfs_mb=8), sessions)
        assert set(r) == {"compile_result", "run_result", "cases", "files", "message"}
        assert (r["compile_result"], r["cases"], r["files"], r["message"]) == (None, None, {}, "")
        assert (r["run_result"]["stdout"], r["run_result"]["return_code"]) == ("21\n", 0)
        assert list(sessions) == ["python"] and [m[4] for m in mounts] == ["size=8m,nr_inodes=2048"]
        w = sessions["python"]
        code = "import os\nx, os.cpu_count(), os.environ['TANGRAM_CPUS']"
        lim = dict(LIMD, cpus=2.5, output=12)
        r = init._session(_sreq(code, limits=lim), sessions)
        assert sessions == {"python": w}  # the same worker: its state kept
        assert r["run_result"]["stdout"] == "(20, 3, '3')"[:12] and r["run_result"]["truncated"]
        r = init._session(_sreq("import time\ntime.sleep(30)", run_timeout=0.4), sessions)
        assert r["run_result"]["status"] == "TimeLimitExceeded"
        assert r["message"] == "the python session process ended; its state is lost"
        assert sessions == {}
        r = init._session(_sreq("'x' in globals()"), sessions)
        assert (r["run_result"]["stdout"], r["message"]) == ("False\n", "")
    finally:
        for w in sessions.values():  # (the pid itself first: a worker killed right after its
            os.kill(w.pid, 9)  # fork may not have made its process group yet, see `Worker.kill`)
            w.kill()


@pytest.mark.needs_root
def test_session_whose_worker_cannot_fork(monkeypatch, wd) -> None:
    from arl_tangram.managers.cpu.sandbox import session_worker

    errs = [11]

    def refuse(*a):
        raise OSError(errs[0], "refused")

    monkeypatch.setattr(session_worker, "Worker", refuse)
    sessions: dict = {}
    r = init._session(_sreq("1", lang={"name": "bash"}), sessions)
    assert set(r) == {"compile_result", "run_result", "cases", "files", "message"}
    assert (r["compile_result"], r["cases"], r["files"]) == (None, None, {})
    assert r["message"] == session_worker.PIDS_FULL and sessions == {}
    st = r["run_result"]
    assert (st["status"], st["return_code"], st["stdout"]) == ("Error", None, "")
    assert st["stderr"] == f"could not start the bash session process: {session_worker.PIDS_FULL}\n"
    errs[0] = 12  # any other error is raised (`serve` reports it)
    with pytest.raises(OSError) as e:
        init._session(_sreq("1"), sessions)
    assert e.value.errno == 12


# -- `become`, in a mount and UTS namespace of a child's own


@pytest.mark.needs_root
def test_become_mounts_the_sandboxs_tmpfs_and_binds() -> None:
    import pathlib
    import shutil
    import tempfile

    top = pathlib.Path(tempfile.mkdtemp(prefix="t-become-", dir="/var/tmp"))  # (not under /tmp)
    try:
        _become(top)
    finally:
        shutil.rmtree(top)


def _become(top) -> None:
    sb, wdir = top / "sandbox", top / "workdir"
    sb.mkdir()
    wdir.mkdir()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            _linux.unshare(_linux.CLONE_NEWNS | _linux.CLONE_NEWUTS)
            _linux.mount(None, "/", None, _linux.MS_REC | _linux.MS_PRIVATE)
            init.SANDBOX_DIR, child.WORKDIR = str(sb), str(wdir)
            written = []
            real_write = _linux.write_proc
            _linux.write_proc = lambda p, d: written.append([p, d.decode()]) or real_write(p, d)
            init.become(3, 4000, 4001, "box-61")
            info: dict = {"mounts": {}, "written": written}
            with open("/proc/self/mountinfo") as f:
                for line in f:
                    pre, post = line.split(" - ")
                    p = pre.split()
                    info["mounts"][p[4]] = [p[3], p[5], *post.split()]
            for name in ("work", "tmp"):
                st = os.stat(sb / name)
                info[name] = [st.st_mode & 0o7777, st.st_uid, st.st_gid, st.st_ino]
            info["ino"] = [os.stat(wdir).st_ino, os.stat("/tmp").st_ino]
            info["host"] = socket.gethostname()
            with open("/proc/self/oom_score_adj") as f:
                info["oom"] = f.read()
            os.write(w, json.dumps(info).encode())
            os._exit(0)
        except BaseException as e:
            os.write(w, json.dumps({"error": repr(e)}).encode())
            os._exit(1)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    _, st = os.waitpid(pid, 0)
    info = json.loads(data)
    assert os.waitstatus_to_exitcode(st) == 0, info
    m = info["mounts"]
    assert m[str(sb)][0] == "/" and m[str(sb)][2:4] == ["tmpfs", "tmpfs"]
    assert m[str(sb)][1].split(",")[:3] == ["rw", "nosuid", "nodev"]
    assert m[str(sb)][4].split(",")[1:4] == ["size=3072k", "nr_inodes=768", "mode=755"]
    assert m[str(wdir)][0] == "/work" and m["/tmp"][0] == "/tmp"
    assert m[str(wdir)][2] == m["/tmp"][2] == "tmpfs"
    assert m["/proc"][2:4] == ["proc", "proc"] and m["/proc"][1].split(",")[:4] == [
        "rw",
        "nosuid",
        "nodev",
        "noexec",
    ]
    assert info["work"][:3] == [0o700, 4000, 4001] and info["tmp"][:3] == [0o1777, 4000, 4001]
    assert info["ino"] == [info["work"][3], info["tmp"][3]]
    with open("/proc/self/status") as f:
        caps = int(next(x for x in f if x.startswith("CapEff:")).split()[1], 16)
    with open("/proc/self/oom_score_adj") as f:
        own = f.read()
    sys_resource = bool(caps & (1 << 24))  # (-1000 needs CAP_SYS_RESOURCE; else left as it was)
    assert (info["host"], info["oom"]) == ("box-61", "-1000\n" if sys_resource else own)
    assert info["written"] == [["/proc/self/oom_score_adj", "-1000"]]


# -- `serve` with the manager's socket at fd 3 and the output pipes at 4 and 5 (a direct
# sandbox's layout), as PID 1 of a PID namespace of its own


def _serve_fds(
    cfg: dict, frames: list[bytes], tmp, prep=None, run=None
) -> tuple[list, int, bytes, bytes]:
    """(``run``: called instead of `init.serve`, e.g. `_run_direct` itself.)"""
    a, b = socket.socketpair()
    r4, w4 = os.pipe()
    r5, w5 = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            a.close()
            os.close(r4)
            os.close(r5)
            _linux.unshare(_linux.CLONE_NEWPID)
            inner = os.fork()
            if inner == 0:
                high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in (b.fileno(), w4, w5)]
                for fd, to in zip(high, (3, 4, 5), strict=True):
                    os.dup2(fd, to)
                    os.close(fd)
                child.WORKDIR = child.CWD = str(tmp)
                child.FAST = None
                init.WORKDIR_SLASH = str(tmp) + "/"
                os.dup2(5, 2)  # (the init's own stderr: where a direct start's failure goes)
                sys.stdin = open(0, closefd=False)  # noqa: SIM115
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
                if prep is not None:
                    prep()
                if run is None:
                    init.serve(3, cfg)
                else:
                    run()
                os._exit(42)
            os.close(w4)
            os.close(w5)
            b.close()
            _, st = os.waitpid(inner, 0)
            os._exit(os.waitstatus_to_exitcode(st))
        except BaseException:
            os._exit(99)
    b.close()
    os.close(w4)
    os.close(w5)
    for f in frames:
        a.sendall(f)
    a.shutdown(socket.SHUT_WR)
    a.settimeout(20)
    buf = b""
    while True:
        try:
            chunk = a.recv(1 << 16)
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        buf += chunk
    replies = []
    while len(buf) >= 4:
        n = int.from_bytes(buf[:4], "big")
        replies.append(json.loads(buf[4 : 4 + n]))
        buf = buf[4 + n :]
    a.close()
    outs = []
    for r in (r4, r5):
        data = b""
        while chunk := os.read(r, 1 << 16):
            data += chunk
        os.close(r)
        outs.append(data)
    _, st = os.waitpid(pid, 0)
    return replies, os.waitstatus_to_exitcode(st), outs[0], outs[1]


DIRECT_CODE = (
    "import os, sys\n"
    "print(sys.stdin.read()[::-1], os.getuid(), os.getgid(), os.getcwd() == sys.path[0])\n"
    "print(__file__, os.readlink('/proc/self/fd/0'), file=sys.stderr)\n"
    "sys.exit(3)"
)


@pytest.mark.needs_root
@pytest.mark.parametrize("stdin", ["abc", ""])
def test_serve_a_direct_run_becomes_the_action(tmp_path, stdin: str) -> None:
    os.chmod(tmp_path, 0o777)
    req = _req(direct=True, code=DIRECT_CODE, stdin=stdin, env={"PATH": "/bin"})
    replies, rc, out, err = _serve_fds(
        {**CFG, "direct": True}, [wire.encode_request(req)], tmp_path
    )
    assert (replies, rc) == ([{"rc": 3}], 3), err
    assert out == f"{stdin[::-1]} 65534 65533 True\n".encode()
    fd0 = "/memfd:stdin (deleted)" if stdin else "/dev/null"
    assert err == f"{tmp_path}/main.py {fd0}\n".encode()
    st = os.stat(tmp_path / "main.py")
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (65534, 65533, 0o644)


@pytest.mark.needs_root
def test_serve_a_direct_run_with_files(tmp_path) -> None:
    os.chmod(tmp_path, 0o777)
    code = "print(open('d/x.txt').read(), open('main.py').read()[:5])"
    files = {"d/x.txt": base64.b64encode(b"X1").decode()}
    req = _req(direct=True, code=code, files=files, env={"PATH": "/bin"})
    replies, rc, out, err = _serve_fds(
        {**CFG, "direct": True}, [wire.encode_request(req)], tmp_path
    )
    assert (replies, rc, out, err) == ([{"rc": 0}], 0, b"X1 print\n", b"")
    st = os.stat(tmp_path / "d")
    assert (st.st_uid, st.st_gid) == (65534, 65533)


@pytest.mark.needs_root
def test_serve_a_direct_run_that_cannot_start(tmp_path) -> None:
    os.chmod(tmp_path, 0o777)
    req = _req(direct=True, code="print(1)", env={"PATH": "/bin"})
    del req["run_timeout"]
    replies, rc, out, err = _serve_fds(
        {**CFG, "direct": True}, [wire.encode_request(req)], tmp_path
    )
    assert (replies, rc, out) == ([], 127, b"")
    assert err == b"sandbox: cannot start: 'run_timeout'\n"


@pytest.mark.needs_root
def test_serve_a_direct_request_to_a_sandbox_not_direct_is_a_plain_run(tmp_path) -> None:
    os.chmod(tmp_path, 0o777)
    req = _req(direct=True, code="print(7)", env={**os.environ})
    replies, rc, _, _ = _serve_fds(CFG, [wire.encode_request(req)], tmp_path)
    assert rc == 0 and replies[0]["run_result"]["stdout"] == "7\n"


@pytest.mark.needs_root
@pytest.mark.parametrize(
    ("cfg", "warmed"),
    [
        ({"direct": True, "warm_direct": True}, "w"),
        ({"direct": True}, ""),
        ({"warm_direct": True}, ""),
    ],
)
def test_serve_warms_a_direct_sandbox_at_once(tmp_path, cfg: dict, warmed: str) -> None:
    os.chmod(tmp_path, 0o777)
    mark = tmp_path / "warmed"

    def prep() -> None:
        init.warm_child = lambda: mark.open("a").write("w")

    replies, rc, _, _ = _serve_fds(
        {**CFG, **cfg}, [wire.encode_request({"op": "keep"})], tmp_path, prep
    )
    assert (replies, rc) == ([{"ok": True}], 0)
    assert (mark.read_text() if mark.exists() else "") == warmed


def _fastpath():
    try:
        from arl_tangram.managers.cpu.zygote import _fastpath
    except ImportError:
        return None
    return _fastpath


@pytest.mark.needs_root
@pytest.mark.skipif(_fastpath() is None, reason="the compiled fast path is not built")
def test_run_direct_on_the_compiled_path(tmp_path) -> None:
    os.chmod(tmp_path, 0o777)
    req = _req(direct=True, code=DIRECT_CODE, stdin="xy", env={"PATH": "/bin"})

    def prep() -> None:
        child.FAST = _fastpath()
        child.CWD = f"{tmp_path}/"  # (not the WORKDIR object itself: else its cwd is /workdir)

    replies, rc, out, err = _serve_fds(
        CFG,
        [],
        tmp_path,
        prep,
        run=lambda: init._run_direct(wire.request_from(wire.encode_request(req)[4:])),
    )
    assert (replies, rc) == ([{"rc": 3}], 3), err
    assert out == b"yx 65534 65533 True\n"
    assert err == f"{tmp_path}/main.py /memfd:stdin (deleted)\n".encode()


@pytest.mark.needs_root
def test_serve_a_direct_run_names_a_java_file_by_its_class(tmp_path) -> None:
    os.chmod(tmp_path, 0o777)
    lang = {
        "name": "java",
        "file": "Main.java",
        "compile": None,
        "run": ["/bin/sh", "-c", "echo {file} {stem}; cat {file}"],
        "inproc": False,
    }
    req = _req(direct=True, lang=lang, code="public class Foo {}", env={"PATH": "/bin"})
    replies, rc, out, err = _serve_fds(
        {**CFG, "direct": True}, [wire.encode_request(req)], tmp_path
    )
    # (an exec'd job reports no frame: its status fd closes on exec)
    assert (replies, rc, out, err) == ([], 0, b"Foo.java Foo\npublic class Foo {}", b"")


# ---- issue 43 (helper-68): the whole module's survivors -----------------------------------------


class _Driver:
    """`proc.Driver` recorded: its arguments and the jobs it ran (each finished with rc 0)."""

    made: list = []

    def __init__(self, limits, parallel=1, prepared=None, deadline=float("inf")) -> None:
        self.args = (limits, parallel, prepared, deadline)
        self.cut = False
        _Driver.made.append(self)

    def run(self, jobs, stop_on_failure=None) -> None:
        self.jobs, self.stop = jobs, stop_on_failure
        for j in jobs:
            j.status, j.return_code, j.done, j.elapsed = "Finished", 0, True, 0.0
            j.out += b"ok\n"


class _Clock:
    @staticmethod
    def monotonic() -> float:
        return 100.0


@pytest.fixture
def drivers(monkeypatch):
    from arl_tangram.managers.cpu.sandbox import proc

    monkeypatch.setattr(_Driver, "made", [])
    monkeypatch.setattr(proc, "Driver", _Driver)
    monkeypatch.setattr(init, "time", _Clock)
    return _Driver.made


@pytest.mark.needs_root
def test_run_passes_each_stage_its_job_limits_prepared_child_and_deadline(wd, drivers) -> None:
    prep = object()
    lang = dict(SH, file="p.sh", compile=["/bin/cc", "{file}", "-o", "{stem}"], run=["./{stem}"])
    env = {"PATH": "/bin"}
    r = init._run(_req(lang=lang, code="c", env=env, compile_timeout=7.5, run_timeout=2.5,
                       stdin="in", total_timeout=30.0), prep)
    lim = Limits(**LIMD)
    assert [d.args for d in drivers] == [(lim, 1, prep, 130.0), (lim, 1, None, float("inf"))]
    (cj,), (rj,) = drivers[0].jobs, drivers[1].jobs
    assert (cj.argv, cj.env, cj.timeout, cj.stdin, cj.python) == (
        ["/bin/cc", "p.sh", "-o", "p"], env, 7.5, b"", None)
    assert (rj.argv, rj.env, rj.timeout, rj.stdin) == (["./p"], env, 2.5, b"in")
    assert drivers[1].stop is None
    assert r["compile_result"]["stdout"] == r["run_result"]["stdout"] == "ok\n"
    drivers.clear()
    init._run(_req(code="c", cases=None), prep)  # no compile stage: the run takes the child
    assert [d.args for d in drivers] == [(lim, 1, prep, float("inf"))]
    assert drivers[0].jobs[0].python == [("c", f"{wd}/main.py")]
    assert drivers[0].jobs[0].stdin == b""  # (no stdin: empty)


@pytest.mark.needs_root
@pytest.mark.parametrize(("cpus", "parallel"), [(1.0, 1), (2.0, 2), (2.2, 3), (0.5, 1)])
def test_run_cases_driver_arguments(wd, drivers, cpus: float, parallel: int) -> None:
    prep = object()
    cases = [{"stdin": "1", "expected_stdout": "ok"}, {"assert": "assert 1"}]
    r = init._run(_req(code="c", cases=cases, limits=dict(LIMD, cpus=cpus), total_timeout=5.0,
                       stop_on_first_failure=True), prep)
    (d,) = drivers
    assert d.args == (Limits(**dict(LIMD, cpus=cpus)), parallel, prep, 105.0)
    assert [(j.python, j.stdin, j.timeout) for j in d.jobs] == [
        ([("c", f"{wd}/main.py")], b"1", 5.0),
        ([("c", f"{wd}/main.py"), ("assert 1", "<test>")], b"", 5.0),
    ]
    assert [d.stop(j) for j in d.jobs] == [False, False]  # both passed
    assert [c["passed"] for c in r["cases"]] == [True, True]
    drivers.clear()
    init._run(_req(code="c", cases=cases, limits=dict(LIMD, cpus=cpus)), prep)
    assert drivers[0].stop is None and drivers[0].args[3] == float("inf")


@pytest.mark.needs_root
def test_serve_prepare_forks_the_actions_child_at_once(tmp_path) -> None:
    os.chmod(tmp_path, 0o777)
    ask = {"op": "session", "lang": {"name": "python"}, "code": "import os\nos.getpid()",
           "run_timeout": 10.0, "env": {"PATH": "/bin"}, "limits": dict(LIMD)}
    frames = [wire.encode_request({"op": "prepare"}), wire.encode_request(ask)]
    replies, rc = _serve(CFG, frames, tmp_path)
    # pid 1 is the init, 2 the prepared child (waiting for an action), 3 the session's worker
    assert rc == 0 and replies[0] == {"ok": True}
    assert replies[1]["run_result"]["stdout"] == "3\n"
    replies, rc = _serve(CFG, frames[1:], tmp_path)  # (without a prepare: the worker is 2)
    assert rc == 0 and replies[0]["run_result"]["stdout"] == "2\n"


@pytest.mark.needs_root
def test_serve_a_direct_run_leaves_the_action_fds_0_to_2_only(tmp_path) -> None:
    os.chmod(tmp_path, 0o777)
    code = "import os\nprint(sorted(int(f) for f in os.listdir('/proc/self/fd')))"
    req = _req(direct=True, code=code, env={"PATH": "/bin"})
    replies, rc, out, err = _serve_fds(
        {**CFG, "direct": True}, [wire.encode_request(req)], tmp_path
    )
    assert (replies, rc, err) == ([{"rc": 0}], 0, b"")
    # 0-2, the listing's own fd (3) and the status fd (>= 900, closed on exec)
    fds = json.loads(out)
    assert fds[:4] == [0, 1, 2, 3] and len(fds) == 5 and fds[4] >= 900, fds


class _Take:
    """A compiled path's `direct_take`, faked: a "keep" request's body, then the end."""

    def __init__(self) -> None:
        self.bodies = [wire.encode_request({"op": "keep"})[4:]]

    def direct_take(self, fd: int) -> bytes:
        if not self.bodies or fd != 3:  # (3: the manager's socket here)
            raise EOFError
        return self.bodies.pop(0)


@pytest.mark.needs_root
@pytest.mark.parametrize(("cfg", "first"), [({"direct": True}, "keep"), ({}, "nope")])
def test_serve_reads_a_direct_sandboxs_requests_with_the_compiled_take(
    tmp_path, cfg: dict, first: str
) -> None:
    os.chmod(tmp_path, 0o777)

    def prep() -> None:
        child.FAST = _Take()

    frames = [wire.encode_request({"op": "nope"})]
    replies, rc, _, _ = _serve_fds({**CFG, **cfg}, frames, tmp_path, prep)
    assert rc == 0
    if first == "keep":  # the take's request, answered; then its end: exit 0
        assert replies == [{"ok": True}]
    else:  # not direct: the socket's own frame
        assert replies == [{"error": "unknown op 'nope': expected run, prepare, session or image"}]


@pytest.mark.needs_root
def test_run_cases_a_case_killed_after_a_failure_is_skipped(monkeypatch, wd) -> None:
    _std(monkeypatch)
    code = "import sys, time\nif sys.stdin.read() == 'slow':\n    time.sleep(30)\nsys.exit(1)"
    cases = [{"stdin": "fail"}, {"stdin": "slow"}]
    r = init._run(_req(code=code, cases=cases, limits=dict(LIMD, cpus=2.0),
                       stop_on_first_failure=True), None)
    # both started at once; the slow one killed when the first failed ("Skipped" in `proc`)
    (c0, c1) = r["cases"]
    assert (c0["passed"], c0["skipped"], c0["run_result"]["return_code"]) == (False, False, 1)
    assert (c1["passed"], c1["skipped"], c1["run_result"]) == (False, True, None)


@pytest.mark.needs_root
def test_serve_keep_clears_the_inits_parent_death_signal(tmp_path) -> None:
    os.chmod(tmp_path, 0o777)
    log = tmp_path / "prctl"

    def prep() -> None:
        real = _linux.prctl

        def prctl(*a):
            with log.open("a") as f:
                f.write(json.dumps(a) + "\n")
            return real(*a)

        _linux.prctl = prctl

    replies, rc, _, _ = _serve_fds(CFG, [wire.encode_request({"op": "keep"})], tmp_path, prep)
    assert (replies, rc) == ([{"ok": True}], 0)
    assert log.read_text().splitlines() == [json.dumps([_linux.PR_SET_PDEATHSIG, 0])]


@pytest.mark.needs_root
def test_serve_direct_prepare_leaves_the_first_fork_to_the_action(tmp_path) -> None:
    os.chmod(tmp_path, 0o777)
    ask = {"op": "session", "lang": {"name": "python"}, "code": "import os\nos.getpid()",
           "run_timeout": 10.0, "env": {"PATH": "/bin"}, "limits": dict(LIMD)}
    frames = [wire.encode_request({"op": "prepare"}), wire.encode_request(ask)]
    replies, rc, _, _ = _serve_fds({**CFG, "direct": True}, frames, tmp_path)
    assert rc == 0 and replies[0] == {"ok": True}
    assert replies[1]["run_result"]["stdout"] == "2\n"  # no prepared child: the worker is 2


@pytest.mark.needs_root
def test_serve_enters_an_image_with_the_managers_socket(tmp_path) -> None:
    from arl_tangram.managers.cpu.sandbox import imagebox

    os.chmod(tmp_path, 0o777)
    log = tmp_path / "enter"

    def prep() -> None:
        def enter(req, fd):
            log.write_text(json.dumps([req, fd]))
            return {"ok": True, "user": "u"}

        imagebox.enter = enter

    ask = {"op": "image", "layers": ["l1"], "layer_mb": 5}
    frames = [wire.encode_request(ask), wire.encode_request({"op": "keep"})]
    replies, rc, _, _ = _serve_fds(CFG, frames, tmp_path, prep)
    assert (replies, rc) == ([{"ok": True, "user": "u"}, {"ok": True}], 0)  # kept: served on
    assert json.loads(log.read_text()) == [ask, 3]


def test_reap_all_reaps_every_exited_child_and_returns_while_one_lives() -> None:
    r, w = os.pipe()
    pids = []
    for live in (False, False, True):
        pid = os.fork()
        if pid == 0:
            if live:
                os.close(w)
                os.read(r, 1)
            os._exit(0)
        pids.append(pid)
    for pid in pids[:2]:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped
    init._reap_all()  # (returns: the third still runs)
    for pid in pids[:2]:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    assert os.waitpid(pids[2], os.WNOHANG) == (0, 0)
    os.close(w)
    os.waitpid(pids[2], 0)
    os.close(r)


@pytest.mark.needs_root
@pytest.mark.parametrize("warm", [False, True])
def test_serve_answers_the_first_request_read_for_it(tmp_path, warm: bool) -> None:
    os.chmod(tmp_path, 0o777)
    mark = tmp_path / "warmed"
    cfg = {**CFG, "direct": True, "warm_direct": True} if warm else CFG

    def prep() -> None:
        init.warm_child = lambda: mark.open("a").write("w")

    first = wire.encode_request({"op": "keep"})[4:]  # (`fork_all` read its body already)
    replies, rc, _, _ = _serve_fds(
        cfg, [wire.encode_request({"op": "nope"})], tmp_path, prep,
        run=lambda: init.serve(3, cfg, first),
    )
    assert rc == 0 and replies == [
        {"ok": True},
        {"error": "unknown op 'nope': expected run, prepare, session or image"},
    ]
    assert not mark.exists()  # a first request given: no warm-up before it


def test_serve_exits_0_when_the_manager_is_gone_before_the_reply() -> None:
    a, b = socket.socketpair()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            a.close()
            os.close(w)
            os.read(r, 1)  # until the manager has sent its request and hung up
            init.serve(b.fileno(), CFG)  # a kept op: its reply cannot be written
            os._exit(42)
        except BaseException:
            os._exit(99)
    b.close()
    os.close(r)
    a.sendall(wire.encode_request({"op": "keep"}))
    a.close()
    os.close(w)
    _, st = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(st) == 0


@pytest.mark.needs_root
def test_run_kills_what_the_action_left_running_before_it_replies(tmp_path) -> None:
    os.chmod(tmp_path, 0o777)
    code = ("import subprocess\n"
            "print(subprocess.Popen(['/bin/sleep', '5'], start_new_session=True).pid)")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            _linux.unshare(_linux.CLONE_NEWPID)
            inner = os.fork()
            if inner == 0:  # PID 1: the action's orphans are its children
                child.WORKDIR = child.CWD = str(tmp_path)
                child.FAST = None
                init.WORKDIR_SLASH = str(tmp_path) + "/"
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
                reply = init._run(_req(code=code, env={"PATH": "/bin:/usr/bin"}), None)
                left = int(reply["run_result"]["stdout"])
                info = os.waitid(os.P_PID, left, os.WEXITED)
                os.write(w, json.dumps([info.si_code, info.si_status]).encode())
                os._exit(0)
            _, st = os.waitpid(inner, 0)
            os._exit(os.waitstatus_to_exitcode(st))
        except BaseException:
            os._exit(99)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    _, st = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(st) == 0
    assert json.loads(data) == [os.CLD_KILLED, 9]  # SIGKILLed, not left to end by itself


@pytest.mark.needs_root
def test_serve_a_direct_run_whose_main_file_is_in_a_subdirectory(tmp_path) -> None:
    os.chmod(tmp_path, 0o777)
    lang = dict(PY, file="src/main.py")
    req = _req(direct=True, lang=lang, code="print(__file__)", env={"PATH": "/bin"})
    replies, rc, out, err = _serve_fds(
        {**CFG, "direct": True}, [wire.encode_request(req)], tmp_path
    )
    assert (replies, rc, out, err) == ([{"rc": 0}], 0, f"{tmp_path}/src/main.py\n".encode(), b"")
    st = os.stat(tmp_path / "src")
    assert (st.st_uid, st.st_gid) == (65534, 65533)


@pytest.mark.needs_root
def test_serve_a_direct_run_that_cannot_start_with_stderr_closed(tmp_path) -> None:
    os.chmod(tmp_path, 0o777)
    req = _req(direct=True, code="print(1)", env={"PATH": "/bin"})
    del req["run_timeout"]
    replies, rc, out, err = _serve_fds(
        {**CFG, "direct": True}, [wire.encode_request(req)], tmp_path, lambda: os.close(2)
    )
    assert (replies, rc, out, err) == ([], 127, b"", b"")  # the message lost, the exit the same


def test_read_sample_closes_both_ends_when_the_write_fails() -> None:
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(TypeError, match="bytes-like"):
        init._read_sample("not bytes")  # type: ignore[arg-type]
    assert set(os.listdir("/proc/self/fd")) == before


@pytest.mark.needs_root
def test_run_cases_counts_the_cases_finished_before_the_deadline(monkeypatch, wd) -> None:
    _std(monkeypatch)
    code = "import sys, time\nif sys.stdin.read() == 'slow':\n    time.sleep(30)\nprint('ok')"
    cases = [{"stdin": "fast"}, {"stdin": "fast"}, {"stdin": "slow"}]
    r = init._run(_req(code=code, cases=cases, total_timeout=2.5), None)
    assert r["timed_out"] == "timeout_s (2.5 s) ran out: 2 of 3 cases finished"


@pytest.mark.needs_root
def test_run_names_a_java_file_by_its_class(wd, drivers) -> None:
    lang = dict(SH, name="java", file="Main.java", compile=["javac", "{file}"], run=["java", "{stem}"])
    init._run(_req(lang=lang, code="public class Foo {}"), None)
    assert [d.jobs[0].argv for d in drivers] == [["javac", "Foo.java"], ["java", "Foo"]]
    assert (wd / "Foo.java").read_text() == "public class Foo {}"


@pytest.mark.needs_root
def test_write_files_truncates_and_never_follows_a_link(wd) -> None:
    (wd / "f.txt").write_text("a longer old text")
    init._write_files({"code": "main", "files": {"f.txt": base64.b64encode(b"new").decode()}},
                      "m.py", 4000, 4001)
    assert (wd / "f.txt").read_bytes() == b"new"
    os.symlink("/etc/hostname", wd / "ln")
    with pytest.raises(OSError):
        init._write_files({"code": "x"}, "ln", 4000, 4001)


@pytest.mark.needs_root
def test_rehearse_compiles_and_runs_the_sample_as_a_direct_action_does(monkeypatch, wd) -> None:
    calls = []

    def rec_compile(src, filename, mode, **kw):
        calls.append(("compile", src, filename, mode, kw))
        return compile(src, filename, mode, **kw)

    def rec_exec(code, *glb):
        calls.append(("exec", *[None if g is None else dict(g) for g in glb]))

    monkeypatch.setattr(init, "compile", rec_compile, raising=False)
    monkeypatch.setattr(init, "exec", rec_exec, raising=False)
    init.rehearse({"uid": 65534, "gid": 65533}, times=2)
    one = [("compile", "x = 1\n", f"{wd}/main.py", "exec", {"dont_inherit": True}),
           ("exec", {"__name__": "__main__"})]
    assert calls == one * 2
