"""`ConnectionGuard`'s caps on connections that have not finished their first headers (issue
35, M4), with the time given: past `max_per_ip` the longest waiting one is dropped once it has
waited the grace and has no byte to read (a burst of clients that each send at once is not cut);
past `max_pending` at once (the fd budget comes first). The protocols here are stand-ins with
the two methods the guard calls; tests/api/test_slow_clients.py runs the real thing."""

from __future__ import annotations

from arl_tangram.api.transport import ConnectionGuard


class Conn:
    def __init__(self, ip: str, unread: bool = False) -> None:
        self._guard_ip, self.unread, self.closed = ip, unread, False

    def _guard_unread(self) -> bool:
        return self.unread

    def _guard_close(self, *, abort: bool) -> None:
        assert abort
        self.closed = True


def guard(per_ip: int = 3, pending: int = 100) -> ConnectionGuard:
    return ConnectionGuard(header_timeout_s=10, body_timeout_s=10, max_per_ip=per_ip,
                           max_pending=pending, grace_s=1.0)


def test_past_the_per_ip_cap_the_oldest_goes_once_it_has_waited_the_grace() -> None:
    g = guard(per_ip=3)
    conns = [Conn("a") for _ in range(5)]
    dues = [g.arrived(c, "a", 0.1 * i) for i, c in enumerate(conns)]
    assert dues == [None, None, None, 1.0, None]  # (one sweep asked for, at the oldest's grace)
    assert [c.closed for c in conns] == [False] * 5  # a burst: nobody cut yet
    assert g.sweep(0.99) is None and g.sweep_at == 1.0  # (too early; a sweep is set for 1.0)
    g.sweep_at = None
    assert g.sweep(1.0) == 1.1  # the first goes; the second may at 1.1
    assert [c.closed for c in conns] == [True, False, False, False, False]
    g.sweep_at = None
    assert g.sweep(5.0) is None
    assert [c.closed for c in conns] == [True, True, False, False, False]
    assert (len(g.pending), len(g.by_ip["a"])) == (3, 3)


def test_other_addresses_are_not_touched() -> None:
    g = guard(per_ip=2)
    a = [Conn("a") for _ in range(4)]
    b = [Conn("b") for _ in range(2)]
    for c in a + b:
        g.arrived(c, c._guard_ip, 0.0)
    g.sweep_at = None
    g.sweep(2.0)
    assert [c.closed for c in a] == [True, True, False, False]
    assert [c.closed for c in b] == [False, False]


def test_one_whose_request_waits_to_be_read_is_never_dropped() -> None:
    g = guard(per_ip=2)
    first = Conn("a", unread=True)
    rest = [Conn("a") for _ in range(2)]
    for c in (first, *rest):
        g.arrived(c, "a", 0.0)
    g.sweep_at = None
    assert g.sweep(2.0) is None
    assert (first.closed, rest[0].closed, rest[1].closed) == (False, True, False)


def test_finished_headers_and_closed_connections_leave_the_count() -> None:
    g = guard(per_ip=2)
    conns = [Conn("a") for _ in range(2)]
    for c in conns:
        g.arrived(c, "a", 0.0)
    g.left(conns[0], "a")  # its headers came
    third = Conn("a")
    assert g.arrived(third, "a", 5.0) is None
    assert not any(c.closed for c in (*conns, third))
    g.left(conns[1], "a")
    g.left(third, "a")
    assert g.pending == {} and g.by_ip == {}


def test_past_the_total_cap_the_oldest_goes_at_once() -> None:
    g = guard(per_ip=100, pending=3)
    conns = [Conn(f"10.0.0.{i}") for i in range(5)]
    conns[0].unread = True  # (its request is there: the next oldest goes instead)
    for c in conns:
        g.arrived(c, c._guard_ip, 0.0)
    assert [c.closed for c in conns] == [False, True, True, False, False]
    assert len(g.pending) == 3


def test_when_none_may_go_it_looks_again_later() -> None:
    g = guard(per_ip=1)
    a, b = Conn("a", unread=True), Conn("a", unread=True)
    g.arrived(a, "a", 0.0)
    assert g.arrived(b, "a", 0.0) == 1.0
    g.sweep_at = None
    assert g.sweep(1.0) == 2.0  # both have bytes waiting: again in a grace
    assert not a.closed and not b.closed
