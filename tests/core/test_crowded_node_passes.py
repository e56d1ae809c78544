"""A crowded node's passes look at what can have changed, not at all it holds (issue 40).

Two indexes, each exact:

- `Sessions.open_pending`: a shape of waiting sessions that found no node at the last pass is
  looked for, at the next, only on the nodes whose capacity came back since (`NodeState.grown`,
  counted by `give`) or that came; the others still have no room for it. Shown by giving one
  node room behind the core's back (its sessions' held sum lowered, no `give`): a full search
  would open there, the pass does not; a node added since is searched.
- `CoreState.waiting_on`: the sessions of a node that may have queued actions (each as it
  opens, dropped as its queue empties); the pass over a node whose capacity grew takes their
  heads from the node's `HeadStream` in order, so a node holding hundreds of idle sessions
  costs a pass only its waiting ones, and a crowded one only the heads it tries.

`tests/core/test_waiting_sessions.py` compares `open_pending` with the walk over every waiting
session on random streams; `Core.validate` checks every waiting session is in its node's set.
"""

from __future__ import annotations

import heapq

import pytest
from core_helpers import Driver, act, cpu_commands, cpu_node, elastic, starts

from arl_tangram.core import events as ev
from arl_tangram.core.actions import ActionSpec, WorkHints
from arl_tangram.core.cluster import NodeSpec
from arl_tangram.core.queues import AGED
from arl_tangram.core.resources import Resources

GB = Resources(memory_mb=1024)


def _full(nodes) -> Driver:
    """Sessions of 1 GB on ``nodes`` (4 GB each, room kept for a 1 GB action) until one waits:
    three a node, the next (``late``) waiting; then an action of no session ends on ``n0``, so
    a pass finds ``late``'s shape blocked everywhere."""
    d = Driver(nodes, policy="tangram", session_ttl_s=1e6)
    for i in range(3 * len(nodes)):
        d(ev.SessionRequested(0.01 * i, f"s{i}", GB))
    d(ev.SessionRequested(0.5, "late", GB))
    assert list(d.core.sessions.pending) == ["late"]
    d.at(0.6).arrive(act("x", cpu=1, mem=64))
    d.at(0.7).finish("x")
    return d


def test_a_blocked_shape_is_looked_for_only_where_capacity_came_back() -> None:
    d = _full([cpu_node("n0", cpu=4, mem=4096), cpu_node("n2", cpu=16, mem=4096)])
    sessions, nodes = d.core.sessions, d.core.st.nodes
    shape = (GB, sessions.action_room, None)
    assert sessions._blocked == {shape}
    assert {name: (node is nodes[name], g) for name, (node, g) in sessions._seen.items()} == {
        "n0": (True, nodes["n0"].grown), "n2": (True, nodes["n2"].grown)}
    # n2 gets room for one more session without giving anything back (not a core path): a
    # search of every node would open `late` there (4 of 16 cores' sessions rank before 3 of 4)
    sessions.held["n2"] = sessions.held["n2"] - GB
    on_n0 = sorted(sid for sid in nodes["n0"].sessions)
    g_n2 = nodes["n2"].grown
    d.core.handle(ev.SessionClosed(1.0, on_n0[0]))  # n0's capacity comes back: only n0 is looked at
    assert d.core.st.sessions["late"].node == "n0"
    assert nodes["n2"].grown == g_n2 and sessions._blocked == set()
    assert not sessions.pending


def test_a_node_that_came_since_is_looked_at() -> None:
    d = _full([cpu_node("n0", cpu=4, mem=4096), cpu_node("n1", cpu=4, mem=4096)])
    sessions = d.core.sessions
    assert sessions._seen["n1"][1] == 0  # (nothing came back on n1 yet)
    d(ev.NodeLost(1.0, "n1", reason="gone"))
    assert list(sessions.pending) == ["late"]
    # back under the same name: a new node whose count of returns (0) equals the old one's
    d(ev.NodeAdded(2.0, cpu_node("n1", cpu=4, mem=4096)))
    assert d.core.st.sessions["late"].node == "n1"
    assert not sessions.pending


def test_a_node_s_waiting_sessions_are_kept_as_they_open_and_dropped_as_their_queues_empty() -> None:
    d = Driver([cpu_node("n0", cpu=2, mem=8192)], policy="tangram", session_ttl_s=1e6)
    for i in range(3):
        d(ev.SessionRequested(0.01 * i, f"s{i}", Resources(memory_mb=256)))
    waiting_on = d.core.st.waiting_on
    assert waiting_on == {"n0": {"s0", "s1", "s2"}}  # each as it opened
    long = WorkHints(expected_s=100)
    assert "a0" in starts(d.at(0.1).arrive(act("a0", cpu=2, session="s0", hints=long)))
    assert waiting_on == {"n0": {"s1", "s2"}}  # (s0's queue emptied as a0 started)
    assert starts(d.at(0.2).arrive(act("a1", cpu=1, session="s1", hints=long))) == {}
    stream = d.core.queues.streams["n0"]
    assert [e[3] for e in stream.heap] == ["s1"] and (stream.need, stream.elastic) == (1.0, False)
    # a0 ends: the pass over n0 takes s1's head from the node's stream; a1 starts
    assert "a1" in starts(d.at(0.3).finish("a0"))
    assert waiting_on == {"n0": {"s2"}}
    assert starts(d.at(0.4).arrive(act("a2", cpu=2, session="s2", hints=long))) == {}
    assert waiting_on == {"n0": {"s2"}}
    assert "a2" in starts(d.at(0.5).finish("a1"))  # s2's head from the stream: a2 starts
    assert waiting_on == {"n0": set()}
    d.at(0.6).finish("a2")
    assert waiting_on == {"n0": set()}


def test_a_session_waiting_for_room_joins_its_node_as_it_opens() -> None:
    d = Driver([cpu_node("n0", cpu=2, mem=2048)], policy="tangram", session_ttl_s=1e6)
    d(ev.SessionRequested(0.0, "s0", Resources(memory_mb=1024)))
    assert "a0" in starts(d.at(0.1).arrive(act("a0", cpu=1, mem=1024, session="s0",
                                                hints=WorkHints(expected_s=100))))
    d.at(0.2).arrive(act("b0", cpu=1, mem=512, session="s1"))  # s1 opens implicitly: no room
    assert d.core.st.sessions["s1"].node is None and d.core.queues.waiting_sessions == {"s1"}
    assert d.core.st.waiting_on == {"n0": set()}  # (a queue of a session with no node: no node's)
    assert d.core.queues.streams == {}
    d.at(0.3).finish("a0")  # s0's action ends: s1 opens on n0 and b0 starts there
    assert d.core.st.sessions["s1"].node == "n0"
    assert d.core.status("b0") is not None and "b0" in d.core.st.nodes["n0"].running


def test_a_plan_reads_a_node_s_runs_once_per_state_and_instant() -> None:
    """`Elastic.plan` keeps its view of a node's elastic runs (work left, by work left) while
    the node is unchanged (`NodeState.moves`) at one instant, and reads them again at the next
    instant or once an allotment there changed."""
    d = Driver([cpu_node("n0", cpu=4, mem=8192)], policy="tangram")
    assert cpu_commands(d.at(0.0).arrive(elastic("e1", 1, 2, 1.0, hints=WorkHints(expected_s=10)),
                                         elastic("e2", 1, 2, 1.0, hints=WorkHints(expected_s=20)))) == [
        ("start", "e1", 2.0), ("start", "e2", 2.0)]
    core, node = d.core, d.core.st.nodes["n0"]
    plan, recs = core.elastic.plan, core.st.actions
    el = recs["e1"].spec.elasticity
    moves = node.moves
    d.at(1.0).tick()  # (nothing changes on the node: both run at their maximum)
    assert node.moves == moves
    plan(recs["e2"], node, 0)
    # work left: the estimate less 1 s at 2 cores (parallel fraction 1: speed 2)
    # ... with their classes in the fluid model: one, of maximum 2 and parallel fraction 1; their
    # maximums add up to 4
    assert core.elastic._runs == {node: (moves, 4.0, [(8.0, el), (18.0, el)],
                                         ([8.0, 18.0], [0, 0], [2.0], [1.0], 4.0))}
    recs["e1"].done += 1.0  # (behind the core's back: the view is kept at this instant)
    plan(recs["e2"], node, 0)
    assert core.elastic._runs[node][2] == [(8.0, el), (18.0, el)]
    recs["e1"].done -= 1.0
    d.at(2.0).tick()
    plan(recs["e2"], node, 0)  # the next instant: read again
    assert node.moves == moves
    assert core.elastic._runs == {node: (moves, 4.0, [(6.0, el), (16.0, el)],
                                         ([6.0, 16.0], [0, 0], [2.0], [1.0], 4.0))}
    d.at(2.0).finish("e1")  # an allotment changed: read again at the same instant
    assert node.moves > moves
    # (one run on 4 cores: a head alone would start now without the model, `_no_wider_later`;
    # with one behind it, the model weighs the runs)
    plan(recs["e2"], node, 0)
    assert core.elastic._runs[node][0] == moves  # (not read again: the last state's view stays)
    assert core.elastic._holds == {node: (node.moves, 2.0, 1)}
    plan(recs["e2"], node, 1)
    assert core.elastic._runs == {node: (node.moves, 2.0, [(16.0, el)], ([16.0], [0], [2.0], [1.0], 2.0))}


def _one_running(cpu: float):
    """Node n0 of ``cpu`` cores running e1 (1-2 cores, parallel fraction 1, 10 s expected) at
    2 cores since t=0, seen at t=0.5: (driver, core, node, its `Elastic`, e1's record)."""
    d = Driver([cpu_node("n0", cpu=cpu, mem=8192)], policy="tangram")
    assert cpu_commands(d.at(0.0).arrive(elastic("e1", 1, 2, 1.0, hints=WorkHints(expected_s=10)))) == [
        ("start", "e1", 2.0)]
    core, node = d.core, d.core.st.nodes["n0"]
    d.at(0.5).tick()
    return d, core, node, core.elastic, core.st.actions["e1"]


def test_a_head_waits_without_a_plan_only_as_a_session_head_at_the_same_instant() -> None:
    """`Elastic.width_on`'s memo of heads that waited on a node: it answers "wait" for a
    session's head (nothing behind it, nowhere else to go) with at least the least work that
    waited there, on the node as it was, at the same instant; a shared-pool head (others
    queued behind it, or a node elsewhere) is always planned, and the next instant plans anew."""
    d, core, node, E, rec = _one_running(cpu=3)
    assert core.st.expected_work(rec) == 10.0 and node.free.get("cpu") == 1.0
    # planned: 1 free core, so a head like e1 starts at 1 (sharing the 3 cores beats waiting
    # for e1's end, where it would start at 2: a width waiting buys, so the plan weighs it)
    assert E.width_on(rec, node, 0) == (1.0, 1.0) and E._waited == {}
    key = (node, node.moves, rec.spec.elasticity)
    E._waited[key] = 10.0  # (as if a head of 10 s had waited here now: no more work than it)
    assert E.width_on(rec, node, 0) == (0.0, 0.0)
    assert E.width_on(rec, node, 1) == (1.0, 1.0)  # (one queued behind it: planned)
    assert E.width_on(rec, node, 0, 5.0) == (1.0, 1.0)  # (a node elsewhere frees in 5 s: planned)
    E._waited[key] = 10.5  # (only a larger head waited: this one is planned, and starts)
    assert E.width_on(rec, node, 0) == (1.0, 1.0) and E._waited == {key: 10.5}
    E._waited[key] = 9.5  # (a smaller head waited: this one, with more work, waits too)
    assert E.width_on(rec, node, 0) == (0.0, 0.0)
    d.at(1.0).tick()  # the next instant, the node unchanged: the memo is forgotten
    assert node.moves == key[1] and E._waited == {key: 9.5}
    assert E.width_on(rec, node, 0) == (1.0, 1.0) and E._waited == {}
    # on 4 cores a head like e1 would start at 2 now as at e1's end: waiting buys no width, so
    # it starts whatever waited here (`Elastic._no_wider`: no memo, no probe)
    d, core, node, E, rec = _one_running(cpu=4)
    assert E.width_on(rec, node, 0) == (2.0, 2.0) and E._waited == {}  # (this instant's memo)
    E._waited[(node, node.moves, rec.spec.elasticity)] = 1.0
    assert E.width_on(rec, node, 0) == (2.0, 2.0)


def test_a_head_that_waits_is_remembered_with_its_work() -> None:
    """A session-like head planned to wait on a full node (the running action ends sooner at
    its maximum than both at one core each) is remembered under the node as it is, with its
    expected work; one that starts is not."""
    _, _, node, E, rec = _one_running(cpu=2)
    # waiting: e1 ends at 4.5 s, then the head at 9.5 s (14); sharing: 9 and 9.5 s (18.5)
    assert E.width_on(rec, node, 0) == (0.0, 0.0)
    assert E._waited == {(node, node.moves, rec.spec.elasticity): 10.0}
    assert E.width_on(rec, node, 1) == (0.0, 0.0)  # (planned, not remembered: not a session's head)
    assert E._waited == {(node, node.moves, rec.spec.elasticity): 10.0}


def _parked() -> Driver:
    """Node n0 (8 cores, 8 GB): sessions a, b, c of 64 MB; a long action `hog` of 5,876 MB and
    `y` of 1,100 MB leave 1,024 MB free; then a, b, c each queue an action of 2,048, 3,072 and
    1,536 MB (none fits), and a short shared-pool action `p0` ends there: the pass over n0 parks
    the three sessions (their heads lack memory there)."""
    d = Driver([cpu_node("n0", cpu=8, mem=8192)], policy="tangram", session_ttl_s=1e6)
    for i, sid in enumerate("abc"):
        d(ev.SessionRequested(0.01 * i, sid, Resources(memory_mb=64)))
    long = WorkHints(expected_s=100)
    assert set(starts(d.at(0.1).arrive(act("hog", mem=5876, hints=long), act("y", mem=1100, hints=long)))) == {
        "hog", "y"}
    assert d.core.st.nodes["n0"].free.get("memory_mb") == 1024.0
    for t, (sid, mb) in zip((0.2, 0.21, 0.22), (("a", 2048), ("b", 3072), ("c", 1536)), strict=True):
        assert starts(d.at(t).arrive(act(f"q{sid}", mem=mb, session=sid))) == {}
    st = d.core.st
    assert st.parked == {} and st.waiting_on == {"n0": {"a", "b", "c"}}  # (tried as they came)
    d.at(0.3).arrive(act("p0", mem=16))
    d.at(0.31).finish("p0")
    return d


def _needs(st) -> dict[str, float]:
    """The parked sessions and the memory their heads need."""
    return {sid: dict(shape)["memory_mb"] for sid, (shape, _) in st.parked.items()}


def _groups(st, node: str) -> dict[float, list[tuple[int, str]]]:
    """A node's groups of parked heads: memory needed -> (seq, session) in the queues' order."""
    return {g.need: [(e[1], e[2]) for e in sorted(g.heap)] for g in st.short_on.get(node, {}).values()}


def test_heads_short_of_memory_are_parked_until_the_node_has_what_they_need() -> None:
    """Issue 40: the pass over a node leaves out a session head that lacks memory there, and
    parks its session (`CoreState.park`): out of the node's waiting set, into the node's group
    of its shape; the passes that follow look at it only once the node's free memory reaches
    what it needs (`SchedulingPass.candidates`), so an end that frees less costs nothing per
    parked head."""
    d = _parked()
    st = d.core.st
    seq = {sid: st.actions[f"q{sid}"].seq for sid in "abc"}
    assert st.parked == {"a": ((("cpu", 1.0), ("memory_mb", 2048.0)), seq["a"]),
                         "b": ((("cpu", 1.0), ("memory_mb", 3072.0)), seq["b"]),
                         "c": ((("cpu", 1.0), ("memory_mb", 1536.0)), seq["c"])}
    assert st.waiting_on == {"n0": set()}
    assert _groups(st, "n0") == {2048.0: [(seq["a"], "a")], 3072.0: [(seq["b"], "b")],
                                 1536.0: [(seq["c"], "c")]}
    assert all(g.rigid for g in st.short_on["n0"].values())
    # y ends: 2,124 MB free; the pass takes a's head (2,048) and c's (1,536), not b's (3,072); a
    # comes first (it arrived first) and starts (its emptied group is gone), then c does not
    # fit: it stays parked
    assert set(starts(d.at(0.4).finish("y"))) == {"qa"}
    assert _needs(st) == {"b": 3072.0, "c": 1536.0} and st.waiting_on == {"n0": set()}
    assert _groups(st, "n0") == {3072.0: [(seq["b"], "b")], 1536.0: [(seq["c"], "c")]}
    # the hog ends: 5,952 MB free, both fit and start
    assert set(starts(d.at(0.6).finish("hog"))) == {"qb", "qc"}
    assert st.parked == {} and st.short_on["n0"] == {}


def test_a_parked_session_whose_queue_changes_is_looked_at_again() -> None:
    """A parked session's queue touched by an event (a new head, one that aged, an action
    taken off it) is back in its node's set at the event's end; one whose queue empties is no
    longer parked at all."""
    d = _parked()
    st = d.core.st
    # b gets an action that ranks first (1 ms expected): a new head, which fits and starts;
    # b's queue was touched, so b is looked at again by the node's next pass
    assert set(starts(d.at(0.4).arrive(act("b2", mem=16, session="b",
                                               hints=WorkHints(expected_s=0.001))))) == {"b2"}
    assert _needs(st) == {"a": 2048.0, "c": 1536.0} and st.waiting_on == {"n0": {"b"}}
    d.at(0.5).arrive(act("p1", mem=16))
    d.at(0.51).finish("p1")  # (b2 still holds its 16 MB: 1,008 free)
    assert _needs(st) == {"a": 2048.0, "b": 3072.0, "c": 1536.0} and st.waiting_on == {"n0": set()}
    # c's only action is cancelled: c waits no more, nor is parked
    d(ev.CancelRequested(0.6, "qc"))
    assert _needs(st) == {"a": 2048.0, "b": 3072.0} and "c" not in d.core.queues.waiting_sessions
    # a's and b's heads age (30 s): touched, so back in the set, and tried by every pass
    # (aged heads are never left out: one that does not fit holds a node for itself)
    d.at(31.0).tick()
    assert st.parked == {} and st.waiting_on == {"n0": {"a", "b"}}
    d.at(31.1).finish("b2")
    assert st.parked == {} and st.waiting_on == {"n0": {"a", "b"}}


def test_of_rigid_heads_of_one_shape_only_those_the_memory_can_hold_are_looked_at() -> None:
    """Issue 40: six sessions' heads of one shape (1 core, 1,024 MB) parked; an end that frees
    2,124 MB puts back only the first two in the queues' order (two such heads fit: the pass
    would try the others in vain), and both start; the rest stay parked."""
    d = Driver([cpu_node("n0", cpu=16, mem=16384)], policy="tangram", session_ttl_s=1e6)
    for i in range(6):
        d(ev.SessionRequested(0.01 * i, f"s{i}", Resources(memory_mb=64)))
    long = WorkHints(expected_s=100)
    hog = 16384 - 6 * 64 - 1100 - 1000
    assert set(starts(d.at(0.1).arrive(act("hog", mem=hog, hints=long), act("y", mem=1100, hints=long)))) == {
        "hog", "y"}
    for i in range(6):
        assert starts(d.at(0.2 + 0.01 * i).arrive(act(f"q{i}", mem=1024, session=f"s{i}"))) == {}
    d.at(0.3).arrive(act("p0", mem=16))
    d.at(0.31).finish("p0")
    st = d.core.st
    seq = [st.actions[f"q{i}"].seq for i in range(6)]
    assert _groups(st, "n0") == {1024.0: [(seq[i], f"s{i}") for i in range(6)]}
    assert st.waiting_on == {"n0": set()}
    assert set(starts(d.at(0.4).finish("y"))) == {"q0", "q1"}  # (2,100 MB free: two fit)
    assert _needs(st) == {f"s{i}": 1024.0 for i in range(2, 6)} and st.waiting_on == {"n0": set()}
    assert _groups(st, "n0") == {1024.0: [(seq[i], f"s{i}") for i in range(2, 6)]}


def test_a_node_s_group_of_parked_heads_keeps_its_live_entries_only() -> None:
    """Each park pushes an entry; one whose session was looked at again since goes stale
    (skipped when popped). Past twice the live entries of the last compaction plus 32, the group
    keeps its live ones only, so a session parked and touched over and over costs bounded room."""
    d = _parked()
    st = d.core.st
    group = st.short_on["n0"][(st.parked["b"][0], True)]
    sizes = []
    for i in range(40):  # b: a new head that starts (touched), then a pass parks b again
        t = 1.0 + 0.5 * i  # (all before the heads' aging at 30 s)
        assert set(starts(d.at(t).arrive(act(f"b{i}", mem=16, session="b",
                                               hints=WorkHints(expected_s=0.001))))) == {f"b{i}"}
        d.at(t + 0.25).finish(f"b{i}")
        assert _needs(st) == {"a": 2048.0, "b": 3072.0, "c": 1536.0}
        sizes.append(len(group.heap))
    # 1 entry, one more per round; at 33 (> 2 x 0 + 32) the one live entry is kept, then it
    # grows again (the next cut past 2 x 1 + 32 = 34)
    assert sizes == [*range(2, 33), *range(1, 10)]
    # (b's head is qb throughout: its entries are all the same one, kept once at the cut)
    assert group.kept == 1 and {e[1:] for e in group.heap} == {(st.parked["b"][1], "b")}


def _one_short(mem_need: float, disk_need: float) -> Driver:
    """Node n0 (8 cores, 4,096 MB, 100 MB of disk): session s (64 MB), a long action holding
    all but 1,024 MB and 40 MB of disk, then s's action needing ``mem_need`` MB and ``disk_need`` of disk queues,
    and a shared-pool action ends there (a pass over n0)."""
    d = Driver([NodeSpec("n0", Resources(cpu=8, memory_mb=4096, disk_mb=100))], policy="tangram",
               session_ttl_s=1e6)
    d(ev.SessionRequested(0.0, "s", Resources(memory_mb=64)))
    hog = ActionSpec("hog", demand=Resources(cpu=1, memory_mb=3008, disk_mb=60), hints=WorkHints(expected_s=100))
    assert set(starts(d.at(0.1).arrive(hog))) == {"hog"}
    spec = ActionSpec("q", demand=Resources(cpu=1, memory_mb=mem_need, disk_mb=disk_need), session="s")
    assert starts(d.at(0.2).arrive(spec)) == {}
    d.at(0.3).arrive(act("p0", mem=16))
    d.at(0.31).finish("p0")
    return d


def test_only_a_head_short_of_memory_is_parked() -> None:
    """A head short of memory by half a megabyte is parked; one that fits the memory exactly
    but lacks disk is left out of the pass as before, not parked (its node's passes look at it
    each time: no memory freed would tell when it fits)."""
    d = _one_short(1024.5, 10)
    assert _needs(d.core.st) == {"s": 1024.5}
    d = _one_short(1024.0, 50)
    assert d.core.st.parked == {} and d.core.st.waiting_on == {"n0": {"s"}}


def test_validate_names_a_parked_head_that_breaks_the_rules() -> None:
    """`Core.validate`'s checks of the parked sessions, each made to fail alone."""
    def broken(name: str, spoil) -> None:
        d = _parked()
        spoil(d.core.st)
        with pytest.raises(AssertionError, match=f"invariant {name} broken"):
            d.core.validate()

    broken("parked-waits", lambda st: st.parked.__setitem__("zz", st.parked["a"]))
    broken("parked-head", lambda st: st.parked.__setitem__("a", (st.parked["a"][0], -1)))
    broken("parked-head", lambda st: st.parked.__setitem__("a", (st.parked["c"][0], st.parked["a"][1])))
    broken("parked-in-its-group", lambda st: st.short_on["n0"].clear())
    broken("parked-in-its-group", lambda st: st.short_on["n0"][(st.parked["a"][0], True)].heap.clear())


def _a_parked(hog: float, y: float, qa: float) -> Driver:
    """Node n0 (8 cores, 8 GB): session a (64 MB); long actions `hog` and `y` of ``hog`` and
    ``y`` MB; a's action `qa` of ``qa`` MB queues, and a shared-pool action's end (a pass over
    n0) parks a."""
    d = Driver([cpu_node("n0", cpu=8, mem=8192)], policy="tangram", session_ttl_s=1e6)
    d(ev.SessionRequested(0.0, "a", Resources(memory_mb=64)))
    long = WorkHints(expected_s=100)
    assert set(starts(d.at(0.1).arrive(act("hog", mem=hog, hints=long), act("y", mem=y, hints=long)))) == {
        "hog", "y"}
    assert starts(d.at(0.2).arrive(act("qa", mem=qa, session="a"))) == {}
    d.at(0.3).arrive(act("p0", mem=16))
    d.at(0.31).finish("p0")
    assert _needs(d.core.st) == {"a": qa}
    return d


def test_a_parked_head_touched_by_the_pass_s_own_event_is_tried_once() -> None:
    """Session a's head (3,000 MB) parked on n0 (2,028 MB free); at 31 s it has aged (its queue
    touched) when the hog ends in the same event: it is tried as its queue's head (aged,
    first) and starts, and not a second time from its group (room is left for a second)."""
    d = _a_parked(hog=6000, y=100, qa=3000)
    st = d.core.st
    out = d.at(31.0).finish("hog")
    assert [(type(c).__name__, c.action.id) for c in out if type(c).__name__ == "StartAction"] == [
        ("StartAction", "qa")]
    assert st.parked == {} and st.nodes["n0"].free.get("memory_mb") == 8192 - 64 - 100 - 3000


def test_a_parked_head_is_tried_when_the_memory_freed_is_exactly_what_it_needs() -> None:
    """a's head needs 4,128 MB; 2,000 are free when it is parked, and y's end frees exactly the
    rest: it is tried, and starts."""
    d = _a_parked(hog=4000, y=2128, qa=4128)
    assert set(starts(d.at(0.4).finish("y"))) == {"qa"}
    assert d.core.st.parked == {} and d.core.st.nodes["n0"].free.get("memory_mb") == 0.0


def test_validate_names_a_parked_head_that_aged() -> None:
    """A parked session's head is never aged (aging touches its queue, which unparks it): one
    aged behind the core's back breaks `parked-head`."""
    d = _parked()
    rec = d.core.st.actions["qa"]
    heapq.heappush(d.core.queues.heaps[("sess", "a")], (AGED, rec.seq, rec.gen, "qa"))
    with pytest.raises(AssertionError, match="invariant parked-head broken"):
        d.core.validate()


def test_a_parked_head_is_tried_when_only_expiries_freed_its_memory() -> None:
    """Two nodes' sessions expire in one event (a tick): both nodes' capacity grew, no queue
    is touched and no session of them waits in their sets (a's is parked): the pass still
    runs for a's group, whose memory the expiry on n0 freed, and a's head starts."""
    d = Driver([cpu_node("n0", cpu=8, mem=8192), cpu_node("n1", cpu=8, mem=8192)], policy="tangram",
               session_ttl_s=1e6)
    for sid, mb, node, ttl in (("a", 64, "n0", 1e6), ("h", 64, "n0", 1e6), ("e0", 2000, "n0", 1.0),
                               ("e1", 64, "n1", 1.0)):
        d(ev.SessionRequested(0.0, sid, Resources(memory_mb=mb), ttl_s=ttl, node=node))
    assert set(starts(d.at(0.1).arrive(act("hog", mem=4000, session="h", hints=WorkHints(expected_s=100))))) == {
        "hog"}
    assert d.core.st.nodes["n0"].free.get("memory_mb") == 2064.0
    assert starts(d.at(0.2).arrive(act("qa", mem=3000, session="a"))) == {}
    d.at(0.3).arrive(act("hx", mem=16, session="h"))
    d.at(0.31).finish("hx")  # (a pass over n0: a parked)
    assert _needs(d.core.st) == {"a": 3000.0}
    assert set(starts(d.at(2.0).tick())) == {"qa"}  # e0 and e1 expire: 4,064 MB free on n0
    assert "e0" not in d.core.st.sessions and "e1" not in d.core.st.sessions
    assert d.core.st.parked == {}


def test_a_queue_s_next_head_takes_its_turn_by_arrival_in_the_pass() -> None:
    """n0 (2 cores, with an idle session: the pass looks at every queue) runs L on both; a1,
    a2, a3 of one expected size queue in that order, a1 and a3 of one shape, a2 of another.
    L ends: a1 starts, then its queue's next (a3) waits its turn behind a2, which arrived
    before it: a2 takes the last core."""
    d = Driver([cpu_node("n0", cpu=2, mem=8192)], policy="tangram", session_ttl_s=1e6)
    d(ev.SessionRequested(0.0, "s", Resources(memory_mb=64)))
    assert set(starts(d.at(0.1).arrive(act("L", cpu=2, hints=WorkHints(expected_s=100))))) == {"L"}
    one = WorkHints(expected_s=1)
    for t, aid, mb in ((0.2, "a1", 256), (0.21, "a2", 512), (0.22, "a3", 256)):
        assert starts(d.at(t).arrive(act(aid, mem=mb, hints=one))) == {}
    out = d.at(0.3).finish("L")
    assert [c.action.id for c in out if type(c).__name__ == "StartAction"] == ["a1", "a2"]


def test_a_node_keeps_its_runs_above_their_minimum_as_its_lenders_in_start_order() -> None:
    """`NodeState.lent`: the elastic runs there holding more than their minimum, kept by
    `ActionRecord.allot` (a start, a growth, a shrink) and `Core._release`; `Elastic._lenders`
    walks them, not every run, in the order of `NodeState.elastic` (`el_rank`)."""
    d = Driver([cpu_node("n0", cpu=6, mem=8192)], policy="tangram")
    assert cpu_commands(d.at(0.0).arrive(elastic("e1", 1, 2, 1.0, hints=WorkHints(expected_s=10)),
                                         elastic("e2", 1, 2, 1.0, hints=WorkHints(expected_s=20)),
                                         elastic("e3", 2, 2.5, 1.0, hints=WorkHints(expected_s=30)))) == [
        ("start", "e1", 2.0), ("start", "e2", 2.0), ("start", "e3", 2.0)]
    core, node = d.core, d.core.st.nodes["n0"]
    recs = core.st.actions
    assert list(node.lent) == ["e1", "e2"]  # (e3 at its minimum: it lends nothing)
    assert [recs[a].el_rank for a in ("e1", "e2", "e3")] == [0, 1, 2] and node.joined == 3
    assert all(recs[a].lent_on is node.lent for a in ("e1", "e2", "e3"))
    assert core.elastic.lendable(node, 0.0) == 2.0
    assert core.elastic.reclaim(node, Resources(cpu=1))  # the most work left shrinks first: e2
    assert (recs["e2"].width, list(node.lent)) == (1.0, ["e1"])
    assert core.elastic.lendable(node, 0.0) == 1.0
    node.take({"cpu": 0.5})  # (a growth into the core e2 gave back, by hand)
    recs["e3"].allot(recs["e3"].allotment.with_amount("cpu", 2.5))
    assert list(node.lent) == ["e1", "e3"]
    lenders: list = []
    assert core.elastic._lenders(node, 0.0, lenders) == (1.5, 1.5) and lenders == [recs["e1"], recs["e3"]]
    node.give({"cpu": 1.0})
    recs["e1"].allot(recs["e1"].allotment.with_amount("cpu", 1.0))
    node.take({"cpu": 1.0})
    recs["e1"].allot(recs["e1"].allotment.with_amount("cpu", 2.0))  # (back above: after e3 in `lent`)
    assert list(node.lent) == ["e3", "e1"]
    lenders = []
    assert core.elastic._lenders(node, 0.0, lenders) == (1.5, 1.5)
    assert lenders == [recs["e1"], recs["e3"]]  # (the node's order, not `lent`'s)
    e1 = recs["e1"]
    d.at(1.0).finish("e1")
    assert e1.lent_on is None and "e1" not in node.lent
    assert recs["e2"].width == 2.0 and list(node.lent) == ["e3", "e2"]  # (e2 grew into e1's cores)
