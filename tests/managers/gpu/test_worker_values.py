"""Exact values of the model process's handle and loop (`managers/gpu/worker.py`), in process.

The real child runs `serve` out of mutmut's sight (a fork of the fork server); here each piece runs
in the test process with stand-ins for the pipe, the process, libc and torch: which errors end an
instance, the reply tuples of ``load`` / ``to`` / ``score`` and of an error, the measured seconds,
the exit-status texts, the signal sent and the process's start arguments (issue 43 item 2).
"""

from __future__ import annotations

import signal
from typing import Any

import pytest

from arl_tangram.core.errors import BrokenError
from arl_tangram.managers.gpu import scoring, worker

# ---- kills_instance ------------------------------------------------------------------------


def test_sticky_markers_and_preload_list() -> None:
    assert worker._STICKY == (
        "CUDA error",
        "illegal memory access",
        "device-side assert",
        "unspecified launch failure",
        "uncorrectable ECC error",
    )
    assert worker._PRELOAD == ["arl_tangram.managers.gpu._preload"]
    assert worker._CTX.get_start_method() == "forkserver"


@pytest.mark.parametrize("marker", worker._STICKY)
def test_each_sticky_marker_kills_the_instance(marker: str) -> None:
    assert worker.kills_instance(RuntimeError(f"x {marker} y")) is True


def test_which_errors_end_an_instance() -> None:
    assert worker.kills_instance(KeyboardInterrupt()) is True
    assert worker.kills_instance(SystemExit(0)) is True
    accel = type("AcceleratorError", (Exception,), {})
    assert worker.kills_instance(accel("anything")) is True
    other = type("AcceleratorErrorX", (Exception,), {})
    assert worker.kills_instance(other("anything")) is False
    assert worker.kills_instance(RuntimeError("CUDA error: out of memory")) is False
    assert worker.kills_instance(RuntimeError("CUDA out of memory")) is False
    assert worker.kills_instance(RuntimeError("shape mismatch")) is False
    assert worker.kills_instance(ValueError("")) is False
    assert issubclass(worker.WorkerGone, Exception) and issubclass(worker.WorkerTimeout, Exception)


# ---- start_fork_server ---------------------------------------------------------------------


def test_start_fork_server_sets_the_preload_then_ensures_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from multiprocessing import forkserver

    calls: list[Any] = []

    class Ctx:
        def set_forkserver_preload(self, mods: list[str]) -> None:
            calls.append(("preload", list(mods)))

    monkeypatch.setattr(worker, "_CTX", Ctx())
    monkeypatch.setattr(forkserver, "ensure_running", lambda: calls.append("ensure"))
    worker.start_fork_server()
    assert calls == [("preload", ["arl_tangram.managers.gpu._preload"]), "ensure"]


# ---- the handle ----------------------------------------------------------------------------


class Conn:
    def __init__(self, *, poll: bool = True, reply: Any = ("ok",), fail: Any = None) -> None:
        self.sent: list[Any] = []
        self.polled: list[Any] = []
        self._poll, self._reply, self._fail = poll, reply, fail
        self.closed = False

    def send(self, msg: Any) -> None:
        if self._fail == "send":
            raise OSError("broken pipe")
        self.sent.append(msg)

    def poll(self, timeout: Any) -> bool:
        self.polled.append(timeout)
        return self._poll

    def recv(self) -> Any:
        if self._fail == "recv":
            raise EOFError
        return self._reply

    def close(self) -> None:
        self.closed = True


class Proc:
    def __init__(self, exitcode: int | None = None, alive: bool = True) -> None:
        self.exitcode = exitcode
        self._alive = alive
        self.joins: list[Any] = []

    def join(self, *a: Any) -> None:
        self.joins.append(a)

    def is_alive(self) -> bool:
        return self._alive


def _handle_of(conn: Any = None, proc: Any = None, pid: int = 4242) -> worker.Worker:
    w = worker.Worker.__new__(worker.Worker)
    w.conn, w.proc, w.pid = conn or Conn(), proc or Proc(), pid
    return w


def test_call_sends_polls_and_returns_the_reply() -> None:
    conn = Conn(reply=("ok", 1.5))
    w = _handle_of(conn)
    assert w.call(("score", ["a"]), timeout=2.5) == ("ok", 1.5)
    assert conn.sent == [("score", ["a"])] and conn.polled == [2.5]
    conn2 = Conn(reply=("ok",))
    assert _handle_of(conn2).call(("to",)) == ("ok",)
    assert conn2.polled == [None]


def test_call_without_reply_raises_timeout_with_the_deadline() -> None:
    with pytest.raises(worker.WorkerTimeout) as got:
        _handle_of(Conn(poll=False)).call(("score", []), timeout=0.25)
    assert str(got.value) == "no reply within 0.25 s"
    assert not isinstance(got.value, worker.WorkerGone)


@pytest.mark.parametrize("fail", ["send", "recv"])
def test_call_on_a_closed_pipe_raises_gone_with_the_exit(fail: str) -> None:
    proc = Proc(exitcode=-9)
    with pytest.raises(worker.WorkerGone) as got:
        _handle_of(Conn(fail=fail), proc, pid=77).call(("score", []), timeout=1.0)
    assert str(got.value) == "process 77 was killed by SIGKILL"
    assert proc.joins == [(5,)]


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (None, "process 7 closed its pipe but is still running"),
        (-11, "process 7 was killed by SIGSEGV"),
        (-1, "process 7 was killed by SIGHUP"),
        (-200, "process 7 was killed by signal 200"),
        (0, "process 7 exited with status 0"),
        (3, "process 7 exited with status 3"),
    ],
)
def test_ended_names_the_exit(code: int | None, text: str) -> None:
    proc = Proc(exitcode=code)
    assert _handle_of(proc=proc, pid=7).ended() == text
    assert proc.joins == [(5,)]


def test_alive_asks_the_process() -> None:
    assert _handle_of(proc=Proc(alive=True)).alive() is True
    assert _handle_of(proc=Proc(alive=False)).alive() is False


def test_kill_signals_only_a_running_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    sent: list[Any] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
    _handle_of(proc=Proc(None), pid=11).kill()
    _handle_of(proc=Proc(None), pid=12).kill(signal.SIGTERM)
    _handle_of(proc=Proc(0), pid=13).kill()
    _handle_of(proc=Proc(-9), pid=14).kill()
    assert sent == [(11, signal.SIGKILL), (12, signal.SIGTERM)]

    def gone(pid: int, sig: int) -> None:
        raise ProcessLookupError

    monkeypatch.setattr(os, "kill", gone)
    _handle_of(proc=Proc(None), pid=15).kill()  # (no error)


def test_stop_kills_reaps_and_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    sent: list[Any] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
    conn, proc = Conn(), Proc(None)
    _handle_of(conn, proc, pid=21).stop()
    assert sent == [(21, signal.SIGKILL)] and proc.joins == [()] and conn.closed


def test_init_starts_the_child_with_serve_on_its_pipe_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: dict[str, Any] = {}
    parent, child = Conn(), Conn()

    class P:
        pid: int | None = 321
        sentinel = 9

        def __init__(self, **kw: Any) -> None:
            made["kw"] = kw
            self.started = False
            made["proc"] = self

        def start(self) -> None:
            self.started = True
            assert not child.closed  # closed only after the start

    class Ctx:
        def Pipe(self) -> tuple[Conn, Conn]:
            return parent, child  # (the current pair)

        Process = P

    started: list[int] = []
    monkeypatch.setattr(worker, "start_fork_server", lambda: started.append(1))
    monkeypatch.setattr(worker, "_CTX", Ctx())
    w = worker.Worker()
    assert started == [1]
    assert made["kw"] == {
        "target": worker.serve,
        "args": (child,),
        "daemon": True,
        "name": "tangram-model",
    }
    assert made["proc"].started and child.closed and not parent.closed
    assert w.conn is parent and w.proc is made["proc"]
    assert w.pid == 321 and type(w.pid) is int and w.sentinel == 9
    P.pid = None
    parent, child = Conn(), Conn()
    assert worker.Worker().pid == 0


# ---- the child -----------------------------------------------------------------------------


def test_die_with_parent_asks_for_sigkill(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes

    calls: list[Any] = []

    class Libc:
        def prctl(self, *a: Any) -> None:
            calls.append(("prctl", a))

    def cdll(name: Any, **kw: Any) -> Libc:
        calls.append(("cdll", name, kw))
        return Libc()

    monkeypatch.setattr(ctypes, "CDLL", cdll)
    worker._die_with_parent()
    assert calls == [("cdll", None, {"use_errno": True}), ("prctl", (1, signal.SIGKILL))]

    for exc in (OSError, AttributeError):

        def bad(name: Any, _e: Any = exc, **kw: Any) -> Any:
            raise _e("no libc")

        monkeypatch.setattr(ctypes, "CDLL", bad)
        worker._die_with_parent()  # (no error)


class ChildConn:
    def __init__(self, msgs: list[Any], end: type[BaseException] = EOFError) -> None:
        self.msgs, self.end, self.sent = list(msgs), end, []

    def recv(self) -> Any:
        if not self.msgs:
            raise self.end
        return self.msgs.pop(0)

    def send(self, msg: Any) -> None:
        self.sent.append(msg)


def _serve(monkeypatch: pytest.MonkeyPatch, conn: ChildConn, handle: Any) -> list[str]:
    order: list[str] = []
    monkeypatch.setattr(worker, "_die_with_parent", lambda: order.append("pdeath"))
    monkeypatch.setattr(worker, "_handle", handle)
    worker.serve(conn)  # type: ignore[arg-type]
    return order


@pytest.mark.parametrize("end", [EOFError, OSError])
def test_serve_replies_once_per_request_until_the_pipe_ends(
    monkeypatch: pytest.MonkeyPatch, end: type[BaseException]
) -> None:
    import torch

    seen: list[Any] = []

    def handle(t: Any, state: dict[str, Any], msg: Any) -> Any:
        assert t is torch
        state["n"] = state.get("n", 0) + 1
        seen.append(msg)
        if msg[0] == "bad":
            raise RuntimeError("CUDA error: illegal memory access")
        if msg[0] == "oom":
            raise RuntimeError("CUDA out of memory")
        if msg[0] == "broken":
            raise BrokenError("gone")
        return ("ok", state["n"])

    conn = ChildConn([("a",), ("bad",), ("oom",), ("broken",), ("b",)], end)
    assert _serve(monkeypatch, conn, handle) == ["pdeath"]
    assert conn.sent == [
        ("ok", 1),
        ("error", True, "RuntimeError: CUDA error: illegal memory access", False),
        ("error", False, "RuntimeError: CUDA out of memory", False),
        ("error", False, "BrokenError: gone", True),
        ("ok", 5),
    ]


@pytest.mark.parametrize(
    ("exc", "text"),
    [
        (KeyboardInterrupt(), "KeyboardInterrupt"),
        (SystemExit("bye"), "SystemExit: bye"),
        (SystemExit("FIX"), "SystemExit: FIX"),  # (only ": " is stripped, at the end)
    ],
)
def test_serve_reports_a_base_exception_then_ends(
    monkeypatch: pytest.MonkeyPatch, exc: BaseException, text: str
) -> None:
    def handle(t: Any, state: Any, msg: Any) -> Any:
        raise exc

    conn = ChildConn([("x",), ("never",)])
    with pytest.raises(type(exc)):
        _serve(monkeypatch, conn, handle)
    assert conn.sent == [("error", True, text, False)]
    assert conn.msgs == [("never",)]


# ---- _handle with a stand-in torch ---------------------------------------------------------


class Dev:
    def __init__(self, spec: str) -> None:
        self.spec, self.type = spec, spec.split(":")[0]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Dev) and other.spec == self.spec

    def __hash__(self) -> int:
        return hash(self.spec)


class Torch:
    def __init__(self) -> None:
        self.log: list[Any] = []
        self.threads = 5
        torch = self

        class Cuda:
            def synchronize(self, dev: Dev) -> None:
                torch.log.append(("sync", dev.spec))

            def empty_cache(self) -> None:
                torch.log.append("empty_cache")

        self.cuda = Cuda()

    def set_num_threads(self, n: int) -> None:
        self.log.append(("threads", n))
        self.threads = n

    def get_num_threads(self) -> int:
        return self.threads

    def device(self, spec: str) -> Dev:
        return Dev(spec)


class Tensor:
    def __init__(self, log: list[Any], name: str, dev: str = "cpu", n: int = 1, size: int = 4):
        self.log, self.name, self.device = log, name, Dev(dev)
        self.data: Any = self
        self._n, self._size = n, size

    def pin_memory(self) -> str:
        self.log.append(("pin", self.name))
        return f"pinned-{self.name}"

    def numel(self) -> int:
        return self._n

    def element_size(self) -> int:
        return self._size


class Model:
    def __init__(self, log: list[Any], dev: str = "cpu") -> None:
        self.log = log
        self.params = [Tensor(log, "w", dev, 3, 4), Tensor(log, "b", dev, 5, 2)]
        self.bufs = [Tensor(log, "buf", dev, 7, 8)]

    def parameters(self) -> Any:
        return iter(self.params)

    def buffers(self) -> Any:
        return iter(self.bufs)

    def to(self, dev: Dev, **kw: Any) -> None:
        self.log.append(("to", dev.spec, kw))


def _clock(monkeypatch: pytest.MonkeyPatch, *ticks: float) -> None:
    it = iter(ticks)
    monkeypatch.setattr(worker.time, "perf_counter", lambda: next(it))


def test_score_returns_outputs_and_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    class S:
        def score(self, reqs: Any) -> list[float]:
            return [len(reqs) * 0.5]

    _clock(monkeypatch, 10.0, 12.5)
    assert worker._handle(Torch(), {"scorer": S()}, ("score", ["a", "b"])) == ("ok", [1.0], 2.5)


@pytest.mark.parametrize(("device", "sync"), [("cpu", []), ("cuda:1", [("sync", "cuda:1")])])
def test_load_builds_the_scorer_and_reports_seconds_size_threads(
    monkeypatch: pytest.MonkeyPatch, device: str, sync: list[Any]
) -> None:
    import cloudpickle

    t = Torch()
    model = Model(t.log)
    got: dict[str, Any] = {}

    def cold_load(spec: Any, factory: Any, dev: Dev) -> tuple[Any, Any]:
        got["cold"] = (spec, factory, dev.spec)
        t.log.append("cold_load")
        return model, "tok"

    class Scorer:
        def __init__(self, spec: Any, m: Any, tok: Any, **kw: Any) -> None:
            got["scorer"] = (spec, m, tok, kw)

    monkeypatch.setattr(scoring, "cold_load", cold_load)
    monkeypatch.setattr(scoring, "Scorer", Scorer)
    _clock(monkeypatch, 100.0, 103.25)
    state: dict[str, Any] = {}
    msg = ("load", "SPEC", cloudpickle.dumps(len), device, 3, 128, 4096)
    reply = worker._handle(t, state, msg)
    mb = (3 * 4 + 5 * 2 + 7 * 8) / 2**20
    assert reply == ("ok", 3.25, mb, 3)
    assert type(reply[2]) is float
    assert got["cold"] == ("SPEC", len, device)
    assert got["scorer"] == ("SPEC", model, "tok", {"max_length": 128, "max_tokens": 4096})
    assert isinstance(state["scorer"], Scorer)
    assert t.log == [("threads", 3), "cold_load", *sync]

    _clock(monkeypatch, 0.0, 1.0)
    worker._handle(t, {}, ("load", "SPEC", None, "cpu", 2, 8, 9))
    assert got["cold"] == ("SPEC", None, "cpu")


def test_weights_mb_counts_parameters_and_buffers() -> None:
    import torch

    m = torch.nn.Linear(3, 4)  # 12 + 4 float32
    m.register_buffer("extra", torch.zeros(8, dtype=torch.float64))
    assert worker._weights_mb(m) == (16 * 4 + 8 * 8) / 2**20
    assert type(worker._weights_mb(m)) is float


def test_to_park_pinned_moves_pins_and_empties_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    t = Torch()
    model = Model(t.log, "cuda:0")
    _clock(monkeypatch, 5.0, 5.75)
    reply = worker._handle(t, {"scorer": type("S", (), {"model": model})()}, ("to", "cpu", 4, True))
    assert reply == ("ok", 0.75, 4)
    assert t.log == [
        ("threads", 4),
        ("to", "cpu", {"non_blocking": True}),
        ("pin", "w"),
        ("pin", "b"),
        ("pin", "buf"),
        "empty_cache",
    ]
    assert [p.data for p in model.params + model.bufs] == ["pinned-w", "pinned-b", "pinned-buf"]


def test_to_park_unpinned_and_swap_in(monkeypatch: pytest.MonkeyPatch) -> None:
    t = Torch()
    s = type("S", (), {"model": Model(t.log, "cuda:0")})()
    _clock(monkeypatch, 1.0, 1.5)
    assert worker._handle(t, {"scorer": s}, ("to", "cpu", 0, False)) == ("ok", 0.5, 5)
    assert t.log == [("to", "cpu", {"non_blocking": True})]

    t2 = Torch()
    s2 = type("S", (), {"model": Model(t2.log, "cpu")})()
    _clock(monkeypatch, 2.0, 4.0)
    assert worker._handle(t2, {"scorer": s2}, ("to", "cuda:0", 2, True)) == ("ok", 2.0, 2)
    assert t2.log == [("threads", 2), ("to", "cuda:0", {"non_blocking": True}), ("sync", "cuda:0")]


def test_to_where_it_already_is_moves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    t = Torch()
    s = type("S", (), {"model": Model(t.log, "cpu")})()
    _clock(monkeypatch, 1.0, 1.125)
    assert worker._handle(t, {"scorer": s}, ("to", "cpu", 0, True)) == ("ok", 0.125, 5)
    assert t.log == []


def test_unknown_request_is_named() -> None:
    with pytest.raises(ValueError, match=r"^model process: unknown request 'park'$"):
        worker._handle(Torch(), {}, ("park",))
