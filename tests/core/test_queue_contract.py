"""`core.queues.Queues`' contract, piece by piece (issue 27, mutation testing of core/queues.py).

The scheduling pass looks only at the queues `enqueue`, `dequeue`, `age` and `wake_overdue`
mark (``st.touched``): a queue whose head changed and may now fit. These tests build queue
states directly (records queued by hand on a core that handles no event), so that each rule is
checked where a whole run would hide it:

- `enqueue` marks its queue iff the new entry is the queue's head, stale entries above it
  popped; a shared-pool queue with a blocked head only when capacity freed (``st.dirty``) or the
  action arrives aged;
- `dequeue` marks a session queue whose next head may now fit, never a shape's or a model's;
- a queue's state is dropped when its last action leaves; an action queued again is ordered by
  its new entry only;
- `rank` orders by expected work x max(dominant share, 1e-3) / weight in half-octave classes
  (models: share 0), zero work first, FIFO floors bounded;
- an action ages at exactly its time, and its story says so; `wake_overdue` acts at exactly
  an elastic action's overdue time.
"""

from __future__ import annotations

import math
import random

from core_helpers import Driver, act, cpu_node, starts

from arl_tangram.core import Core, CoreConfig
from arl_tangram.core.actions import (
    ActionKind,
    ActionSpec,
    Elasticity,
    Speedup,
    Status,
    WorkHints,
)
from arl_tangram.core.cluster import ClusterSpec, NodeSpec
from arl_tangram.core.queues import AGED
from arl_tangram.core.records import ActionRecord
from arl_tangram.core.resources import Resources


def _core(**cfg: float | str) -> Core:
    cfg = {"policy": "tangram", "aging_s": 1e6, "aging_min_s": 1e6, **cfg}
    core = Core(ClusterSpec((NodeSpec("n0", Resources(cpu=8, memory_mb=8192)),)),
                CoreConfig(**cfg))  # type: ignore[arg-type]
    core.st.dirty.clear()  # (its nodes, new: as after a first pass)
    return core


def _queue(core: Core, aid: str, est: float, seq: int, submit: float | None = None,
           units: float | None = None, **kw: object) -> ActionRecord:
    """A record queued by hand: its own FIFO group (``units``) unless told."""
    kw.setdefault("demand", Resources(cpu=1, memory_mb=256))
    rec = ActionRecord(ActionSpec(aid, **kw), core.st.now if submit is None else submit, seq)  # type: ignore[arg-type]
    rec.est = est
    rec.units = float(seq) if units is None else units
    core.st.actions[aid] = rec
    rec.move(Status.QUEUED, core.st.now, "test")
    core.queues.enqueue(rec)
    return rec


def _head(core: Core, key: object) -> str | None:
    got = core.queues.head(key)
    return None if got is None else got[0].spec.id


SESS = ("sess", "s1")


# ---- enqueue: which queues the pass looks at ----------------------------------------------------
def test_a_new_head_marks_its_queue_and_an_entry_behind_the_head_does_not() -> None:
    core = _core()
    touched = core.st.touched
    _queue(core, "b", 4.0, 11, session="s1")
    assert SESS in touched
    touched.clear()
    _queue(core, "c", 16.0, 12, session="s1")  # behind b (b and c have the same gen, 1)
    assert SESS not in touched
    _queue(core, "a", 1.0, 13, session="s1")  # ahead of b
    assert SESS in touched and _head(core, SESS) == "a"


def test_a_head_under_a_stale_entry_is_found() -> None:
    """The top entry went stale (its action left and came back with a larger estimate): the
    new entry is the head once it is popped, and the action that came back is ordered by its new
    entry only."""
    core = _core()
    a = _queue(core, "a", 1.0, 11, session="s1")
    _queue(core, "b", 16.0, 12, session="s1")
    core.queues.dequeue(a)
    a.est = 64.0
    core.queues.enqueue(a)  # a's first entry stays on top, stale (same queue, older gen)
    core.st.touched.clear()
    _queue(core, "c", 4.0, 13, session="s1")
    assert SESS in core.st.touched
    assert _head(core, SESS) == "c"
    order = []
    while (h := _head(core, SESS)) is not None:
        order.append(h)
        core.queues.started(core.st.actions[h])
    assert order == ["c", "b", "a"]


def test_an_action_queued_again_twice_keeps_only_its_last_entry() -> None:
    core = _core()
    _queue(core, "z", 2.0 ** 20, 10, session="s1")  # (keeps the queue, and a's old entries)
    a = _queue(core, "a", 1.0, 11, session="s1")
    for est in (2.0 ** 6, 2.0 ** 12):
        core.queues.dequeue(a)
        a.est = est
        core.queues.enqueue(a)
    _queue(core, "b", 2.0 ** 9, 12, session="s1")  # between a's second and third estimates
    assert _head(core, SESS) == "b"


def test_a_stale_entry_of_a_finished_action_is_skipped() -> None:
    core = _core()
    a = _queue(core, "a", 1.0, 11, session="s1")
    _queue(core, "b", 16.0, 12, session="s1")
    core.queues.dequeue(a)
    del core.st.actions["a"]  # delivered and forgotten; its entry is still on top
    core.st.touched.clear()
    _queue(core, "c", 4.0, 13, session="s1")
    assert SESS in core.st.touched and _head(core, SESS) == "c"


def test_an_entry_behind_the_next_head_under_a_stale_entry_marks_nothing() -> None:
    core = _core()
    a = _queue(core, "a", 1.0, 11, session="s1")
    _queue(core, "b", 4.0, 12, session="s1")  # gen 1, like c below
    core.queues.dequeue(a)
    core.st.touched.clear()
    _queue(core, "c", 16.0, 13, session="s1")
    assert SESS not in core.st.touched


def test_a_shared_pool_queue_with_a_blocked_head_is_looked_at_only_when_it_may_move() -> None:
    """After a pass every head is blocked; a new head of the same shape (the same demand) is
    blocked too unless capacity freed since (``dirty``) or it arrives aged."""
    core = _core(aging_s=10.0, aging_min_s=10.0)
    touched = core.st.touched
    x = _queue(core, "x", 16.0, 11)
    key = x.queue_key
    assert key in touched  # a new queue
    touched.clear()
    _queue(core, "y", 1.0, 12)  # the head now, but nothing freed: still blocked
    assert _head(core, key) == "y" and key not in touched
    core.st.dirty.add("n0")
    _queue(core, "z", 0.25, 13)
    assert _head(core, key) == "z" and key in touched
    core.st.dirty.clear()
    touched.clear()
    core.st.now = 10.0  # w was submitted at 0: it has waited its aging_after exactly
    _queue(core, "w", 16.0, 14, submit=0.0)
    got = core.queues.head(key)
    assert got is not None and got[0].spec.id == "w" and got[1][0] == AGED
    assert key in touched


# ---- dequeue and leaving ------------------------------------------------------------------------
def test_dequeue_marks_a_session_queue_with_others_left_only() -> None:
    core = _core()
    touched = core.st.touched
    a = _queue(core, "a", 1.0, 11, session="s1")
    b = _queue(core, "b", 16.0, 12, session="s1")
    touched.clear()
    core.queues.dequeue(a)  # b, the one left, may fit where a did not
    assert touched == {SESS}
    touched.clear()
    core.queues.dequeue(b)  # nothing left
    assert SESS not in touched
    x = _queue(core, "x", 1.0, 21)
    _queue(core, "y", 16.0, 22)
    m1 = _queue(core, "m1", 1.0, 31, kind=ActionKind.REWARD, model="rm", demand=Resources(),
                hints=WorkHints(tokens=100))
    _queue(core, "m2", 2.0, 32, kind=ActionKind.REWARD, model="rm", demand=Resources(),
           hints=WorkHints(tokens=100))
    touched.clear()
    core.queues.dequeue(x)  # the next head has x's shape: blocked as x was
    core.queues.dequeue(m1)  # model queues are the planner's (models_touched)
    assert not touched


def test_a_queue_is_dropped_when_its_last_action_leaves() -> None:
    core = _core()
    q = core.queues
    a = _queue(core, "a", 1.0, 11, session="s1")
    x = _queue(core, "x", 1.0, 12)
    shape = x.queue_key
    assert SESS in q.heaps and shape in q.heaps and shape in q.shape_keys
    assert q.waiting_sessions == {"s1"}
    q.dequeue(a)
    q.started(x)
    assert SESS not in q.heaps and SESS not in q.live
    assert shape not in q.heaps and shape not in q.live and shape not in q.shape_keys
    assert not q.waiting_sessions
    assert a.queue_key is None and x.queue_key is None


def test_queued_elastic_counts_every_elastic_shape() -> None:
    core = _core()
    el = Elasticity(1, 4, speedup=Speedup(0.9))
    for i in range(2):
        _queue(core, f"a{i}", 1.0, 10 + i, kind=ActionKind.TEST, elasticity=el,
               demand=Resources(cpu=1, memory_mb=256))
    for i in range(3):
        _queue(core, f"b{i}", 1.0, 20 + i, kind=ActionKind.TEST, elasticity=el,
               demand=Resources(cpu=1, memory_mb=512))
    _queue(core, "rigid", 1.0, 30)
    assert core.queues.queued_elastic() == 5


# ---- order ------------------------------------------------------------------------------------
def _class(rec: ActionRecord, core: Core) -> float:
    """The documented priority class: expected work x max(dominant share, 1e-3) / weight in
    half-octaves (a model action's share is 0); no work first."""
    share = 0.0 if rec.is_model else rec.spec.demand.dominant_share(core.st.largest())
    x = rec.est * max(share, 1e-3) / rec.spec.weight
    if x <= 0.0:
        return -math.inf
    m, e = math.frexp(x)
    return float(2 * e + (m >= math.sqrt(0.5)))


def _same_order(core: Core, recs: list[ActionRecord]) -> None:
    ranks = [core.queues.rank(r) for r in recs]
    classes = [_class(r, core) for r in recs]
    for i in range(len(recs)):
        for j in range(len(recs)):
            want = (classes[i] > classes[j]) - (classes[i] < classes[j])
            got = (ranks[i] > ranks[j]) - (ranks[i] < ranks[j])
            assert got == want, (recs[i].spec, recs[i].est, recs[j].spec, recs[j].est)


def test_rank_orders_by_work_times_share_over_weight() -> None:
    core = _core()
    rng = random.Random(27)
    demands = [Resources(cpu=8, memory_mb=64), Resources(cpu=4, memory_mb=64),
               Resources(cpu=1, memory_mb=6000), Resources(cpu=0.001, memory_mb=1)]
    recs = []
    for i in range(160):
        spec = ActionSpec(f"a{i}", demand=demands[i % 4], weight=rng.choice([0.5, 1.0, 3.0]))
        rec = ActionRecord(spec, 0.0, i)
        rec.est = 10 ** rng.uniform(-3, 4)
        recs.append(rec)
    _same_order(core, recs)
    # a model action's demand (the default one here) does not count: share 0, floored at 1e-3
    models = []
    for i in range(120):
        rec = ActionRecord(ActionSpec(f"m{i}", kind=ActionKind.REWARD, model="rm"), 0.0, i)
        rec.est = 10 ** rng.uniform(-2, 3)
        models.append(rec)
    _same_order(core, models)


def test_the_upper_half_octave_starts_at_sqrt_half() -> None:
    core = _core()
    recs = []
    for i, x in enumerate([math.sqrt(0.5), math.nextafter(math.sqrt(0.5), 0.0), 1.0, 0.5]):
        rec = ActionRecord(ActionSpec(f"a{i}", demand=Resources(cpu=8, memory_mb=8192)), 0.0, i)
        rec.est = x  # share 1: x is the measure itself
        recs.append(rec)
    r = [core.queues.rank(x) for x in recs]
    assert r[3] == r[1] < r[0] < r[2]  # [0.5, sqrt(0.5)), [sqrt(0.5), 1), [1, ...)


def test_an_action_with_no_expected_work_goes_first_even_behind_its_kind() -> None:
    """The FIFO floor keeps actions of one kind in arrival order as estimates drift; an action
    expected to take no time still goes first (the floor applies to ranked work only)."""
    core = _core()
    a = _queue(core, "a", 5.0, 11, units=1.0)
    _queue(core, "b", 0.0, 12, units=1.0)  # the same estimator key, units and weight as a
    assert _head(core, a.queue_key) == "b"


def test_fifo_floors_stay_bounded() -> None:
    core = _core()
    for i in range(4097):  # one kind of work (units) more than the table holds: it restarts
        _queue(core, f"a{i}", 1.0 + i % 7, 10 + i)
    assert len(core.queues._fifo_floors) <= 4096


def test_a_full_floor_table_keeps_its_floors_until_a_new_kind_arrives() -> None:
    """With 4096 kinds of work floored, one more action of a known kind keeps every floor: an
    earlier action still queued still holds back a later one of its kind whose estimate
    drifted down."""
    core = _core()
    _queue(core, "a", 16.0, 1, units=0.5, session="s9")
    for i in range(1, 4096):  # 4095 more kinds: the table is full
        _queue(core, f"f{i}", 1.0, 10 + i, units=float(i))
    _queue(core, "again", 1.0, 9000, units=1.0)  # a known kind
    _queue(core, "b", 1.0, 9001, units=0.5, session="s9")  # a's kind, a smaller estimate
    assert _head(core, ("sess", "s9")) == "a"


# ---- time ---------------------------------------------------------------------------------------
def test_an_action_ages_at_exactly_its_time_and_its_story_says_so() -> None:
    """One core, busy; a (expected 1 s) waits from t=0, b (0.01 s, ranked first) from t=5, with
    an aging time of 10 s: an event at 9.999 ages nothing, the core freed at exactly 10 goes to
    a, aged then; b is not aged before its own time."""
    d = Driver([cpu_node("n0", cpu=1, mem=256)], policy="tangram", aging_s=10.0, aging_min_s=10.0)
    d.arrive(act("x", hints=WorkHints(expected_s=1000)))
    d.arrive(act("a", hints=WorkHints(expected_s=1)))
    d.at(5).arrive(act("b", hints=WorkHints(expected_s=0.01)))
    d.at(9.999).tick()
    assert not any("aged" in line for line in d.core.story("a") + d.core.story("b"))
    out = d.at(10.0).finish("x")
    assert list(starts(out)) == ["a"]
    assert "t=10 aged (cause aging)" in d.core.story("a")
    assert not any("aged" in line for line in d.core.story("b"))


def test_an_elastic_action_is_overdue_at_its_run_at_its_maximum() -> None:
    """Overdue at submit + expected run at its maximum: a width below one core runs at that
    fraction of its speed (Amdahl's factor is the width itself there)."""
    core = _core()
    el = Elasticity(0.25, 0.5, speedup=Speedup(0.9))
    a = _queue(core, "a", 3.0, 1000, kind=ActionKind.TEST, elasticity=el,
               demand=Resources(cpu=0.25, memory_mb=256))
    when = core.queues.overdue_from(a)
    assert when == core.st.expected_work(a) / 0.5
    core.st.touched.clear()
    core.st.now = math.nextafter(when, 0.0)
    core.queues.wake_overdue()
    assert a.queue_key not in core.st.touched
    core.st.now = when
    core.queues.wake_overdue()
    assert a.queue_key in core.st.touched
