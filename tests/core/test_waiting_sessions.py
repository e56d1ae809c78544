"""Sessions waiting for room, tried by shape (issue 24): `Sessions.open_pending` takes the first
waiting session of each shape from `Sessions._groups`, in the order of the wait, instead of
walking every waiting session. It must decide exactly as the walk (`_open_pending_walk`, the
reference): random streams of session requests of a few shapes and images, actions that join
waiting sessions (which moves their shape), closes and ends, on nodes with room for a few, give
the same commands and stories both ways. `Core.validate` (after every event) checks each waiting
session is filed once, under its shape and its place in the wait."""

from __future__ import annotations

import pytest
from core_helpers import Driver, act, cpu_node, starts
from hypothesis import given, settings
from hypothesis import strategies as st

from arl_tangram.core import events as ev
from arl_tangram.core.actions import WorkHints
from arl_tangram.core.resources import Resources
from arl_tangram.core.sessions import Sessions

request = st.tuples(st.just("request"), st.integers(0, 15), st.sampled_from([256, 512, 1024]),
                    st.sampled_from([None, "image:a"]))
step = st.one_of(
    request,
    st.tuples(st.just("action"), st.integers(0, 15), st.sampled_from([128, 512, 1536]),
              st.sampled_from([0.5, 5.0])),
    st.tuples(st.just("close"), st.integers(0, 15), st.just(0), st.just(None)),
    st.tuples(st.just("close open"), st.integers(0, 7), st.just(0), st.just(None)),
    st.tuples(st.just("close open"), st.integers(0, 7), st.just(0), st.just(None)),
    st.tuples(st.just("finish"), st.integers(1, 30), st.just(0), st.just(None)),
)
# a cluster full of sessions first (room for about four), then anything
stream = st.tuples(st.lists(request, min_size=6, max_size=12), st.lists(step, min_size=5, max_size=60))


def _run(steps: list[tuple]) -> Driver:
    d = Driver([cpu_node("n0", cpu=4, mem=2048), cpu_node("n1", cpu=2, mem=1536)],
               policy="tangram", session_ttl_s=1e6)
    t, n = 0.0, 0
    for what, i, size, extra in steps:
        t += 0.25
        d.at(t)
        if what == "request":
            d(ev.SessionRequested(t, f"s{i}", Resources(memory_mb=size), warm_key=extra))
        elif what == "action":
            n += 1
            d.arrive(act(f"a{n}", cpu=1, mem=size, session=f"s{i}", hints=WorkHints(expected_s=extra)))
        elif what == "close":
            d(ev.SessionClosed(t, f"s{i}"))
        elif what == "close open":  # the i-th open session (if any): room frees, the waiting look
            open_ = sorted(sid for sid, sess in d.core.st.sessions.items() if sess.node is not None)
            if open_:
                d(ev.SessionClosed(t, open_[i % len(open_)]))
        elif d.status(f"a{i}") is not None:
            d.finish(f"a{i}")
    d.at(t + 1.0).tick()
    return d


@pytest.mark.pure_core
@settings(max_examples=150, deadline=None)
@given(stream)
def test_the_waiting_sessions_open_as_the_walk_over_all_of_them_opens_them(stream) -> None:
    steps = stream[0] + stream[1]
    got = _run(steps)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Sessions, "open_pending", Sessions._open_pending_walk)
        ref = _run(steps)
    assert [repr(c) for c in got.log] == [repr(c) for c in ref.log]
    for aid in {c.result.id for c in got.delivered.values()}:
        assert got.core.story(aid) == ref.core.story(aid)


@pytest.mark.pure_core
def test_an_action_joining_a_waiting_session_files_it_under_its_new_shape() -> None:
    """s0 and its long action hold the node's memory, so s1 waits, filed under (its demand, the
    room kept for an action). A small action joins s1: it still does not fit now, and its shape
    is now that action's; a pass files it there. Cancelled, it leaves: the shape is the room's
    again. When s0's action ends, s1 opens and its next action starts."""
    d = Driver([cpu_node("n0", cpu=4, mem=1500)], policy="tangram", session_ttl_s=1e6)
    d(ev.SessionRequested(0.0, "s0", Resources(memory_mb=256)))
    assert "a0" in starts(d.at(0.1).arrive(act("a0", cpu=1, mem=1000, session="s0",
                                                hints=WorkHints(expected_s=100))))
    d(ev.SessionRequested(0.2, "s1", Resources(memory_mb=256)))
    sessions = d.core.sessions
    room = sessions.action_room
    for i, t in enumerate((0.3, 0.5)):  # an action of no session ends: a pass
        d.at(t).arrive(act(f"b{i}", cpu=1, mem=100))
        d.at(t + 0.05).finish(f"b{i}")
        if i == 0:
            assert sessions._entry["s1"][0][1] == room
            d.at(0.4).arrive(act("x", cpu=1, mem=128, session="s1"))
            assert "s1" in sessions._stale and list(sessions.pending) == ["s1"]
    assert sessions._entry["s1"][0][1].get("memory_mb") == 128 and sessions.action_room is room
    d(ev.CancelRequested(0.7, "x"))  # its only action gone: back to the room kept for one
    assert "s1" in sessions._stale
    d.at(0.8).arrive(act("b2", cpu=1, mem=100))
    d.at(0.85).finish("b2")
    assert sessions._entry["s1"][0][1] == room
    d.at(0.9).arrive(act("y", cpu=1, mem=128, session="s1"))
    assert "y" in starts(d.at(1.0).finish("a0"))
    assert not sessions.pending and d.core.st.sessions["s1"].node == "n0"
