"""Exact values of a session's persistent workers (`sandbox/session_worker.py`, issue 43), forked
from the test process (so a mutant runs in the worker too): the Python worker's echo of a last
expression, kept state, exit codes, tracebacks, the cores shown per exchange; the bash worker's
exit statuses, exports and kept state; the time limit, a worker that dies, the output cap's
edge, a worker already gone, and the pure helpers (`show`, `_parse_done`, `_read`, `_stage`)."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from arl_tangram.managers.cpu import wire
from arl_tangram.managers.cpu.sandbox import child, imagebox, session_worker
from arl_tangram.managers.cpu.sandbox.child import Limits
from arl_tangram.managers.cpu.sandbox.session_worker import Worker, exchange

pytestmark = pytest.mark.needs_root

LIM = Limits(uid=65534, gid=65533, cpu_s=30, fsize=1 << 20, nofile=1024, output=0, cpus=1.0)


@pytest.fixture
def here(monkeypatch, tmp_path):
    os.chmod(tmp_path, 0o777)
    monkeypatch.setattr(child, "WORKDIR", str(tmp_path))
    monkeypatch.setattr(child, "CWD", str(tmp_path))
    monkeypatch.setattr(child, "FAST", None)
    monkeypatch.setattr(imagebox, "python", None)
    monkeypatch.setattr(imagebox, "SHELL", None)
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))  # noqa: SIM115
    made = []
    yield made
    for w in made:
        w.kill()


def _py(here) -> Worker:
    w = Worker("python", LIM, dict(os.environ))
    here.append(w)
    return w


def test_python_worker_echoes_keeps_state_and_codes(monkeypatch, here) -> None:
    # (pytest's sys.std* are set again after set-up: set them in the body)
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))  # noqa: SIM115
    w = _py(here)
    assert w.lang == "python" and w.pid > 0 and w.shown is None
    assert [os.get_blocking(fd) for fd in (w.done, w.out, w.err)] == [False] * 3
    st, alive = exchange(w, "x = 20\nx + 1", 10, 1000)
    assert alive and st["status"] == "Finished" and st["return_code"] == 0
    assert st["stdout"] == "21\n" and st["stderr"] == "" and st["truncated"] is False
    assert set(st) == {"status", "execution_time", "return_code", "stdout", "stderr", "truncated"}
    assert round(st["execution_time"], 6) == st["execution_time"] < 5
    st, _ = exchange(w, "None", 10, 1000)
    assert st["stdout"] == ""
    st, _ = exchange(
        w, "import os, sys\nprint(os.getuid(), sys.path[0] == os.getcwd(), __name__)\nx", 10, 1000
    )
    assert st["stdout"] == "65534 True __main__\n20\n"
    st, _ = exchange(w, "'annotations' in globals()", 10, 1000)
    assert st["stdout"] == "False\n"
    for code, rc in (
        ("import sys\nsys.exit(3)", 3),
        ("raise SystemExit('m')", 1),
        ("raise SystemExit", 0),
        ("1/0", 1),
    ):
        st, alive = exchange(w, code, 10, 1000)
        assert (st["return_code"], alive) == (rc, True), code
    assert st["stderr"] == (
        'Traceback (most recent call last):\n  File "<session>", line 1, in '
        "<module>\nZeroDivisionError: division by zero\n"
    )
    st, _ = exchange(w, "def f(:", 10, 1000)
    assert st["return_code"] == 1 and "SyntaxError" in st["stderr"]


def test_python_worker_is_shown_the_actions_cores(monkeypatch, here) -> None:
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))  # noqa: SIM115
    w = _py(here)
    code = "import os\nos.cpu_count(), os.environ.get('TANGRAM_CPUS'), os.environ.get('OMP_NUM_THREADS')"
    w.show(2.5, {"TANGRAM_CPUS": "3", "OMP_NUM_THREADS": "3", "OTHER": "x"})
    assert w.shown == (3, {"TANGRAM_CPUS": "3", "OMP_NUM_THREADS": "3"})
    st, _ = exchange(w, code, 10, 1000)
    assert st["stdout"] == "(3, '3', '3')\n"
    w.show(3.0, {"TANGRAM_CPUS": "3", "OMP_NUM_THREADS": "3"})  # the same: nothing sent
    assert w._show is None
    w.show(0.2, {"TANGRAM_CPUS": "1"})
    assert w._show == (1, {"TANGRAM_CPUS": "1"})
    st, _ = exchange(w, code, 10, 1000)
    assert st["stdout"] == "(1, '1', '3')\n" and w._show is None


def test_show_rounds_up_and_keeps_only_the_cpu_vars() -> None:
    w = Worker.__new__(Worker)
    w.shown = w._show = None
    w.show(1.002, {"TANGRAM_CPUS": "1", "PATH": "/x"})
    assert w.shown == (2, {"TANGRAM_CPUS": "1"}) and w._show == w.shown
    w.show(1.0, {})
    assert w.shown == (1, {}) and w._show == (1, {})
    w.show(1.0, {})
    assert w._show is None
    assert session_worker.CPU_VARS == ("TANGRAM_CPUS", "OMP_NUM_THREADS")


def test_bash_worker(monkeypatch, here) -> None:
    w = Worker("bash", LIM, {"PATH": "/usr/bin:/bin", "HOME": "/"})
    here.append(w)
    st, alive = exchange(w, "A=5; echo $A; echo e >&2", 10, 1000)
    assert alive and (st["stdout"], st["stderr"], st["return_code"]) == ("5\n", "e\n", 0)
    st, _ = exchange(w, "echo $A $(id -u); false", 10, 1000)
    assert (st["stdout"], st["return_code"]) == ("5 65534\n", 1)
    st, _ = exchange(w, "(exit 7)", 10, 1000)
    assert st["return_code"] == 7
    st, _ = exchange(w, "cat; echo read-nothing", 10, 1000)  # stdin of the code: /dev/null
    assert st["stdout"] == "read-nothing\n"
    w.show(2.0, {"TANGRAM_CPUS": "2", "OMP_NUM_THREADS": "it's"})
    st, _ = exchange(w, 'echo $TANGRAM_CPUS "$OMP_NUM_THREADS"', 10, 1000)
    assert st["stdout"] == "2 it's\n"
    st, _ = exchange(w, "echo '__TANGRAM_EOF_x'\necho two", 10, 1000)
    assert st["stdout"] == "__TANGRAM_EOF_x\ntwo\n"
    st, alive = exchange(w, "exit 4", 10, 1000)  # the shell itself exits: state lost
    assert (st["return_code"], alive) == (-1, False)


def test_a_timeout_kills_the_worker(monkeypatch, here) -> None:
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))  # noqa: SIM115
    w = _py(here)
    t0 = time.monotonic()
    st, alive = exchange(w, "print('a', flush=True)\nimport time\ntime.sleep(30)", 0.5, 1000)
    assert 0.5 <= time.monotonic() - t0 < 3
    assert (st["status"], st["return_code"], alive) == ("TimeLimitExceeded", -signal.SIGKILL, False)
    assert st["stdout"] == "a\n"
    with pytest.raises(ChildProcessError):
        os.waitpid(w.pid, os.WNOHANG)  # reaped
    st, alive = exchange(w, "1", 5, 1000)  # gone: its pipe is closed
    assert st == {
        "status": "Error",
        "execution_time": st["execution_time"],
        "return_code": None,
        "stdout": "",
        "stderr": "session worker is gone\n",
        "truncated": False,
    }
    assert alive is False


def test_a_worker_that_dies_mid_exchange(monkeypatch, here) -> None:
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))  # noqa: SIM115
    w = _py(here)
    st, alive = exchange(w, "import os, sys\nprint('bye', flush=True)\nos._exit(9)", 10, 1000)
    assert (st["status"], st["return_code"], alive, st["stdout"]) == (
        "Finished",
        -1,
        False,
        "bye\n",
    )


@pytest.mark.parametrize(("n", "cut"), [(9, False), (10, True), (200_000, True)])
def test_the_output_cap(monkeypatch, here, n: int, cut: bool) -> None:
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))  # noqa: SIM115
    w = _py(here)
    st, _ = exchange(w, f"import sys\nprint('x' * {n})\nprint('y' * {n}, file=sys.stderr)", 10, 10)
    assert st["stdout"] == ("x" * n + "\n")[:10] and st["stderr"] == ("y" * n + "\n")[:10]
    assert st["truncated"] is cut


def test_a_worker_that_cannot_start_says_why(monkeypatch, here) -> None:
    monkeypatch.setattr(child, "CWD", "/nonexistent-t53")
    w = Worker("python", LIM, {})
    here.append(w)
    _, status = os.waitpid(w.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 127
    os.set_blocking(w.err, True)
    assert (
        os.read(w.err, 1000)
        == b"session worker failed: [Errno 2] No such file or directory: '/nonexistent-t53'\n"
    )
    st, alive = exchange(w, "1", 10, 1000)
    assert (
        alive is False and st["return_code"] is None and st["stderr"] == "session worker is gone\n"
    )
    w.pid = os.getpid() + 10**7  # (reaped above: nothing for kill to do)


def test_a_fork_refused_leaves_no_fd(monkeypatch) -> None:
    def no(*a):
        raise OSError(11, "EAGAIN")

    monkeypatch.setattr(session_worker.os, "fork", no)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError) as e:
        Worker("python", LIM, {})
    assert e.value.errno == 11
    assert set(os.listdir("/proc/self/fd")) == before


def test_no_worker_and_the_pids_message() -> None:
    st = session_worker.no_worker("bash")
    assert st["status"] == "Error" and st["return_code"] is None and st["stdout"] == ""
    assert st["truncated"] is False
    assert st["stderr"] == (
        "could not start the bash session process: the sandbox's process limit "
        "is reached: processes earlier actions of this session left running "
        "hold it; stop them (the bash session's `kill`) or open a new session\n"
    )


def test_parse_done() -> None:
    assert session_worker._parse_done("bash", bytearray(b"3")) is None
    assert session_worker._parse_done("bash", bytearray(b"3\n")) == 3
    assert session_worker._parse_done("bash", bytearray(b"\n")) == 1
    assert session_worker._parse_done("bash", bytearray(b"12\n7\n")) == 12
    frame = wire.encode({"rc": 5})
    assert session_worker._parse_done("python", bytearray(frame[:3])) is None
    assert session_worker._parse_done("python", bytearray(frame[:-1])) is None
    assert session_worker._parse_done("python", bytearray(frame)) == 5
    assert session_worker._parse_done("python", bytearray(frame + b"xx")) == 5


def test_read() -> None:
    r, w = os.pipe()
    os.set_blocking(r, False)
    assert session_worker._read(r) == b""  # nothing yet
    os.write(w, b"ab")
    assert session_worker._read(r) == b"ab"
    data = os.urandom(70000)
    import threading

    t = threading.Thread(target=lambda: os.write(w, data))
    t.start()
    got = b""
    while len(got) < len(data):
        got += session_worker._read(r)
    t.join()
    assert got == data
    os.write(w, b"z")
    os.close(w)
    assert session_worker._read(r) == b"z"
    assert session_worker._read(r) is None
    os.close(r)
    assert session_worker._read(r) == b""  # (a closed fd: OSError, nothing)


def test_stage() -> None:
    t0 = time.monotonic() - 1.25
    st = session_worker._stage("S", t0, 4, b"o\xff", b"e", True)
    assert st["status"] == "S" and st["return_code"] == 4 and st["truncated"] is True
    assert st["stdout"] == "o\ufffd" and st["stderr"] == "e"
    assert (
        1.25 <= st["execution_time"] < 3 and round(st["execution_time"], 6) == st["execution_time"]
    )


def test_bash_prelude() -> None:
    assert session_worker._BASH_PRELUDE == (
        '__tangram_run() { local __tangram_c; __tangram_c=$(cat); eval "$__tangram_c" </dev/null;'
        " printf '%d\\n' $? >&3; }\n"
    )


# ---- issue 43 item 2 (helper-61): the sample's survivors ----------------------------------------


def test_the_python_worker_exits_0_when_the_init_hangs_up(monkeypatch, here) -> None:
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))  # noqa: SIM115
    w = _py(here)
    st, alive = exchange(w, "1", 10, 1000)
    assert (st["stdout"], alive) == ("1\n", True)
    os.close(w.ctl)  # EOF on its fd 3: it exits 0 and says nothing
    _, status = os.waitpid(w.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert session_worker._read(w.err) is None
    w.pid = os.getpid() + 10**7  # (reaped above: nothing for kill to do)


def test_a_syntax_error_names_the_session(monkeypatch, here) -> None:
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))  # noqa: SIM115
    w = _py(here)
    st, alive = exchange(w, "x = 1\ndef f(:", 10, 1000)
    assert (st["return_code"], alive) == (1, True)
    assert '\n  File "<session>", line 2\n    def f(:\n' in st["stderr"]
    assert st["stderr"].endswith("SyntaxError: invalid syntax\n")


def test_a_flush_that_raises_is_ignored(monkeypatch, here) -> None:
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))  # noqa: SIM115
    w = _py(here)
    code = (
        "import sys\nclass Bad:\n    def write(self, s): return len(s)\n"
        "    def flush(self): raise ValueError('no')\nsys.stdout = Bad()"
    )
    st, alive = exchange(w, code, 10, 1000)
    assert (st["return_code"], alive, st["stderr"]) == (0, True, "")
    st, alive = exchange(w, "sys.stdout = sys.__stdout__\n7", 10, 1000)
    assert (st["stdout"], alive) == ("7\n", True)


def test_a_timeout_says_whether_output_was_cut(monkeypatch, here) -> None:
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))  # noqa: SIM115
    for n, cut in ((3, False), (30, True)):
        w = _py(here)
        code = f"print('x' * {n}, flush=True)\nimport time\ntime.sleep(30)"
        st, alive = exchange(w, code, 0.5, 10)
        assert (st["status"], alive, st["truncated"]) == ("TimeLimitExceeded", False, cut)
        assert st["stdout"] == ("x" * n + "\n")[:10]


def test_the_bash_heredoc_tag_is_not_a_plain_word(here) -> None:
    w = Worker("bash", LIM, {"PATH": "/usr/bin:/bin"})
    here.append(w)
    st, alive = exchange(w, "cat <<'X'\nNone\n__TANGRAM_EOF_\nX", 10, 1000)
    assert (st["stdout"], st["stderr"], st["return_code"], alive) == (
        "None\n__TANGRAM_EOF_\n",
        "",
        0,
        True,
    )


def test_a_bash_session_in_an_image_runs_its_shell(monkeypatch, here) -> None:
    monkeypatch.setattr(imagebox, "SHELL", ["bash", "--noprofile", "--norc"])
    w = Worker("bash", LIM, {"PATH": "/usr/bin:/bin", "MARK": "m1"})
    here.append(w)
    st, alive = exchange(w, 'echo "$0" "$MARK" "$PATH"', 10, 1000)
    assert (st["stdout"], st["return_code"], alive) == ("bash m1 /usr/bin:/bin\n", 0, True)


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="no /usr/bin/python3")
def test_a_python_session_in_an_image_runs_its_python(monkeypatch, here) -> None:
    monkeypatch.setattr(imagebox, "python", "/usr/bin/python3")
    w = Worker("python", LIM, {"MARK": "m2"})
    here.append(w)
    st, alive = exchange(
        w, "import os, sys\nos.environ['MARK'], sys.executable, sys.argv", 10, 1000
    )
    assert (st["stdout"], st["return_code"], alive) == (
        "('m2', '/usr/bin/python3', ['-c'])\n",
        0,
        True,
    )


def test_stage_replaces_bad_bytes_in_stderr_too() -> None:
    st = session_worker._stage("S", time.monotonic(), 0, b"", b"e\xfe", False)
    assert (st["stdout"], st["stderr"], st["truncated"]) == ("", "e\ufffd", False)
