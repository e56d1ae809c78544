"""Sessions' numbers, pinned by hand (issue 43 item 2: mutation testing of core/sessions.py):
when an idle session expires (at its deadline exactly, not before), a busy one looked at again a
TTL later and closed a TTL after its last action, several due at one event all closed in order,
a closed or reopened id's stale entries skipped, and where a session opens: its pin unless full
or over the caps bound, the order of the wait across shapes, a blocked shape's retry (warm node,
spread), its task's pool or its trajectory's largest piece, past a node over the caps bound,
nodes without CPU or memory or with less than a core; the fields of its `OpenSession`, the room
kept for its actions, and its waiting actions found once it opens."""

from __future__ import annotations

import pytest
from core_helpers import Driver, act, cpu_node, of, starts

from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core.cluster import NodeSpec
from arl_tangram.core.resources import Resources


def _closed(out) -> list[tuple[str, str, str]]:
    """The sessions closed, each by a plain `CloseSession` (an expiry is no eviction)."""
    got = of(out, cmd.CloseSession)
    assert all(type(c) is cmd.CloseSession for c in got), got
    return [(c.session_id, c.node, c.reason) for c in got]


def _session(d: Driver, sid: str, ttl: float, node: str = "n0") -> None:
    out = d(ev.SessionRequested(d.t, sid, demand=Resources(memory_mb=256), ttl_s=ttl, node=node))
    assert [(c.session_id, c.node) for c in of(out, cmd.OpenSession)] == [(sid, node)]


def _waiting(d: Driver, *sids: str, mem: float = 256) -> None:
    for sid in sids:
        out = d(ev.SessionRequested(d.t, sid, demand=Resources(memory_mb=mem)))
        assert of(out, cmd.OpenSession) == [] and sid in d.core.sessions.pending


def _opened(out) -> list[tuple[str, str]]:
    return [(c.session_id, c.node) for c in of(out, cmd.OpenSession)]


def _pass(d: Driver, aid: str) -> None:
    """A pass that opens nothing: an action of 10 MB starts and ends."""
    (start,) = starts(d.arrive(act(aid, mem=10))).values()
    d.started(aid, start.node)
    assert _opened(d.finish(aid, run_s=0.0)) == []


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


# ---- the second run's survivors (issue 43: mutmut re-run at cf23cfa with this file) ----------


def test_an_open_session_carries_its_request_ttl_cause_attachment_and_trajectory() -> None:
    att = object()
    d = Driver([cpu_node("n0")])
    out = d.at(3.0)(ev.SessionRequested(3.0, "s", demand=Resources(memory_mb=300), ttl_s=42.0,
                                        trajectory="t9", task="swe", attachment=att))
    (o,) = of(out, cmd.OpenSession)
    assert (o.session_id, o.node, o.demand, o.ttl_s, o.cause) == \
        ("s", "n0", Resources(memory_mb=300), 42.0, "SessionRequested:s")
    assert o.attachment is att
    sess = d.core.st.sessions["s"]
    assert (sess.trajectory, sess.task, sess.attachment is att) == ("t9", "swe", True)


def test_the_room_kept_for_a_session_action_grows_per_resource_to_the_largest_seen() -> None:
    d = Driver([cpu_node("n0", cpu=8, mem=8192)],
               session_action_demand=Resources(cpu=1, memory_mb=1024))
    _session(d, "s", 600.0)
    d.arrive(act("a", cpu=3, mem=512, session="s"))  # more CPU, less memory than the room
    assert d.core.sessions.action_room == Resources(cpu=3, memory_mb=1024)
    d.arrive(act("b", cpu=2, mem=2048, session="s"))
    assert d.core.sessions.action_room == Resources(cpu=3, memory_mb=2048)


def test_a_pinned_session_opens_elsewhere_when_its_node_is_full_or_over_its_caps_bound() -> None:
    d = Driver([cpu_node("n0", mem=2048), cpu_node("n1", mem=2048)],
               session_memory_overcommit=1.0, session_action_demand=Resources(cpu=1, memory_mb=0))
    d.arrive(act("hog", mem=1900))  # n0 (its first node): 148 MB free
    d.started("hog", "n0")
    out = d(ev.SessionRequested(0.0, "full", demand=Resources(memory_mb=256), node="n0"))
    assert [(c.session_id, c.node) for c in of(out, cmd.OpenSession)] == [("full", "n1")]
    # n1: with "full", two sessions of 896 MB, charged 64 each once reported (1664 MB free);
    # their caps fill the bound (1 x 2048): a third pinned there fits by charges, not by caps
    for sid in ("c1", "c2"):
        out = d(ev.SessionRequested(0.0, sid, demand=Resources(memory_mb=896), node="n1"))
        assert [c.node for c in of(out, cmd.OpenSession)] == ["n1"]
    d(ev.MemoryReport(0.0, "n1", current_mb={"full": 256.0, "c1": 10.0, "c2": 10.0},
                      peak_mb={"full": 256.0, "c1": 10.0, "c2": 10.0}))
    assert d.core.nodes["n1"].free["memory_mb"] == 2048 - 256 - 64 - 64
    d.finish("hog", run_s=0.0)  # n0: 2048 free
    out = d(ev.SessionRequested(0.0, "caps", demand=Resources(memory_mb=256), node="n1"))
    assert [(c.session_id, c.node) for c in of(out, cmd.OpenSession)] == [("caps", "n0")]


def test_the_caps_bound_takes_a_session_of_the_whole_node_and_not_one_mb_more() -> None:
    d = Driver([cpu_node("n0", mem=1024)], session_memory_overcommit=1.0,
               session_action_demand=Resources(cpu=1, memory_mb=0))
    out = d(ev.SessionRequested(0.0, "whole", demand=Resources(memory_mb=1024)))  # empty n0: caps 0
    assert [(c.session_id, c.node) for c in of(out, cmd.OpenSession)] == [("whole", "n0")]
    d(ev.MemoryReport(0.0, "n0", current_mb={"whole": 10.0}, peak_mb={"whole": 10.0}))
    assert d.core.nodes["n0"].free["memory_mb"] == 1024 - 64  # charged the floor
    # 960 MB free by charges; caps 1024 + 1 > 1 x 1024: a 1 MB session waits
    out = d(ev.SessionRequested(0.0, "one", demand=Resources(memory_mb=1.0)))
    assert of(out, cmd.OpenSession) == [] and "one" in d.core.sessions.pending
    assert d.core.sessions.caps == {"n0": 1024.0}


def test_a_session_whose_actions_wait_is_found_by_its_node_once_it_opens() -> None:
    # its action waits for CPU on the node the session opened on: that node's pass finds it
    # (`waiting_on`) when the CPU comes back
    d = Driver([cpu_node("n0", cpu=1, mem=2048)],
               session_action_demand=Resources(cpu=1, memory_mb=256))
    out = d(ev.SessionRequested(0.0, "big", demand=Resources(memory_mb=1780)))
    assert [c.node for c in of(out, cmd.OpenSession)] == ["n0"]
    d.arrive(act("h", cpu=1, mem=20))
    d.started("h", "n0")  # n0: no CPU, 248 MB free
    out = d(ev.SessionRequested(0.0, "s", demand=Resources(memory_mb=256)))
    assert of(out, cmd.OpenSession) == []
    d.at(1.0).arrive(act("a", cpu=1, mem=256, session="s"))
    out = d.at(2.0)(ev.SessionClosed(2.0, "big"))  # 2028 MB free, no CPU: s opens, a waits
    assert [(c.session_id, c.node) for c in of(out, cmd.OpenSession)] == [("s", "n0")]
    assert starts(out) == {} and d.core.st.waiting_on["n0"] == {"s"}
    out = d.at(3.0).finish("h", run_s=3.0)
    assert [(a, s.node) for a, s in starts(out).items()] == [("a", "n0")]


def test_a_waiting_session_whose_largest_action_is_cancelled_opens_at_once() -> None:
    # (before `Sessions.lost`, the Driver's `validate` failed at the cancel: `session-waits`, T
    # could open on n1, and T looked again only at the next change of a node's capacity; now
    # T opens on n1, which no event changed, and its action starts there at once: `open`'s
    # `st.touched` is what finds it, open #79, #80)
    d = Driver([cpu_node("n0", mem=2048), cpu_node("n1", mem=2048)],
               session_action_demand=Resources(cpu=1, memory_mb=256))
    d.arrive(act("hog", mem=1800), act("x", mem=10))  # both on n0: 228 MB free
    out = d(ev.SessionRequested(0.0, "S1", demand=Resources(memory_mb=1900), node="n1"))
    assert [c.node for c in of(out, cmd.OpenSession)] == ["n1"]  # n1: 148 MB free
    d(ev.SessionRequested(0.0, "T", demand=Resources(memory_mb=256)))
    d.at(1.0).arrive(act("big", mem=1800, session="T"), act("small", mem=256, session="T"))
    # n1 back to 2048 free: T's shape (256 + its largest waiting action's 1800 > 2048) finds
    # no room there, for good
    out = d.at(2.0)(ev.SessionClosed(2.0, "S1"))
    assert of(out, cmd.OpenSession) == [] and "T" in d.core.sessions.pending
    out = d.at(3.0)(ev.CancelRequested(3.0, "big"))  # T's shape: 256 + 256
    assert [(c.session_id, c.node) for c in of(out, cmd.OpenSession)] == [("T", "n1")]
    assert [(a, s.node) for a, s in starts(out).items()] == [("small", "n1")]


def test_of_two_shapes_the_session_that_waited_longer_opens_though_its_shape_is_newer() -> None:
    d = Driver([cpu_node("n0", mem=2048)], session_action_demand=Resources(cpu=1, memory_mb=256))
    d.arrive(act("perm", mem=1600), act("tmp", mem=300))  # 148 MB free
    _waiting(d, "A")  # waits first
    _waiting(d, "B", mem=300)
    _pass(d, "p")  # both looked at (A's entry made first, then B's)
    d.arrive(act("a", mem=100, session="A"))  # A's shape changes: its entry made again, after B's
    out = d.finish("tmp", run_s=1.0)  # 448 MB free: room for one of them
    assert _opened(out) == [("A", "n0")]
    assert "B" in d.core.sessions.pending


def test_after_one_opens_the_next_of_its_shape_waits_behind_another_shape_that_waited_longer() -> None:
    d = Driver([cpu_node("n0", mem=2048)], session_action_demand=Resources(cpu=1, memory_mb=256))
    d.arrive(act("perm", mem=1448), act("tmp", mem=452))  # 148 MB free
    _waiting(d, "z1", "z2", "z3", "z4", "z5")  # they wait, and leave before any pass
    for sid in ("z1", "z2", "z3", "z4", "z5"):
        d(ev.SessionClosed(d.t, sid))
    _waiting(d, "X1")
    _waiting(d, "Y1", mem=300)
    _waiting(d, "X2")
    _pass(d, "p")
    # 600 MB free: X1 (first to wait), then Y1 (before X2, of X1's shape): 44 MB left
    out = d.finish("tmp", run_s=1.0)
    assert _opened(out) == [("X1", "n0"), ("Y1", "n0")]
    assert set(d.core.sessions.pending) == {"X2"}


def test_a_session_no_node_had_room_for_opens_on_a_node_that_was_lost_and_came_back() -> None:
    d = Driver([cpu_node("n0", mem=2048), cpu_node("n1", mem=2048)],
               session_action_demand=Resources(cpu=1, memory_mb=256))
    for sid, mem, node in (("f0", 1900, "n0"), ("f1", 1800, "n1"), ("f2", 100, "n1")):
        out = d(ev.SessionRequested(0.0, sid, demand=Resources(memory_mb=mem), node=node))
        assert _opened(out) == [(sid, node)]
    _waiting(d, "s")  # 148 MB free on each
    # f2's 100 MB back on n1 (248 free): s's shape finds no room (n0 never gave any back)
    assert _opened(d.at(1.0)(ev.SessionClosed(1.0, "f2"))) == []
    d.at(2.0)(ev.NodeLost(2.0, "n0"))
    out = d.at(3.0)(ev.NodeAdded(3.0, cpu_node("n0", mem=2048)))  # the same name, empty
    assert _opened(out) == [("s", "n0")]


@pytest.mark.parametrize(("cpus", "warm", "want"), [
    ((8, 4), True, "n1"),  # warm for its image: n1, though n0 has more cores
    ((4, 8), False, "n1"),  # no image: the spread's choice (more cores), not the first node
])
def test_a_blocked_shape_retried_on_two_nodes_freed_at_once_takes_the_warm_or_spread_one(
        cpus: tuple[int, int], warm: bool, want: str) -> None:
    d = Driver([cpu_node("n0", cpu=cpus[0], mem=2048), cpu_node("n1", cpu=cpus[1], mem=2048)],
               session_action_demand=Resources(cpu=1, memory_mb=256))
    key = "image:x" if warm else None
    if warm:
        d(ev.WarmPoolReport(0.0, "n1", key, 1))
    for sid, node in (("e0", "n0"), ("e1", "n1")):  # both expire at 10
        out = d(ev.SessionRequested(0.0, sid, demand=Resources(memory_mb=1900), ttl_s=10.0,
                                    node=node))
        assert _opened(out) == [(sid, node)]
    out = d.at(1.0)(ev.SessionRequested(1.0, "w", demand=Resources(memory_mb=256), warm_key=key))
    assert _opened(out) == []
    _pass(d.at(2.0), "p")  # w's shape found no room
    out = d.at(10.0).tick()  # e0, e1 close: both nodes freed in one event
    assert _opened(out) == [("w", want)]


def test_under_pools_a_waiting_session_with_a_smaller_action_is_not_skipped_for_its_shape() -> None:
    # Q1 has no action: it needs 256 + the 1024 MB kept for an action, more than n0 has; Q2's
    # action needs 100: same demand, not the same shape, so Q1 finding no room skips no Q2
    d = Driver([cpu_node("n0", cpu=4, mem=1024)], policy="task-isolated")
    d.arrive(act("hog", mem=900))  # 124 MB free
    _waiting(d, "Q1", "Q2")
    d.arrive(act("q", mem=100, session="Q2"))
    out = d.finish("hog", run_s=1.0)
    assert _opened(out) == [("Q2", "n0")] and set(d.core.sessions.pending) == {"Q1"}
    assert [(a, s.node) for a, s in starts(out).items()] == [("q", "n0")]


def test_a_waiting_session_opens_in_the_pool_of_its_waiting_action_not_by_the_spread() -> None:
    d = Driver([cpu_node("n0", cpu=4, mem=2048), cpu_node("n1", cpu=2, mem=2048)],
               policy="task-isolated", task_shares={"a": 2, "b": 1})  # a on n0, b on n1
    for sid, mem, node, task, ttl in (("k1", 256, None, "a", 600.0), ("k2", 256, None, "a", 600.0),
                                      ("e0", 1500, "n0", None, 10.0), ("e1", 1900, "n1", None, 10.0)):
        out = d(ev.SessionRequested(0.0, sid, demand=Resources(memory_mb=mem), ttl_s=ttl,
                                    node=node, task=task))
        assert _opened(out) == [(sid, "n0" if node is None else node)]
    _waiting(d, "X")  # no task of its own (n0: 36 MB free, n1: 148)
    d.at(1.0).arrive(act("xa", mem=256, session="X", task="a"))
    # e0 and e1 expire at one tick: X opens in its action's pool (n0), though over the whole
    # cluster n1 ranks first (no session on 2 cores against 2 on 4)
    out = d.at(10.0).tick()
    assert _opened(out) == [("X", "n0")]


@pytest.mark.parametrize("warm_key", [None, "image:x"])
def test_a_trajectory_session_opens_on_its_slices_largest_piece_warm_or_not(warm_key) -> None:
    d = Driver([cpu_node("n0", cpu=8), cpu_node("n1", cpu=4)], policy="trajectory-bound",
               trajectories=1)  # one slice: n0's 8 cores first, then n1's 4
    for i in range(4):
        d(ev.SessionRequested(0.0, f"p{i}", node="n0"))
    # (the spread would take n1: 1 session per 4 cores against 5 per 8; no node is warm)
    out = d(ev.SessionRequested(0.0, "s", trajectory="t", warm_key=warm_key))
    assert _opened(out) == [("s", "n0")]


def test_a_session_of_a_trajectory_whose_slice_went_with_its_node_opens_elsewhere() -> None:
    d = Driver([cpu_node("n0"), cpu_node("n1", cpu=2), cpu_node("n2")], policy="trajectory-bound")
    for i in range(3):  # three slices (one per node): t0, t1, t2 -> slot0, slot1, slot2
        out = d(ev.SessionRequested(0.0, f"s{i}", trajectory=f"t{i}"))
        assert _opened(out) == [(f"s{i}", f"n{i}")]
    d.at(1.0)(ev.NodeLost(1.0, "n2"))  # two slices now: t2's slot2 has no piece
    out = d.at(2.0)(ev.SessionRequested(2.0, "u", trajectory="t2"))
    assert _opened(out) == [("u", "n0")]  # over the cluster: 2 sessions per 4 cores, not 2 per 2


def test_the_scan_past_a_node_with_room_by_charges_but_not_by_caps_takes_the_next() -> None:
    d = Driver([cpu_node(f"n{i:02}", cpu=8, mem=2048) for i in range(16)],
               session_memory_overcommit=1.0)
    d.arrive(*(act(f"h{i:02}", mem=1900) for i in range(16)))  # one per node: 148 MB free each
    d(ev.NodeAdded(0.0, cpu_node("n16", cpu=4, mem=4096)))
    d(ev.NodeAdded(0.0, cpu_node("n17", cpu=4, mem=4096)))
    out = d(ev.SessionRequested(0.0, "big", demand=Resources(memory_mb=3900), node="n16"))
    assert _opened(out) == [("big", "n16")]
    d(ev.MemoryReport(0.0, "n16", current_mb={"big": 10.0}, peak_mb={"big": 10.0}))
    assert d.core.nodes["n16"].free["memory_mb"] == 4096 - 64  # room by charges; caps 3900 + 256 > 4096
    # the 16 ranked first (8 cores, no session) have no room: the scan of all nodes passes
    # n16 and takes n17
    out = d(ev.SessionRequested(0.0, "s", demand=Resources(memory_mb=256)))
    assert _opened(out) == [("s", "n17")]


def _warm_driver(nodes, warm: bool, **cfg) -> tuple[Driver, str | None]:
    """A driver over ``nodes``; with ``warm``, every node warm for one image (sessions of it
    are then placed by `spread` over the warm nodes, else through the ranks)."""
    d = Driver(nodes, **cfg)
    if not warm:
        return d, None
    for n in nodes:
        d(ev.WarmPoolReport(0.0, n.name, "image:x", 1))
    return d, "image:x"


@pytest.mark.parametrize("warm", [False, True])
def test_a_node_without_cpu_is_the_last_a_session_opens_on(warm: bool) -> None:
    # actions of sessions need no CPU here, so the memory-only node has room; it counts as
    # ~0 cores (1e-9): 5 sessions per 4 cores on n0 still rank before it
    mem_only = NodeSpec("m0", Resources(memory_mb=8192), pool="cpu")
    d, key = _warm_driver([cpu_node("n0", cpu=4), mem_only], warm,
                          session_action_demand=Resources(memory_mb=256))
    got = []
    for i in range(5):
        out = d(ev.SessionRequested(0.0, f"s{i}", warm_key=key))
        got += _opened(out)
    assert got == [(f"s{i}", "n0") for i in range(5)]


@pytest.mark.parametrize("warm", [False, True])
def test_sub_core_nodes_rank_by_sessions_per_their_own_cores(warm: bool) -> None:
    # 1 session on 0.75 cores: (1 + 1) / 0.75 = 2.67 per core, before none on 0.25: 4
    d, key = _warm_driver([cpu_node("na", cpu=0.25), cpu_node("nb", cpu=0.75)], warm,
                          session_action_demand=Resources(cpu=0.25, memory_mb=256))
    out = d(ev.SessionRequested(0.0, "p", node="nb", warm_key=key))
    assert _opened(out) == [("p", "nb")]
    out = d(ev.SessionRequested(0.0, "s", warm_key=key))
    assert _opened(out) == [("s", "nb")]


def test_a_node_without_memory_takes_a_session_within_its_memory_tolerance() -> None:
    # (`fits` lets 1e-9 MB through on a node with none; the caps bound is then 3 x 0 + 1e-6)
    cpu_only = NodeSpec("c0", Resources(cpu=4), pool="cpu")
    d = Driver([cpu_only], session_action_demand=Resources(cpu=1))
    out = d(ev.SessionRequested(0.0, "s", demand=Resources(cpu=1, memory_mb=1e-10)))
    assert _opened(out) == [("s", "c0")]
    assert d.core.sessions.caps == {"c0": 1e-10}
