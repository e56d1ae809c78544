"""Queue keys and queue entries, as the speed-ups shaped them, order and group as before.

- a shared-pool queue's key (`ShapeKey`, a str) is one object per demand shape, whatever the
  order the demand's items were given in, and tells apart shapes that differ anywhere;
- a queue entry's int ``rank`` orders as the float priority class it replaced (``-inf`` for no
  work, else ``2 * exponent + half-octave bit``), aged entries (``_AGED``) before all others;
- `Queues.enqueue`'s rank equals `Queues.rank`.
"""

from __future__ import annotations

import math
import random

from arl_tangram.core import Core, CoreConfig
from arl_tangram.core.actions import ActionSpec, WorkHints
from arl_tangram.core.cluster import ClusterSpec, NodeSpec
from arl_tangram.core.events import ActionArrived
from arl_tangram.core.queues import AGED as _AGED
from arl_tangram.core.records import ActionRecord, ShapeKey
from arl_tangram.core.resources import Resources


def _old_class(x: float) -> float:
    """The priority class the float entries held (the code before the int ranks)."""
    if x <= 0.0:
        return -math.inf
    m, e = math.frexp(x)
    return float(2 * e + (m >= math.sqrt(0.5)))


def test_shape_keys_are_shared_per_shape_and_distinct_across_shapes() -> None:
    a = ActionRecord(ActionSpec("a", demand=Resources({"cpu": 2, "memory_mb": 512})), 0.0, 1)
    b = ActionRecord(ActionSpec("b", demand=Resources({"memory_mb": 512, "cpu": 2})), 0.0, 2)
    c = ActionRecord(ActionSpec("c", demand=Resources({"cpu": 2, "memory_mb": 512.5})), 0.0, 3)
    d = ActionRecord(ActionSpec("d", demand=Resources({"cpu": 2, "memory_mb": 512, "gpu": 1})), 0.0, 4)
    assert type(a.skey) is ShapeKey and a.skey == b.skey and hash(a.skey) == hash(b.skey)
    assert a.skey.shape == (("cpu", 2.0), ("memory_mb", 512.0)) == b.shape
    assert a.skey.cpu == 2.0 and a.cpu == 2.0
    assert len({a.skey, b.skey, c.skey, d.skey}) == 3
    assert a.skey[0] != "model" and a.skey[0] != "sess"  # kind tests on tuple keys stay false


def test_int_ranks_order_as_the_float_classes() -> None:
    core = Core(ClusterSpec((NodeSpec("n0", Resources(cpu=8, memory_mb=4096)),)), CoreConfig())
    rng = random.Random(3)
    xs = [0.0, 5e-324, 1e-300, 1e-3, 0.7, 0.70710678, 0.7071068, 1.0, 1.5, 3e5, 1e308]
    xs += [10 ** rng.uniform(-12, 12) for _ in range(300)]
    recs = []
    for i, x in enumerate(xs):
        rec = ActionRecord(ActionSpec(f"a{i}", demand=Resources(cpu=8, memory_mb=4096)), 0.0, i)
        rec.est = x  # share of the whole node is 1: x is the work measure itself
        recs.append(rec)
    ranks = [core.queues.rank(r) for r in recs]
    assert min(ranks) > _AGED
    for i in range(len(xs)):
        for j in range(len(xs)):
            old = (_old_class(xs[i]) > _old_class(xs[j])) - (_old_class(xs[i]) < _old_class(xs[j]))
            new = (ranks[i] > ranks[j]) - (ranks[i] < ranks[j])
            assert old == new, (xs[i], xs[j])


def test_enqueue_ranks_equal_rank() -> None:
    cluster = ClusterSpec((NodeSpec("n0", Resources(cpu=4, memory_mb=256)),))
    core = Core(cluster, CoreConfig(aging_s=1e9, aging_min_s=1e6))  # (aged entries: rank 0)
    rng = random.Random(5)
    t = 0.0
    for i in range(200):
        t += 0.01
        demand = Resources(cpu=rng.choice([1, 2]), memory_mb=rng.choice([64, 128]))
        spec = ActionSpec(f"a{i}", demand=demand, hints=WorkHints(expected_s=rng.uniform(0.0, 3.0)))
        core.handle(ActionArrived(t, spec))
    checked = 0
    for q in core.queues.heaps.values():
        for rank, seq, gen, aid in q:
            rec = core.actions.get(aid)
            if rec is not None and rec.gen == gen and rank != _AGED:
                assert rank == core.queues.rank(rec) and seq == rec.seq
                checked += 1
    assert checked > 100
    core.validate()
