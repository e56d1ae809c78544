"""Sessions' numbers, pinned by hand (issue 43 item 2: mutation testing of core/sessions.py):
when an idle session expires (at its deadline exactly, not before), a busy one looked at again a
TTL later and closed a TTL after its last action, several due at one event all closed in order,
a closed or reopened id's stale entries skipped, and where a waiting session opens."""

from __future__ import annotations

from core_helpers import Driver, act, cpu_node, of

from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core.resources import Resources


def _closed(out) -> list[tuple[str, str, str]]:
    """The sessions closed, each by a plain `CloseSession` (an expiry is no eviction)."""
    got = of(out, cmd.CloseSession)
    assert all(type(c) is cmd.CloseSession for c in got), got
    return [(c.session_id, c.node, c.reason) for c in got]


def _session(d: Driver, sid: str, ttl: float, node: str = "n0") -> None:
    out = d(ev.SessionRequested(d.t, sid, demand=Resources(memory_mb=256), ttl_s=ttl, node=node))
    assert [(c.session_id, c.node) for c in of(out, cmd.OpenSession)] == [(sid, node)]


def test_an_idle_session_expires_at_its_deadline_exactly() -> None:
    d = Driver([cpu_node("n0")])
    _session(d, "s", 10.0)  # opened at 0: its deadline 10
    assert _closed(d.at(9.999).tick()) == []
    out = d.at(10.0).tick()
    assert _closed(out) == [("s", "n0", "ttl expired")]
    assert [c.cause for c in of(out, cmd.CloseSession)] == ["Tick@10"]  # the event that closed it
    assert "s" not in d.core.st.sessions
    assert _closed(d.at(30.0).tick()) == []


def test_a_busy_session_is_looked_at_a_ttl_later_and_closes_a_ttl_after_its_last_action() -> None:
    d = Driver([cpu_node("n0")])
    _session(d, "s", 10.0)
    d.at(5.0).arrive(act("a", session="s"))
    d.started("a", "n0")
    assert _closed(d.at(10.0).tick()) == []  # busy at its deadline: again at 20
    d.at(12.0).finish("a", run_s=7.0)  # last active at 12: its deadline 22
    assert _closed(d.at(20.0).tick()) == []  # looked at: not yet (22)
    assert _closed(d.at(21.9).tick()) == []
    assert _closed(d.at(22.0).tick()) == [("s", "n0", "ttl expired")]


def test_every_session_due_at_one_event_closes_at_it_in_deadline_order() -> None:
    d = Driver([cpu_node("n0")])
    _session(d, "gone", 10.0)  # closed by its client below: its entry stays, stale
    d.at(1.0)
    _session(d, "busy", 9.0)  # due at 10, busy then: again at 19
    d.at(1.5)
    _session(d, "again", 8.5)  # due at 10, active since: due at 12
    d.at(2.0)
    _session(d, "idle", 8.0)  # due at 10
    d.at(3.0)
    _session(d, "last", 7.0)  # due at 10
    d.at(3.2).arrive(act("b", session="again"))
    d.started("b", "n0")
    d.at(3.5).finish("b", run_s=0.3)  # "again" last active at 3.5: 3.5 + 8.5 = 12
    d.at(4.0)(ev.SessionClosed(4.0, "gone"))
    d.at(5.0).arrive(act("a", session="busy"))
    d.started("a", "n0")
    # every entry is due at 10, looked at in the order (10, id): again (put back to 12), busy
    # (put back to 19), gone (stale), idle and last (closed): both close at this one event
    assert _closed(d.at(10.0).tick()) == [("idle", "n0", "ttl expired"),
                                          ("last", "n0", "ttl expired")]
    assert _closed(d.at(11.9).tick()) == []
    assert _closed(d.at(12.0).tick()) == [("again", "n0", "ttl expired")]
    assert set(d.core.st.sessions) == {"busy"}
    d.at(15.0).finish("a", run_s=10.0)  # busy's last action: looked at at 19, due at 24
    assert _closed(d.at(19.0).tick()) == []
    assert _closed(d.at(24.0).tick()) == [("busy", "n0", "ttl expired")]


def test_a_reopened_id_closes_once_though_its_old_entry_is_due_too() -> None:
    d = Driver([cpu_node("n0")])
    _session(d, "s", 10.0)  # entry (10, s)
    d.at(1.0)(ev.SessionClosed(1.0, "s"))
    d.at(2.0)
    _session(d, "s", 5.0)  # the same id again: entry (7, s)
    out = d.at(10.0).tick()  # both entries due: one close
    assert _closed(out) == [("s", "n0", "ttl expired")]
    assert "s" not in d.core.st.sessions


def test_a_waiting_session_opens_where_its_largest_waiting_action_fits() -> None:
    d = Driver([cpu_node("big", mem=4096), cpu_node("small", mem=1024)])
    d.arrive(act("hog_b", mem=3900), act("hog_s", mem=1000))  # big: 196 MB free, small: 24
    d.started("hog_b", "big")
    d.started("hog_s", "small")
    out = d(ev.SessionRequested(0.0, "s", demand=Resources(memory_mb=256)))
    assert of(out, cmd.OpenSession) == [] and "s" in d.core.sessions.pending
    # its actions: the larger first; the one the session's node must have room for is the one
    # with the most memory (2048 MB), not the last to arrive (512 MB)
    d.at(1.0).arrive(act("a2", mem=2048, session="s"), act("a1", mem=512, session="s"))
    out = d.at(2.0).finish("hog_s", run_s=2.0)  # small: 1024 free, < 256 + 2048
    assert of(out, cmd.OpenSession) == []
    out = d.at(3.0).finish("hog_b", run_s=3.0)  # big: 4096 free
    assert [(c.session_id, c.node) for c in of(out, cmd.OpenSession)] == [("s", "big")]


def test_a_session_no_node_had_room_for_opens_on_a_node_added_or_come_back() -> None:
    d = Driver([cpu_node("n0", mem=2048)])
    d.arrive(act("h1", mem=1824), act("h2", mem=100))  # n0: 124 MB free
    d.started("h1", "n0")
    d.started("h2", "n0")
    out = d(ev.SessionRequested(0.0, "s", demand=Resources(memory_mb=256)))
    assert of(out, cmd.OpenSession) == []
    # h2's 100 MB back: 224 free, short of the session's 256: its shape found no node
    out = d.at(1.0).finish("h2", run_s=1.0)
    assert of(out, cmd.OpenSession) == [] and "s" in d.core.sessions.pending
    out = d.at(2.0)(ev.NodeAdded(2.0, cpu_node("n1", mem=2048)))  # a node no pass has seen
    assert [(c.session_id, c.node) for c in of(out, cmd.OpenSession)] == [("s", "n1")]


def test_waiting_sessions_are_served_in_order_after_their_group_is_compacted() -> None:
    d = Driver([cpu_node("n0", mem=2048)])
    d.arrive(act("hog", mem=1900))  # 148 MB free: no session of 256 fits now
    d.started("hog", "n0")
    for i in range(20):
        d(ev.SessionRequested(0.0, f"s{i:02}", demand=Resources(memory_mb=256)))
    d.at(1.0).arrive(act("p1", mem=10))
    d.started("p1", "n0")
    d.finish("p1", run_s=0.5)  # a pass: the 20 wait in one group of their shape
    for i in range(19):  # 19 of them closed while waiting: 19 stale entries, 1 live
        d(ev.SessionClosed(1.0, f"s{i:02}"))
    d.at(2.0)(ev.SessionRequested(2.0, "t", demand=Resources(memory_mb=256)))
    d.arrive(act("p2", mem=10))
    d.started("p2", "n0")
    d.finish("p2", run_s=0.5)  # t joins: 21 entries > 2 x 2 live + 16: the live two kept
    assert set(d.core.sessions.pending) == {"s19", "t"}
    out = d.at(3.0).finish("hog", run_s=3.0)
    assert [(c.session_id, c.node) for c in of(out, cmd.OpenSession)] == [("s19", "n0"), ("t", "n0")]


def test_past_sixteen_ranked_nodes_without_room_the_scan_picks_the_best_not_the_first() -> None:
    d = Driver([cpu_node(f"n{i:02}", cpu=8, mem=2048) for i in range(16)])
    d.arrive(*(act(f"h{i:02}", mem=1900) for i in range(16)))  # one per node: 148 MB free each
    d(ev.NodeAdded(0.0, cpu_node("n16", cpu=4, mem=4096)))
    d.arrive(act("busy", cpu=2, mem=200))  # only n16 has 200 MB: 2 of its 4 cores free
    d(ev.NodeAdded(0.0, cpu_node("n17", cpu=4, mem=4096)))
    # ranked by sessions per core: the 16 nodes of 8 cores first, none with room now; then a
    # scan of all: n16 and n17 have room, n17 more free CPU (4 against 2)
    out = d(ev.SessionRequested(0.0, "s", demand=Resources(memory_mb=256)))
    assert [(c.session_id, c.node) for c in of(out, cmd.OpenSession)] == [("s", "n17")]


def test_a_session_of_a_task_opens_in_its_tasks_pool_not_where_the_spread_would() -> None:
    d = Driver([cpu_node("n0", cpu=4), cpu_node("n1", cpu=2)], policy="task-isolated",
               task_shares={"a": 2, "b": 1})  # pools: a on n0 (4 cores), b on n1 (2)
    got = []
    for sid, task in (("s1", "a"), ("s2", "b"), ("s3", "b"), ("s4", "a")):
        out = d(ev.SessionRequested(0.0, sid, task=task))
        got += [(c.session_id, c.node) for c in of(out, cmd.OpenSession)]
    # (over the whole cluster s2 would go to n0: 2 sessions per 4 cores tie 1 per 2, and n0 has
    # more free CPU)
    assert got == [("s1", "n0"), ("s2", "n1"), ("s3", "n1"), ("s4", "n0")]


def test_an_implicit_session_takes_its_first_actions_trajectory_and_task() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="trajectory-bound", trajectories=1)
    d.arrive(act("a", session="x", trajectory="t7", task="swe"))
    sess = d.core.st.sessions["x"]
    assert (sess.trajectory, sess.task, sess.node) == ("t7", "swe", "n0")
    assert "t=0 opens session x implicitly (cause a)" in d.core.story("a")
