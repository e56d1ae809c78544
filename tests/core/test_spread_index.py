"""The indexed choice of a session's node (`Sessions.spread_all`, issue 24) is the scan's choice.

Random sessions, session actions, closes, node losses and returns and warm-pool reports on
clusters of unequal nodes, some filling up (so room fails on the nodes ranked first and the
index falls back to a scan); before each new session, the node the index picks is compared with
`Sessions.spread` over every node (the rule it replaces: fewest sessions per core, then most
free CPU, then the name; warm nodes first), and the core's invariants (the index's ranks
included) are checked after every event."""

from __future__ import annotations

import random

import pytest
from core_helpers import Driver, act, cpu_node

from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core.actions import Status
from arl_tangram.core.resources import Resources


def _cluster(rng: random.Random, n: int) -> list:
    return [cpu_node(f"n{i:02d}", cpu=rng.choice([4, 8, 16]), mem=rng.choice([4096, 8192, 16384]))
            for i in range(n)]


@pytest.mark.parametrize("seed", range(6))
def test_the_indexed_node_for_a_session_is_the_one_a_scan_of_every_node_picks(seed: int) -> None:
    rng = random.Random(seed)
    nodes = _cluster(rng, 40)
    d = Driver(nodes, policy="tangram")
    sess = d.core.sessions
    open_: list[str] = []
    lost: list = []
    compared = 0
    for step in range(600):
        t = step * 0.01
        r = rng.random()
        if r < 0.35:
            sid = f"s{step}"
            demand = Resources(memory_mb=rng.choice([256, 512, 1024, 2048]))
            key = rng.choice([None, None, "image:a", "image:b"])
            want = sess.spread(list(d.core.nodes.values()), demand, sess.action_room, False, key)
            out = d(ev.SessionRequested(t, sid, demand=demand, warm_key=key))
            opened = [c.node for c in out if isinstance(c, cmd.OpenSession)]
            assert opened == ([want.name] if want is not None else []), (step, opened, want)
            compared += 1
            if opened:
                open_.append(sid)
        elif r < 0.6 and open_:
            sid = rng.choice(open_)
            aid = f"a{step}"
            d.at(t).arrive(act(aid, cpu=rng.choice([1, 2]), mem=256, session=sid))
        elif r < 0.75:
            running = sorted(a for a, rec in d.core.st.actions.items()
                             if rec.status in (Status.STARTING, Status.RUNNING))
            if running:
                d(ev.ActionFinished(t, rng.choice(running)))
        elif r < 0.85 and open_:
            d(ev.SessionClosed(t, open_.pop(rng.randrange(len(open_)))))
        elif r < 0.9:
            alive = [n for n in nodes if d.core.nodes[n.name].alive]
            if len(alive) > 4:
                gone = rng.choice(alive)
                d(ev.NodeLost(t, gone.name))
                lost.append(gone)
        elif r < 0.95 and lost:
            d(ev.NodeAdded(t, lost.pop(rng.randrange(len(lost)))))
        else:
            name = rng.choice(nodes).name
            if d.core.nodes[name].alive:
                d(ev.WarmPoolReport(t, name, rng.choice(["image:a", "image:b"]), rng.choice([0, 1, 2])))
        # sessions closed by a loss are gone from the core: forget them here too
        open_ = [s for s in open_ if s in d.core.st.sessions]
    assert compared > 150


def test_past_full_nodes_ranked_first_the_index_still_finds_room() -> None:
    """More nodes ranked first than `spread_all` tries are full (no memory left for a session):
    the pick is still the scan's."""
    nodes = [cpu_node(f"full{i:02d}", cpu=64, mem=2048) for i in range(30)]
    nodes += [cpu_node("roomy", cpu=4, mem=65536)]
    d = Driver(nodes, policy="tangram")
    for i in range(30):  # one session on each small node: no room for a second one there
        d(ev.SessionRequested(0.0, f"f{i}", demand=Resources(memory_mb=512), node=f"full{i:02d}"))
    sess = d.core.sessions
    demand = Resources(memory_mb=1024)
    want = sess.spread(list(d.core.nodes.values()), demand, sess.action_room, False)
    assert want is not None and want.name == "roomy"
    out = d(ev.SessionRequested(1.0, "new", demand=demand))
    assert [c.node for c in out if isinstance(c, cmd.OpenSession)] == ["roomy"]
