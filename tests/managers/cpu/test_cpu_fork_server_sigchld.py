"""The fork server's SIGCHLD handler never nests (issue 40): Python runs a signal's handler
between two bytecodes, those of a running handler included, so 1,000 sessions ending within
2 s nested one reap in another until RecursionError ended the fork server
(benchmarks/bench_sessions.py --sessions 1000, at the close). In-process: the handler's rounds
with a fake reap, and a real SIGCHLD raised while it reaps."""

from __future__ import annotations

import signal
import socket
from typing import Any

import pytest

from arl_tangram.managers.cpu.zygote import server


def test_a_sigchld_while_it_reaps_is_one_more_round_not_a_nested_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ns, ctl = object(), object()
    h = server._Reaper(ns, ctl)  # type: ignore[arg-type]
    calls: list[tuple[object, object, bool, bool]] = []

    def reap(n: object, c: object) -> None:
        calls.append((n, c, h.busy, h.again))
        if len(calls) <= 2:
            h()  # (as Python runs it when a SIGCHLD comes now): noted, returns at once
            assert h.again and h.busy

    monkeypatch.setattr(server, "_reap", reap)
    h()
    assert calls == [(ns, ctl, True, False)] * 3  # two signals while it reaped: two more rounds
    assert not h.busy and not h.again
    h()
    assert len(calls) == 4 and not h.busy


def test_a_failed_reap_leaves_it_able_to_reap(monkeypatch: pytest.MonkeyPatch) -> None:
    h = server._Reaper(object(), object())  # type: ignore[arg-type]
    calls: list[int] = []

    def reap(n: object, c: object) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("once")

    monkeypatch.setattr(server, "_reap", reap)
    with pytest.raises(OSError):
        h()
    assert not h.busy
    h()
    assert calls == [1, 1] and not h.busy and not h.again


def test_real_signals_while_it_reaps_never_nest(monkeypatch: pytest.MonkeyPatch) -> None:
    h = server._Reaper(object(), object())  # type: ignore[arg-type]
    depth, most, calls = [0], [0], [0]

    def reap(n: object, c: object) -> None:
        depth[0] += 1
        most[0] = max(most[0], depth[0])
        calls[0] += 1
        if calls[0] <= 50:
            signal.raise_signal(signal.SIGCHLD)  # a child ends while it reaps
            sum(range(100))  # (bytecodes: where Python runs the handler)
        depth[0] -= 1

    monkeypatch.setattr(server, "_reap", reap)
    old = signal.signal(signal.SIGCHLD, h)
    try:
        h()
    finally:
        signal.signal(signal.SIGCHLD, old)
    assert (most[0], calls[0]) == (1, 51)


def test_serve_installs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    class Exited(Exception):
        pass

    def exit_(code: int) -> Any:
        raise Exited(code)

    a, b = socket.socketpair()
    b.close()  # the manager is gone: the loop ends at once
    ns = object()
    monkeypatch.setattr(server.os, "_exit", exit_)
    monkeypatch.setattr(server, "_on_sigchld", None)
    old = signal.getsignal(signal.SIGCHLD)
    try:
        with pytest.raises(Exited):
            server._serve(a, {}, ns)  # type: ignore[arg-type]
        h = server._on_sigchld
        assert isinstance(h, server._Reaper) and (h.ns, h.ctl) == (ns, a)
        assert signal.getsignal(signal.SIGCHLD) is h
    finally:
        signal.signal(signal.SIGCHLD, old)
        a.close()
