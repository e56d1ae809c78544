"""Work per decision stays flat as sessions and nodes grow (issue 24): counted in operations, not
time.

The pure core runs in a subprocess under a profile hook that counts Python function calls. The
calls to open one more session are compared with 200 and with 1,600 sessions already open on the
same nodes: summing every open session's demand per candidate node (as `Sessions.room` once did)
makes the second figure ~8x the first; a running sum keeps them about equal. Then the calls of
one session's open, and of a session action's arrival and end, on 16 and on 128 nodes (each with
sessions and running actions): a scan of every node per new session (as `Sessions.spread` over
the whole cluster once was) makes the opens ~8x; the index of nodes in spread order
(`Sessions.ranks`) keeps them about equal. Last, an arrival and an end with 200 and with 1,600
actions queued: a scan of the queue per event would make the second ~8x. And a session's close
(which frees room) with 200 and with 1,600 sessions waiting for room: a walk over the waiting
ones at each pass would make the second ~8x; their groups by shape (`Sessions._groups`) do
not. And an end on a node with 20 and with 160 session heads waiting there (issue 40): a plan
per head, each over every elastic action running on the node, made the work grow with both;
heads with no less work than one that just waited there wait without one (`Elastic.width_on`),
and aged heads that come with less work each are answered by one probe at the least work that
waited there at the last event."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = r"""
import json, sys
from arl_tangram.core.cluster import ClusterSpec, NodeSpec
from arl_tangram.core.core import Core
from arl_tangram.core.config import CoreConfig
from arl_tangram.core import events as ev
from arl_tangram.core.resources import Resources
from arl_tangram.core.actions import ActionSpec

def calls(fn):
    # Python and builtin calls made while fn() runs
    count = [0]
    def hook(frame, event, arg):
        if event == "call" or event == "c_call":
            count[0] += 1
    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count[0]

def calls_per_open(before, probes=20):
    nodes = tuple(NodeSpec(f"n{i}", Resources(cpu=192, memory_mb=786432)) for i in range(4))
    core = Core(ClusterSpec(nodes), CoreConfig(policy="tangram"))
    t = 0.0
    for i in range(before):
        t += 0.001
        core.handle(ev.SessionRequested(t, f"s{i}", Resources(memory_mb=64)))
    def opens():
        for i in range(probes):
            core.handle(ev.SessionRequested(t + 0.001 * (i + 1), f"p{i}", Resources(memory_mb=64)))
    return calls(opens) / probes

def calls_on_nodes(n, probes=20):
    nodes = tuple(NodeSpec(f"n{i}", Resources(cpu=192, memory_mb=786432)) for i in range(n))
    core = Core(ClusterSpec(nodes), CoreConfig(policy="tangram"))
    t = 0.0
    for i in range(4 * n):  # sessions everywhere, each with a running action
        t += 0.001
        core.handle(ev.ActionArrived(t, ActionSpec(f"w{i}", demand=Resources(cpu=1, memory_mb=256),
                                                   session=f"s{i}")))
    opens = actions = 0
    for i in range(probes):
        t += 0.001
        opens += calls(lambda: core.handle(ev.SessionRequested(t, f"p{i}", Resources(memory_mb=64))))
        def action():  # an action of an open session arrives, starts, ends
            core.handle(ev.ActionArrived(t, ActionSpec(f"q{i}", demand=Resources(cpu=1, memory_mb=256),
                                                       session=f"s{(7 * i) % (4 * n)}")))
            core.handle(ev.ActionFinished(t + 0.0005, f"q{i}"))
        actions += calls(action)
    return opens / probes, actions / probes

def calls_with_queued(queued, probes=20):
    # 4 nodes of 8 cores busy with long actions; ``queued`` more wait in the shared pool (a few
    # shapes, as a workload has); then actions arrive (and queue) and running ones end (and the
    # head of a queue starts in their place)
    nodes = tuple(NodeSpec(f"n{i}", Resources(cpu=8, memory_mb=65536)) for i in range(4))
    core = Core(ClusterSpec(nodes), CoreConfig(policy="tangram"))
    t = 0.0
    for i in range(32 + queued):
        t += 0.001
        core.handle(ev.ActionArrived(t, ActionSpec(f"w{i}", demand=Resources(cpu=1, memory_mb=256 * (1 + i % 3)))))
    def events():
        for i in range(probes):
            u = t + 0.001 * (i + 1)
            core.handle(ev.ActionArrived(u, ActionSpec(f"p{i}", demand=Resources(cpu=1, memory_mb=256))))
            core.handle(ev.ActionFinished(u + 0.0005, f"w{i}"))
    return calls(events) / probes

def calls_with_waiting(waiting, probes=20):
    # 4 nodes full of open sessions (by memory); ``waiting`` more wait for room, in two shapes;
    # then open ones close, one at a time: each close frees room and the waiting ones look again
    nodes = tuple(NodeSpec(f"n{i}", Resources(cpu=192, memory_mb=65536)) for i in range(4))
    core = Core(ClusterSpec(nodes), CoreConfig(policy="tangram"))
    t = 0.0
    for i in range(240 + waiting):
        t += 0.001
        core.handle(ev.SessionRequested(t, f"s{i}", Resources(memory_mb=1024 * (1 + i % 2))))
    assert len(core.sessions.pending) >= waiting, len(core.sessions.pending)
    core.handle(ev.SessionClosed(t, "s1"))  # (the first pass files each waiting one: once each)
    def closes():
        for i in range(probes):
            core.handle(ev.SessionClosed(t + 0.001 * (i + 1), f"s{2 * i}"))
    return calls(closes) / probes

def plans_per_end(heads, probes=2, aged=False):
    # one node of 16 cores: 16 sessions each with a long elastic test (1-8 cores; 8 run, 8
    # queue), ``heads`` more sessions each with one queued (of the same expected work); then
    # running ones end: each end's pass tries every waiting head on the node. Counted: the
    # calls of `Elastic.plan` (the fluid model over every elastic action running there).
    # ``aged``: the heads aged (1 s), oldest first with the most work (50 s less 0.01 s a
    # head): each has less work than the last that waited, so the memo answers none of them
    from arl_tangram.core.actions import ActionKind, Elasticity, Speedup, WorkHints
    aging = {"aging_s": 1.0, "aging_min_s": 1.0} if aged else {}
    core = Core(ClusterSpec((NodeSpec("n0", Resources(cpu=16, memory_mb=1 << 20)),)),
                CoreConfig(policy="tangram", session_ttl_s=1e6, **aging))
    el = Elasticity(1, 8, speedup=Speedup(0.9))
    def test(aid, sid, s):
        return ActionSpec(aid, kind=ActionKind.TEST, demand=Resources(cpu=1, memory_mb=64),
                          elasticity=el, session=sid, hints=WorkHints(expected_s=s))
    t = 0.0
    for i in range(16):
        t += 0.001
        core.handle(ev.ActionArrived(t, test(f"r{i}", f"s{i}", 100.0 + i)))
    for i in range(heads):
        t += 0.001
        core.handle(ev.ActionArrived(t, test(f"q{i}", f"h{i}", 50.0 - 0.01 * i if aged else 50.0)))
    count = [0]
    def hook(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "plan":
            count[0] += 1
    out = []
    for i in range(probes):
        count[0] = 0
        sys.setprofile(hook)
        try:
            core.handle(ev.ActionFinished(t + (2.0 if aged else 1.0) + i, f"r{i}"))
        finally:
            sys.setprofile(None)
        waiting = sum(1 for a in core.st.actions.values() if a.allotment is None)
        out.append([count[0], waiting])
    return out

def heads_on_one_node(cpu, heads, holders, need):
    # one node of ``cpu`` cores and 1 TB: ``heads`` sessions of 64 MB open, actions of the
    # shared pool hold ``holders`` (name -> MB), then each session queues an action of 1 core
    # and ``need`` MB; the core and the time of the last arrival
    core = Core(ClusterSpec((NodeSpec("n0", Resources(cpu=cpu, memory_mb=1 << 20)),)),
                CoreConfig(policy="tangram", session_ttl_s=1e6))
    t = 0.0
    for i in range(heads):
        t += 0.001
        core.handle(ev.SessionRequested(t, f"h{i}", Resources(memory_mb=64)))
    for name, mb in holders.items():
        core.handle(ev.ActionArrived(t, ActionSpec(name, demand=Resources(cpu=1, memory_mb=mb))))
    for i in range(heads):
        t += 0.001
        core.handle(ev.ActionArrived(t, ActionSpec(f"q{i}", demand=Resources(cpu=1, memory_mb=need),
                                                   session=f"h{i}")))
    return core, t

def calls_with_short(heads, probes=20):
    # one node of 8 cores and 1 TB: ``heads`` sessions of 64 MB open, a long action takes all
    # the memory but 2 GB, then each session queues an action that needs 4 GB; then short
    # actions of the shared pool arrive and end there, each end a pass over the node. Counted:
    # all calls of the ends, and the sessions parked after the first (heads short of memory)
    core, t = heads_on_one_node(8, heads, {"hog": (1 << 20) - 64 * heads - 2048}, 4096)
    def end(i):
        core.handle(ev.ActionArrived(t + 0.01 * i, ActionSpec(f"p{i}", demand=Resources(cpu=1, memory_mb=16))))
        core.handle(ev.ActionFinished(t + 0.01 * i + 0.005, f"p{i}"))
    end(0)  # (the first pass over the node parks them)
    parked = len(core.st.parked)
    total = 0
    for i in range(1, probes + 1):
        total += calls(lambda: end(i))
    return total / probes, parked

def calls_with_herd(heads, probes=16):
    # as `calls_with_short`, but the heads are all of one shape (1 core, 1 GB) and the node's
    # memory is held by 1 GB actions: each probe ends one of them, so one head fits and starts.
    # Counted: all calls of the ends, and the heads started
    holders = {"hog": (1 << 20) - 64 * heads - 512 - 1024 * probes}
    holders.update((f"m{j}", 1024) for j in range(probes))
    core, t = heads_on_one_node(64, heads, holders, 1024)
    core.handle(ev.ActionArrived(t + 0.001, ActionSpec("p", demand=Resources(cpu=1, memory_mb=16))))
    core.handle(ev.ActionFinished(t + 0.002, "p"))  # (the first pass over the node parks them)
    total = 0
    for j in range(probes):
        total += calls(lambda: core.handle(ev.ActionFinished(t + 0.01 * (j + 1), f"m{j}")))
    started = sum(1 for i in range(heads) if core.st.actions[f"q{i}"].allotment is not None)
    return total / probes, started

if sys.argv[1] == "sessions":
    print(json.dumps([calls_per_open(200), calls_per_open(1600)]))
elif sys.argv[1] == "waiting":
    print(json.dumps([calls_with_waiting(200), calls_with_waiting(1600)]))
elif sys.argv[1] == "heads":
    print(json.dumps([plans_per_end(20), plans_per_end(160)]))
elif sys.argv[1] == "aged":
    print(json.dumps([plans_per_end(20, aged=True), plans_per_end(160, aged=True)]))
elif sys.argv[1] == "queued":
    print(json.dumps([calls_with_queued(200), calls_with_queued(1600)]))
elif sys.argv[1] == "herd":
    print(json.dumps([calls_with_herd(20), calls_with_herd(160)]))
elif sys.argv[1] == "short":
    print(json.dumps([calls_with_short(20), calls_with_short(160)]))
else:
    print(json.dumps([calls_on_nodes(16), calls_on_nodes(128)]))
"""


def _probe(what: str) -> list:
    env = dict(os.environ, ARL_TANGRAM_PURE="1")
    out = subprocess.run([sys.executable, "-c", PROBE, what], env=env, capture_output=True,
                         text=True, check=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_opening_a_session_costs_the_same_with_eight_times_the_sessions_open() -> None:
    small, large = _probe("sessions")
    assert small > 0
    # linear work in the open sessions would be ~8x; allow what does not grow with them
    assert large < 1.5 * small, (small, large)


def test_a_session_open_and_an_action_cost_the_same_on_eight_times_the_nodes() -> None:
    (open_small, act_small), (open_large, act_large) = _probe("nodes")
    assert open_small > 0 and act_small > 0
    # linear work in the nodes would be ~8x; allow what does not grow with them
    assert open_large < 1.5 * open_small, (open_small, open_large)
    assert act_large < 1.5 * act_small, (act_small, act_large)


def test_an_arrival_and_an_end_cost_the_same_with_eight_times_the_actions_queued() -> None:
    small, large = _probe("queued")
    assert small > 0
    # a scan of the queued actions per event would be ~8x; a heap per queue grows as its log
    assert large < 1.5 * small, (small, large)


def test_a_close_costs_the_same_with_eight_times_the_sessions_waiting_for_room() -> None:
    small, large = _probe("waiting")
    assert small > 0
    # a walk over the waiting sessions at each pass would be ~8x; the groups by shape are not
    assert large < 1.5 * small, (small, large)


def test_an_end_plans_once_with_eight_times_the_heads_waiting_on_the_node() -> None:
    # (per end: [calls of `Elastic.plan`, actions still queued]) the end frees 2 cores beside 7
    # runs: the first head starts (a lane at the next end would be 16/7 -> 2 cores, as now's
    # 16/8: waiting buys no width, `Elastic.plan`), the next one plans and waits (8 runs: 2
    # cores now against 1 beside them), and every waiting head of the same elasticity with at
    # least its work waits without a plan (`Elastic.width_on`); a plan per head made these 28
    # and 168
    assert _probe("heads") == [[[2, 27], [2, 26]], [[2, 167], [2, 166]]]


def test_an_end_plans_once_with_eight_times_the_aged_heads_each_with_less_work() -> None:
    # (per end: [calls of `Elastic.plan`, actions still queued]) the aged heads come oldest
    # first, each with less work than the last: the memo of this instant answers none, but a
    # probe at the least work that waited at the last event does (`Elastic.width_on`); without
    # the probes these were 16 and 155 plans. (Each end starts its first head, as above, with
    # no probe: waiting would buy it no width, whatever its work; the hints stay. With 160
    # heads the node has settled at 16 runs of 1 core: after that start the next head finds
    # no core free and none lent, no room for its minimum, and waits without a plan.)
    assert _probe("aged") == [[[2, 27], [2, 26]], [[1, 159], [1, 158]]]


def test_an_end_costs_the_same_with_eight_times_the_heads_short_of_memory_on_the_node() -> None:
    """Issue 40: a session head that lacks memory on its node is parked out of the node's
    waiting set (`CoreState.park`) until the node's free memory reaches it, so a pass over the
    node for an end that frees too little does not look at it; before, every pass looked at
    each (its queue's head, then `_short_besides_cpu`) and an end cost ~8x with 8x the heads."""
    (small, parked_small), (large, parked_large) = _probe("short")
    assert (parked_small, parked_large) == (20, 160)  # every head parked by the first pass
    assert small > 0
    assert large < 1.5 * small, (small, large)


def test_an_end_that_frees_room_for_one_head_looks_at_one_of_eight_times_the_heads() -> None:
    """Issue 40: heads of one shape parked for memory; each end frees room for exactly one,
    which starts. The pass takes the node's group of them one head at a time while its memory
    fits them (`SchedulingPass.run_pass`), so an end costs the same with 8x the heads; giving
    back every head the memory freed fits made the pass try all of them, in vain but the first."""
    (small, started_small), (large, started_large) = _probe("herd")
    assert (started_small, started_large) == (16, 16)  # one head per end
    assert small > 0
    assert large < 1.5 * small, (small, large)
