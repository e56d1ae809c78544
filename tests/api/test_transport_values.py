"""The transport's joining of writes and the connection guard's caps, exact (issue 43 item 2):
`api/transport.py` over stand-in transports, loops, protocols and clocks (no socket, no uvicorn
server): which bytes go out in which write, which connection is dropped when and how (abort or
close), and when the guard asks to look again.
"""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace
from typing import Any

import pytest

from arl_tangram.api import transport as T


class Handle:
    def __init__(self, when: float, fn: Any) -> None:
        self.when, self.fn, self.cancelled = when, fn, False

    def cancel(self) -> None:
        self.cancelled = True


class Loop:
    def __init__(self) -> None:
        self.now = 0.0
        self.soon: list[Any] = []
        self.later: list[Handle] = []
        self.at: list[tuple[float, Any]] = []

    def call_soon(self, fn: Any) -> None:
        self.soon.append(fn)

    def call_later(self, delay: float, fn: Any) -> Handle:
        h = Handle(self.now + delay, fn)
        self.later.append(h)
        return h

    def call_at(self, when: float, fn: Any) -> None:
        self.at.append((when, fn))

    def time(self) -> float:
        return self.now


class Transport:
    def __init__(self, peer: Any = ("10.0.0.1", 5000), sock: Any = None) -> None:
        self.writes: list[bytes] = []
        self.closing = False
        self.events: list[str] = []
        self.peer, self.sock = peer, sock
        self.buffered = 7

    def write(self, data: bytes) -> None:
        assert isinstance(data, bytes)
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closing

    def write_eof(self) -> None:
        self.events.append("eof")

    def close(self) -> None:
        self.events.append("close")
        self.closing = True

    def abort(self) -> None:
        self.events.append("abort")
        self.closing = True

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def get_extra_info(self, name: str) -> Any:
        return {"peername": self.peer, "socket": self.sock}.get(name)


# ---- one write per small response -----------------------------------------------------------


def test_a_write_is_held_until_the_next_which_joins_it() -> None:
    t, loop = Transport(), Loop()
    c = T.CoalescingTransport(t, loop)
    c.write(bytearray(b"HTTP/1.1 200 OK\r\n\r\n"))
    assert t.writes == [] and loop.soon == [c.flush]
    assert c.get_write_buffer_size() == 7 + 19
    c.write(memoryview(b"{}"))
    assert t.writes == [b"HTTP/1.1 200 OK\r\n\r\n{}"]
    assert c.get_write_buffer_size() == 7
    c.flush()  # (the scheduled flush: nothing held)
    assert t.writes == [b"HTTP/1.1 200 OK\r\n\r\n{}"]
    c.write(b"a")
    c.write(b"b")
    c.write(b"c")  # (held again after a joined pair)
    assert t.writes[1:] == [b"ab"] and len(loop.soon) == 3
    loop.soon[-1]()
    assert t.writes[1:] == [b"ab", b"c"]


def test_a_held_write_goes_out_at_the_end_of_the_step_unless_the_peer_is_gone() -> None:
    t, loop = Transport(), Loop()
    c = T.CoalescingTransport(t, loop)
    c.writelines([b"x", b"y", b"z"])
    loop.soon[0]()
    assert t.writes == [b"xyz"]
    c.write(b"late")
    t.closing = True
    loop.soon[1]()
    assert t.writes == [b"xyz"] and c.get_write_buffer_size() == 7  # (dropped)


def test_close_and_write_eof_flush_first_and_abort_drops_the_held_write() -> None:
    t, loop = Transport(), Loop()
    c = T.CoalescingTransport(t, loop)
    c.write(b"h")
    c.write_eof()
    assert t.writes == [b"h"] and t.events == ["eof"]
    c.write(b"i")
    c.close()
    assert t.writes == [b"h", b"i"] and t.events == ["eof", "close"]
    t2 = Transport()
    c2 = T.CoalescingTransport(t2, Loop())
    c2.write(b"j")
    c2.abort()
    c2.flush()
    assert t2.writes == [] and t2.events == ["abort"] and c2.get_write_buffer_size() == 7
    assert c2.is_closing() is True and c2.get_extra_info("peername") == ("10.0.0.1", 5000)


def test_an_empty_held_write_is_not_written() -> None:
    t = Transport()
    c = T.CoalescingTransport(t, Loop())
    c.write(b"")
    c.flush()
    assert t.writes == []


class Base:
    """A stand-in for uvicorn's HTTP protocol: records what reached it."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.transport: Any = None
        self.flow: Any = None
        self.calls: list[Any] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.calls.append("made")

    def connection_lost(self, exc: Any) -> None:
        self.calls.append(("lost", exc))

    def data_received(self, data: bytes) -> None:
        self.calls.append(("data", data))

    def handle_websocket_upgrade(self) -> None:
        self.calls.append("ws")

    def on_message_begin(self) -> None:
        self.calls.append("begin")

    def on_headers_complete(self) -> None:
        self.calls.append("headers")

    def on_message_complete(self) -> None:
        self.calls.append("complete")


async def test_coalescing_wraps_the_protocol_s_transport_on_the_running_loop() -> None:
    cls = T.coalescing(Base)
    assert cls.__name__ == cls.__qualname__ == "CoalescingBase"
    assert issubclass(cls, Base)
    p = cls(Loop())
    t = Transport()
    p.connection_made(t)
    assert isinstance(p.transport, T.CoalescingTransport) and p.calls == ["made"]
    assert p.transport._t is t and p.transport._loop is asyncio.get_running_loop()


def test_http_protocol_is_httptools_coalescing_and_guarded_when_asked() -> None:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    plain = T.http_protocol()
    assert plain.__name__ == "CoalescingHttpToolsProtocol"
    assert plain.__mro__[1] is HttpToolsProtocol
    g = T.http_protocol(
        T.ConnectionGuard(header_timeout_s=1, body_timeout_s=2, max_per_ip=3, max_pending=4)
    )
    assert g.__name__ == g.__qualname__ == "GuardedCoalescingHttpToolsProtocol"
    assert g.__mro__[1].__name__ == "CoalescingHttpToolsProtocol"


def test_guard_of_reads_the_limits() -> None:
    lim = SimpleNamespace(
        header_timeout_s="2.5",
        body_timeout_s=7,
        max_connections_per_ip=3.0,
        max_pending_connections="100",
    )
    g = T.guard_of(lim)
    assert (g.header_timeout_s, g.body_timeout_s, g.max_per_ip, g.max_pending, g.grace_s) == (
        2.5,
        7.0,
        3,
        100,
        1.0,
    )
    assert isinstance(g.max_per_ip, int) and isinstance(g.body_timeout_s, float)
    assert (g.pending, g.by_ip, g.sweep_at) == ({}, {}, None)
    assert T.PENDING_GRACE_S == 1.0


# ---- the guard's caps -----------------------------------------------------------------------


class Conn:
    def __init__(self, name: str, ip: str = "X", unread: bool = False) -> None:
        self.name, self._guard_ip, self.unread = name, ip, unread
        self.closed: bool | None = None

    def _guard_unread(self) -> bool:
        return self.unread

    def _guard_close(self, *, abort: bool) -> None:
        self.closed = abort

    def __repr__(self) -> str:
        return self.name


def guard(**kw: Any) -> T.ConnectionGuard:
    kw.setdefault("header_timeout_s", 10.0)
    kw.setdefault("body_timeout_s", 10.0)
    kw.setdefault("max_per_ip", 2)
    kw.setdefault("max_pending", 100)
    return T.ConnectionGuard(**kw)


def test_past_max_per_ip_the_oldest_is_aborted_once_it_waited_the_grace() -> None:
    g = guard()
    a, b, c = Conn("a"), Conn("b"), Conn("c")
    assert g.arrived(a, "X", 0.0) is None
    assert g.arrived(b, "X", 0.5) is None  # (2: at the cap)
    assert g.arrived(c, "X", 0.6) == 1.0  # (a may go at 0 + 1 s)
    assert g.sweep_at == 1.0 and a.closed is None
    assert g.sweep(1.0 - 1e-9) is None  # (the sweep is scheduled already)
    assert a.closed is None
    assert g.sweep(1.0) is None
    assert a.closed is True and (b.closed, c.closed) == (None, None)
    assert g.pending == {b: 0.5, c: 0.6} and g.by_ip == {"X": {b: 0.5, c: 0.6}}


def test_a_later_sweep_is_asked_for_only_when_none_comes_as_early() -> None:
    g = guard()
    conns = [Conn(str(i)) for i in range(4)]
    for i, c in enumerate(conns[:3]):
        g.arrived(c, "X", 0.1 * i)
    assert g.sweep_at == 1.0
    assert g.arrived(conns[3], "X", 0.5) is None  # (1.1 is after the scheduled 1.0)
    g.sweep_at = None
    assert g.sweep(0.5) == 1.0
    g.sweep_at = 2.0
    assert g.sweep(0.5) == 1.0 and g.sweep_at == 1.0  # (an earlier one replaces it)


def test_a_connection_with_bytes_waiting_is_spared_and_the_guard_looks_again() -> None:
    g = guard(max_per_ip=1, grace_s=0.5)
    a, b = Conn("a", unread=True), Conn("b")
    g.arrived(a, "X", 0.0)
    g.arrived(b, "X", 0.0)
    g.sweep_at = None
    assert g.sweep(2.0) is None  # (a spared, b aborted: one over, one cut)
    assert (a.closed, b.closed) == (None, True)
    c = Conn("c", unread=True)
    g.arrived(c, "X", 2.0)
    g.sweep_at = None
    assert g.sweep(3.0) == 3.5  # (none could be cut: again after the grace)
    g2 = guard(max_per_ip=1, grace_s=0.01)
    for n in "de":
        g2.arrived(Conn(n, unread=True), "X", 0.0)
    g2.sweep_at = None
    assert g2.sweep(1.0) == pytest.approx(1.05)  # (at least 50 ms)


def test_past_max_pending_the_oldest_of_all_addresses_goes_at_once() -> None:
    g = guard(max_per_ip=10, max_pending=2)
    a, b, c = Conn("a", "X"), Conn("b", "Y"), Conn("c", "Z")
    g.arrived(a, "X", 0.0)
    g.arrived(b, "Y", 0.1)
    assert g.arrived(c, "Z", 0.2) is None  # (no grace: a aborted now)
    assert a.closed is True and g.by_ip == {"Y": {b: 0.1}, "Z": {c: 0.2}}
    d = Conn("d", "W", unread=True)
    e = Conn("e", "W", unread=True)
    b.unread = c.unread = True
    g.arrived(d, "W", 0.3)
    assert g.sweep_at == pytest.approx(0.35)
    g.sweep_at = None
    g.arrived(e, "W", 0.4)
    assert g.sweep_at == pytest.approx(0.45)
    assert all(x.closed is None for x in (b, c, d, e))


def test_sweep_of_every_address_at_its_cap_drops_nothing() -> None:
    g = guard(max_per_ip=1, max_pending=2)
    a, b = Conn("a", "X"), Conn("b", "Y")
    g.arrived(a, "X", 0.0)
    g.arrived(b, "Y", 0.0)
    assert g.sweep(100.0) is None and a.closed is None and b.closed is None


def test_sweep_of_every_address_cuts_each_one_past_its_cap() -> None:
    g = guard(max_per_ip=1, grace_s=0.0)
    x1, x2, y1, y2 = Conn("x1", "X"), Conn("x2", "X"), Conn("y1", "Y"), Conn("y2", "Y")
    for c in (x1, y1, x2, y2):
        g.pending[c] = 0.0
        g.by_ip.setdefault(c._guard_ip, {})[c] = 0.0
    assert g.sweep(1.0) is None
    assert (x1.closed, y1.closed, x2.closed, y2.closed) == (True, True, None, None)


def test_left_forgets_a_connection_and_an_empty_address() -> None:
    g = guard()
    a, b = Conn("a"), Conn("b")
    g.arrived(a, "X", 0.0)
    g.arrived(b, "X", 0.0)
    g.left(a, "X")
    assert g.pending == {b: 0.0} and g.by_ip == {"X": {b: 0.0}}
    g.left(a, "X")  # (twice: nothing)
    g.left(b, "X")
    assert g.pending == {} and g.by_ip == {}
    g.pending[a] = 1.0  # (pending, its address unknown)
    g.left(a, "Q")
    assert g.pending == {}


@pytest.mark.parametrize(
    ("a", "b", "m"),
    [(None, None, None), (None, 2.0, 2.0), (3.0, None, 3.0), (3.0, 2.0, 2.0), (1.0, 2.0, 1.0)],
)
def test_earliest(a, b, m) -> None:
    assert T._earliest(a, b) == m


# ---- the guarded protocol -------------------------------------------------------------------


def make(g: T.ConnectionGuard, loop: Loop, peer: Any = ("10.0.0.1", 5000), sock: Any = None):
    cls = T.guarded(Base, g)
    p = cls(loop)
    t = Transport(peer, sock)
    p.connection_made(t)
    return p, t


def test_guarded_names_and_its_first_header_timer() -> None:
    g = guard(header_timeout_s=3.0)
    cls = T.guarded(Base, g)
    assert cls.__name__ == cls.__qualname__ == "GuardedBase"
    loop = Loop()
    loop.now = 5.0
    p, _t = make(g, loop)
    assert p._guard_ip == "10.0.0.1" and p.calls == ["made"]
    assert [h.when for h in loop.later] == [8.0] and p._header_timer is loop.later[0]
    assert g.pending == {p: 5.0} and g.by_ip == {"10.0.0.1": {p: 5.0}}
    for peer in (None, (), "sock"):
        q, _ = make(guard(), Loop(), peer=peer)
        assert q._guard_ip == "?"


def test_headers_late_close_the_connection_gently() -> None:
    g = guard(header_timeout_s=3.0)
    loop = Loop()
    p, t = make(g, loop)
    loop.later[0].fn()
    assert t.events == ["close"] and g.pending == {} and p._header_timer is None


def test_headers_in_time_cancel_their_timer_and_arm_the_body_s_on_each_read() -> None:
    g = guard(header_timeout_s=3.0, body_timeout_s=4.0)
    loop = Loop()
    p, t = make(g, loop)
    first = loop.later[0]
    p.on_message_begin()
    assert p._in_headers and p.calls[-1] == "begin"
    p.on_headers_complete()
    assert first.cancelled and p._header_timer is None and g.pending == {}
    assert (p._in_headers, p._in_body, p.calls[-1]) == (False, True, "headers")
    loop.now = 1.0
    p.data_received(b"body")
    assert p.calls[-1] == ("data", b"body")
    b1 = loop.later[-1]
    assert b1.when == 5.0 and p._body_timer is b1
    loop.now = 2.0
    p.data_received(b"more")
    assert b1.cancelled and loop.later[-1].when == 6.0
    b2 = loop.later[-1]
    p.on_message_complete()
    assert b2.cancelled and p._body_timer is None and not p._in_body
    assert p.calls[-1] == "complete"
    n = len(loop.later)
    p.data_received(b"")  # (between requests: no timer)
    assert len(loop.later) == n
    p.on_message_begin()  # (a kept-alive connection's next request)
    p.data_received(b"GET")
    assert loop.later[-1].when == 5.0 and p._header_timer is loop.later[-1]
    m = len(loop.later)
    p.data_received(b" /")  # (its timer runs already)
    assert len(loop.later) == m
    p.on_message_complete()
    assert t.events == []


def test_a_body_that_stalls_is_closed_unless_the_app_paused_reading() -> None:
    g = guard(body_timeout_s=4.0)
    loop = Loop()
    p, t = make(g, loop)
    p.on_message_begin()
    p.on_headers_complete()
    p.data_received(b"x")
    p.flow = SimpleNamespace(read_paused=True)
    loop.now = 4.0
    loop.later[-1].fn()
    assert t.events == [] and p._body_timer is loop.later[-1] and loop.later[-1].when == 8.0
    p.flow.read_paused = False
    loop.now = 8.0
    loop.later[-1].fn()
    assert t.events == ["close"] and p._body_timer is None
    q, tq = make(g, Loop())
    q._body_late()  # (no flow yet)
    assert tq.events == ["close"]


def test_connection_lost_and_websocket_upgrade_disarm_every_timer() -> None:
    g = guard()
    loop = Loop()
    p, _t = make(g, loop)
    p.on_message_begin()
    p.on_headers_complete()
    p.data_received(b"x")
    hb = loop.later[-1]
    p.connection_lost(None)
    assert hb.cancelled and p._body_timer is None and p.calls[-1] == ("lost", None)
    q, _t = make(g, loop)
    h = q._header_timer
    q.on_message_begin()
    q.handle_websocket_upgrade()
    assert h.cancelled and (q._in_headers, q._in_body, q._header_timer) == (False, False, None)
    assert q.calls[-1] == "ws"
    assert q in g.pending  # (upgrade leaves the guard's count alone)
    q.connection_lost(ValueError("x"))
    assert q not in g.pending


def test_guard_close_aborts_or_closes_once() -> None:
    g = guard()
    p, t = make(g, Loop())
    p._guard_close(abort=True)
    p._guard_close(abort=False)  # (closing already: nothing)
    assert t.events == ["abort"] and p._header_timer is None
    q, tq = make(g, Loop())
    q.transport = None
    q._guard_close(abort=True)
    assert tq.events == []


def test_the_guarded_sweep_is_timed_on_the_loop_and_repeats_while_needed() -> None:
    g = guard(max_per_ip=1, grace_s=1.0)
    loop = Loop()
    _p1, t1 = make(g, loop)
    assert loop.at == []
    loop.now = 0.25
    _p2, t2 = make(g, loop)
    assert [w for w, _ in loop.at] == [1.0] and g.sweep_at == 1.0
    loop.now = 1.0
    loop.at[0][1]()
    assert t1.events == ["abort"] and t2.events == [] and g.sweep_at is None
    loop.now = 1.1
    _p3, t3 = make(g, loop)
    assert [w for w, _ in loop.at][1:] == [1.25]
    loop.now = 1.2
    _p4, t4 = make(g, loop)  # (p2 due at 1.25 already: no second timer)
    assert len(loop.at) == 2
    loop.now = 1.25
    loop.at[1][1]()  # (p2 aborted; p3 waits its grace: again at 2.1)
    assert t2.events == ["abort"] and t3.events == []
    assert [w for w, _ in loop.at][2:] == [2.1] and g.sweep_at == 2.1
    loop.now = 2.1
    loop.at[2][1]()
    assert g.sweep_at is None and t3.events == ["abort"] and t4.events == []
    assert len(loop.at) == 3


def test_unread_bytes_are_read_from_the_socket() -> None:
    a, b = socket.socketpair()
    try:
        p, _t = make(guard(), Loop(), sock=a)
        assert p._guard_unread() is False
        b.sendall(b"G")
        assert p._guard_unread() is True  # (one byte is enough)
        q, _t = make(guard(), Loop(), sock=None)
        assert q._guard_unread() is False
        q.transport = None
        assert q._guard_unread() is False
        a.close()
        assert p._guard_unread() is False  # (a closed socket: fileno -1)
    finally:
        a.close()
        b.close()


# ---- helper-46: the survivors of the 836ec9d run ----------------------------------------------


def test_a_write_after_abort_is_held_like_any_other() -> None:
    t, loop = Transport(), Loop()
    c = T.CoalescingTransport(t, loop)
    c.abort()
    c.write(b"a")
    c.write(b"b")
    assert t.writes == [b"ab"]


def test_left_with_another_address_of_the_connection_leaves_that_address_alone() -> None:
    g = guard()
    a, b = Conn("a"), Conn("b")
    g.arrived(b, "X", 0.0)
    g.pending[a] = 0.0  # (pending, not under "X")
    g.left(a, "X")
    assert g.pending == {b: 0.0} and g.by_ip == {"X": {b: 0.0}}


def test_a_sweep_of_an_unknown_address_drops_nothing() -> None:
    g = guard(max_per_ip=1)
    assert g.sweep(5.0, ("nobody",)) is None and g.sweep_at is None


def test_an_arrival_sweeps_its_own_address_only() -> None:
    g = guard(max_per_ip=1)
    x1, x2, y1 = Conn("x1", "X"), Conn("x2", "X"), Conn("y1", "Y")
    g.arrived(x1, "X", 0.0)
    assert g.arrived(x2, "X", 0.1) == 1.0
    assert g.arrived(y1, "Y", 1.5) is None  # (X's own sweep, due at 1.0, cuts x1)
    assert (x1.closed, x2.closed, y1.closed) == (None, None, None)
    assert g.sweep_at == 1.0


def test_the_earliest_due_of_every_address_and_of_the_total_is_asked_for() -> None:
    g = guard(max_per_ip=1, grace_s=1.0)
    for name, ip, t in (("x1", "X", 0.2), ("x2", "X", 0.2), ("y1", "Y", 0.5), ("y2", "Y", 0.5)):
        c = Conn(name, ip)
        g.pending[c] = t
        g.by_ip.setdefault(ip, {})[c] = t
    assert g.sweep(0.6) == 1.2  # (X's first may go at 1.2, Y's at 1.5)
    g = guard(max_per_ip=1, max_pending=1, grace_s=0.5)
    a, b = Conn("a", "X", unread=True), Conn("b", "X", unread=True)
    for c in (a, b):
        g.pending[c] = 0.49
        g.by_ip.setdefault("X", {})[c] = 0.49
    # X's oldest may go at 0.99 (its grace), the total's look again at 0.55
    assert g.sweep(0.5) == pytest.approx(0.55)
    g = guard(max_per_ip=1, max_pending=1, grace_s=0.5)
    for c in (a, b):
        g.pending[c] = 0.49
        g.by_ip.setdefault("X", {})[c] = 0.49
    assert g.sweep(0.98) == pytest.approx(0.99)  # (X's at 0.99 before the total's 1.03)


def test_a_fresh_guarded_connection_is_in_no_request_and_a_header_read_arms_no_body_timer() -> None:
    g = guard(header_timeout_s=3.0, body_timeout_s=4.0)
    loop = Loop()
    p, _t = make(g, loop)
    assert (p._in_headers, p._in_body) == (False, False)
    p.on_message_begin()
    p.data_received(b"GE")  # (headers half read: their timer runs, no body timer)
    assert len(loop.later) == 1 and p._body_timer is None


def test_guarded_bookkeeping_leaves_no_address_behind_and_passes_exc_on() -> None:
    g = guard(header_timeout_s=3.0)
    loop = Loop()
    p, _t = make(g, loop)
    p.on_message_begin()
    p.on_headers_complete()
    assert g.pending == {} and g.by_ip == {}
    q, _t = make(g, loop)
    err = ValueError("x")
    q.connection_lost(err)
    assert g.pending == {} and g.by_ip == {} and q.calls[-1] == ("lost", err)
    _r, tr = make(g, loop)
    loop.later[-1].fn()  # (its headers late)
    assert g.pending == {} and g.by_ip == {} and tr.events == ["close"]


def test_a_kept_alive_connection_s_late_headers_close_it() -> None:
    g = guard(header_timeout_s=3.0)
    loop = Loop()
    p, t = make(g, loop)
    p.on_message_begin()
    p.on_headers_complete()
    p.on_message_complete()
    p.on_message_begin()
    p.data_received(b"GET")
    loop.later[-1].fn()
    assert t.events == ["close"] and p._header_timer is None


def test_http_protocol_falls_back_to_h11_unguarded(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from uvicorn.protocols.http.h11_impl import H11Protocol

    monkeypatch.setitem(sys.modules, "uvicorn.protocols.http.httptools_impl", None)
    cls = T.http_protocol(
        T.ConnectionGuard(header_timeout_s=1, body_timeout_s=2, max_per_ip=3, max_pending=4)
    )
    assert cls.__name__ == "CoalescingH11Protocol" and cls.__mro__[1] is H11Protocol


def test_http_protocol_is_kept_by_the_guard_given(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    real = T.guarded
    monkeypatch.setattr(T, "guarded", lambda cls, g: seen.append(g) or real(cls, g))
    g = T.ConnectionGuard(header_timeout_s=1, body_timeout_s=2, max_per_ip=3, max_pending=4)
    T.http_protocol(g)
    assert seen == [g]
