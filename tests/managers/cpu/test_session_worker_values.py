"""Exact values of a session's persistent workers (`sandbox/session_worker.py`, issue 43), forked
from the test process (so a mutant runs in the worker too): the Python worker's echo of a last
expression, kept state, exit codes, tracebacks, the cores shown per exchange; the bash worker's
exit statuses, exports and kept state; the time limit, a worker that dies, the output cap's
edge, a worker already gone, and the pure helpers (`show`, `_parse_done`, `_read`, `_stage`)."""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import time
from types import SimpleNamespace

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
    assert exchange(w, "1", 30, 1000)[1] is True  # (up and answering before the timed request)
    t0 = time.monotonic()
    st, alive = exchange(w, "print('a', flush=True)\nimport time\ntime.sleep(30)", 1.0, 1000)
    assert 1.0 <= time.monotonic() - t0 < 10
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
        assert exchange(w, "1", 30, 10)[1] is True  # (up and answering before the timed request)
        code = f"print('x' * {n}, flush=True)\nimport time\ntime.sleep(30)"
        st, alive = exchange(w, code, 1.0, 10)
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


# ---- issue 43 item 2 (helper-63): the rest's survivors -------------------------------------------


def test_the_python_worker_replaces_only_the_first_path_entry(monkeypatch, here) -> None:
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "path", ["/first", "/second", "/third"])
    w = _py(here)
    st, _ = exchange(w, "import sys\nsys.path", 10, 1000)
    assert st["stdout"] == repr([child.WORKDIR, "/second", "/third"]) + "\n"


def test_a_statement_that_raises_names_the_session(monkeypatch, here) -> None:
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))  # noqa: SIM115
    w = _py(here)
    st, alive = exchange(w, "x = 1\ny = 1 / 0", 10, 1000)
    assert (st["return_code"], alive) == (1, True)
    assert st["stderr"] == (
        'Traceback (most recent call last):\n  File "<session>", line 2, in '
        "<module>\nZeroDivisionError: division by zero\n"
    )


def test_the_code_does_not_inherit_the_modules_future_import(monkeypatch, here) -> None:
    # (session_worker.py has `from __future__ import annotations`: inherited, the code's
    # annotations would be strings)
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))  # noqa: SIM115
    w = _py(here)
    st, _ = exchange(w, "def f(x: int) -> None:\n    pass\nf.__annotations__", 10, 1000)
    assert st["stdout"] == "{'x': <class 'int'>, 'return': None}\n"


class _FdsOpen:
    """Fds ``nums`` open and inheritable in the test process while inside (/dev/null where one
    is not open), so that a worker that kept one would show it, after an exec too."""

    def __init__(self, *nums: int) -> None:
        self.nums, self.made, self.was = nums, [], {}

    def __enter__(self):
        for n in self.nums:
            try:
                self.was[n] = os.get_inheritable(n)
            except OSError:
                null = os.open("/dev/null", os.O_RDONLY)
                os.dup2(null, n)
                os.close(null)
                self.made.append(n)
            os.set_inheritable(n, True)
        return self

    def __exit__(self, *a):
        for n in self.made:
            os.close(n)
        for n, was in self.was.items():
            os.set_inheritable(n, was)
        return False


_ISOPEN = (
    "import os\ndef isopen(f):\n    try:\n        os.fstat(f)\n        return True\n"
    "    except OSError:\n        return False\n"
)


def test_the_bash_worker_runs_as_bin_bash_with_only_fds_0_to_3(here) -> None:
    with _FdsOpen(4, 5, 6):
        w = Worker("bash", LIM, {"PATH": "/usr/bin:/bin"})
        here.append(w)
        st, alive = exchange(
            w,
            'echo "$0"; for f in 3 4 5 6; do [ -e /proc/$$/fd/$f ] && echo $f; done; true',
            10,
            1000,
        )
    assert (st["stdout"], st["return_code"], alive) == ("/bin/bash\n3\n", 0, True)


def test_the_python_worker_keeps_only_fds_3_and_4(monkeypatch, here) -> None:
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))  # noqa: SIM115
    with _FdsOpen(5, 6, 7):
        w = _py(here)
        st, alive = exchange(w, _ISOPEN + "[f for f in range(3, 10) if isopen(f)]", 10, 1000)
    assert (st["stdout"], st["return_code"], alive) == ("[3, 4]\n", 0, True)


def test_the_python_workers_globals_are_name_and_the_builtins_module(monkeypatch, here) -> None:
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))  # noqa: SIM115
    w = _py(here)
    st, _ = exchange(w, "sorted(globals())", 10, 1000)
    assert st["stdout"] == "['__builtins__', '__name__']\n"
    st, _ = exchange(w, "import builtins\n__builtins__ is builtins", 10, 1000)
    assert st["stdout"] == "True\n"


def test_a_worker_whose_code_closes_its_stdout_lives_on(monkeypatch, here) -> None:
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))  # noqa: SIM115
    w = _py(here)
    st, alive = exchange(w, "import os\nos.close(1)\nx = 4", 10, 1000)
    assert (st["status"], st["return_code"], st["stdout"], alive) == ("Finished", 0, "", True)
    st, alive = exchange(w, "import sys\nprint(x, file=sys.stderr)", 10, 1000)
    assert (st["return_code"], st["stderr"], alive) == (0, "4\n", True)


def test_a_cut_stdout_stays_cut_after_stderr_that_fits(monkeypatch, here) -> None:
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))  # noqa: SIM115
    w = _py(here)
    code = (
        "import os, sys, time\nprint('x' * 20, flush=True)\ntime.sleep(0.3)\nn = os.write(2, b'e')"
    )
    st, alive = exchange(w, code, 10, 10)
    assert (st["stdout"], st["stderr"], st["truncated"], alive) == ("x" * 10, "e", True, True)


class _Stub:
    """A python worker's pipes with a stub selector: ``rounds`` is what each wake-up writes first
    (``(out, done)`` bytes) and the one fd it reports ("out" or "done")."""

    def __init__(self, monkeypatch, first: bytes, rounds: list) -> None:
        self.fds = []
        (out_r, out_w), (err_r, err_w), (done_r, done_w) = os.pipe(), os.pipe(), os.pipe()
        self.fds = [out_r, out_w, err_r, err_w, done_r, done_w]
        for fd in (out_r, err_r, done_r):
            os.set_blocking(fd, False)
        self.killed = 0
        self.w = SimpleNamespace(lang="python", out=out_r, err=err_r, done=done_r)
        self.w.send = lambda code: os.write(out_w, first)
        self.w.kill = lambda: setattr(self, "killed", self.killed + 1)
        self.timeouts = []
        stub = self

        class Sel:
            def __enter__(self):
                return self

            def __exit__(self, *a):
                return False

            def register(self, fd, events):
                pass

            def unregister(self, fd):
                pass

            def select(self, timeout):
                stub.timeouts.append(timeout)
                out, done, which = rounds[len(stub.timeouts) - 1]
                os.write(out_w, out)
                os.write(done_w, done)
                return [(SimpleNamespace(fd=out_r if which == "out" else done_r), 1)]

        monkeypatch.setattr(session_worker.selectors, "DefaultSelector", Sel)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


@pytest.mark.parametrize(
    ("first", "rest", "stdout", "cut"),
    [
        (b"abc", b"defgh", "abcde", True),
        (b"abcdefg", b"hij", "abcde", True),
        (b"ab", b"cd", "abcd", False),
    ],
)
def test_output_drained_after_the_completion_mark_is_cut_at_the_cap(
    monkeypatch, first, rest, stdout, cut
) -> None:
    # (the first wake-up sees stdout only, the second the completion mark; stdout's rest is then
    # in the pipe, read by the drain after the loop)
    s = _Stub(monkeypatch, first, [(b"", b"", "out"), (rest, wire.encode({"rc": 0}), "done")])
    st, alive = exchange(s.w, "x", 10, 5)
    s.close()
    assert len(s.timeouts) == 2 and alive is True and s.killed == 0
    assert (st["status"], st["return_code"], st["stdout"], st["stderr"], st["truncated"]) == (
        "Finished",
        0,
        stdout,
        "",
        cut,
    )


def test_a_completion_mark_read_in_two_parts(monkeypatch) -> None:
    frame = wire.encode({"rc": 3})
    s = _Stub(monkeypatch, b"o", [(b"", frame[:5], "done"), (b"", frame[5:], "done")])
    st, alive = exchange(s.w, "x", 10, 100)
    s.close()
    assert len(s.timeouts) == 2 and alive is True
    assert (st["status"], st["return_code"], st["stdout"]) == ("Finished", 3, "o")


def test_the_deadline_reached_exactly_kills(monkeypatch) -> None:
    # (a fixed clock: the exchange starts at 100 and every later reading is 100 + the timeout)
    clock = iter([100.0])
    monkeypatch.setattr(
        session_worker, "time", SimpleNamespace(monotonic=lambda: next(clock, 105.0))
    )
    s = _Stub(monkeypatch, b"", [(b"", wire.encode({"rc": 0}), "done")])
    st, alive = exchange(s.w, "x", 5.0, 100)
    s.close()
    assert s.timeouts == [] and s.killed == 1 and alive is False
    assert (st["status"], st["return_code"], st["stdout"], st["execution_time"]) == (
        "TimeLimitExceeded",
        -signal.SIGKILL,
        "",
        5.0,
    )
    assert st["truncated"] is False


@pytest.mark.parametrize(
    ("written", "cap", "stdout", "cut"),
    [(b"tail", 100, "tail", False), (b"tail", 4, "tail", False), (b"tail", 2, "ta", True)],
)
def test_output_written_before_the_deadline_is_kept(monkeypatch, written, cap, stdout, cut) -> None:
    # (the deadline passes before any wake-up: what the code wrote is still in the pipe, and a
    # timed-out run returns it, cut at the cap, as a finished one does)
    clock = iter([100.0])
    monkeypatch.setattr(
        session_worker, "time", SimpleNamespace(monotonic=lambda: next(clock, 105.0))
    )
    s = _Stub(monkeypatch, written, [])
    st, alive = exchange(s.w, "x", 5.0, cap)
    s.close()
    assert s.timeouts == [] and s.killed == 1 and alive is False
    assert (st["status"], st["stdout"], st["stderr"], st["truncated"]) == (
        "TimeLimitExceeded",
        stdout,
        "",
        cut,
    )


def test_read_takes_all_a_grown_pipe_holds_and_eof_after_a_full_read() -> None:
    r, w = os.pipe()
    os.set_blocking(r, False)
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 18)
    data = os.urandom(100_000)
    os.write(w, data)
    assert session_worker._read(r) == data  # 65,536 bytes, then the rest, in one call
    data = os.urandom(1 << 16)
    os.write(w, data)
    os.close(w)
    assert session_worker._read(r) == data  # a full read, then end of file: the bytes
    assert session_worker._read(r) is None
    os.close(r)


@pytest.mark.timeout(60)
def test_a_worker_killed_before_its_own_session_dies_and_is_reaped(monkeypatch, here) -> None:
    # its child stops before `child.setup`'s setsid: no process group of its pid exists yet, so
    # the group's kill finds nothing, and the worker itself must still be killed and reaped
    monkeypatch.setattr(child, "setup", lambda *a, **k: time.sleep(3600))
    w = Worker("python", LIM, {})
    w.kill()  # (before the fix: waited for ever, then this test's timeout)
    with pytest.raises(ChildProcessError):
        os.waitpid(w.pid, os.WNOHANG)  # reaped


def test_a_worker_reaped_before_its_kill_signals_nothing_and_closes_its_pipes(
        monkeypatch, here) -> None:
    # init's `_reap_all` reaps a worker that ended between two requests; its pid may then name
    # another process (another language's worker): the kill goes through the pidfd, which finds
    # it gone, so neither the pid nor a group of it is signalled
    w = Worker("python", LIM, {})
    assert os.readlink(f"/proc/self/fd/{w.pidfd}") == "anon_inode:[pidfd]"
    os.kill(w.pid, signal.SIGKILL)
    os.waitpid(w.pid, 0)
    groups = []
    monkeypatch.setattr(child, "killpg", groups.append)
    w.kill()
    assert groups == []
    for fd in (w.pidfd, w.ctl, w.done, w.out, w.err):
        with pytest.raises(OSError):
            os.fstat(fd)


def test_a_live_workers_kill_takes_its_group_then_reaps_it_once(monkeypatch, here) -> None:
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))  # noqa: SIM115
    w = Worker("python", LIM, {})
    fds = (w.pidfd, w.ctl, w.done, w.out, w.err)
    st, alive = exchange(w, "1", 10, 1000)  # (past its setsid: a group of its pid exists)
    assert alive and st["stdout"] == "1\n"
    groups = []
    killpg = child.killpg
    monkeypatch.setattr(child, "killpg", lambda g: (groups.append(g), killpg(g)))
    w.kill()
    assert groups == [w.pid]
    with pytest.raises(ChildProcessError):
        os.waitpid(w.pid, os.WNOHANG)  # reaped
    assert w.pidfd == -1
    r, x = os.pipe()  # (takes the lowest free fd: one of the worker's, closed)
    assert r in fds
    w.kill()  # a second kill: nothing signalled, nothing closed (the pipe is still open)
    assert groups == [w.pid]
    os.write(x, b"k")
    assert os.read(r, 1) == b"k"
    os.close(r)
    os.close(x)
