"""UsageMeter: the fast paths of `change_at` compute what the plain ones do, float for float."""

import random

from arl_tangram.core.resources import Resources
from arl_tangram.sim.metrics import UsageMeter

CAP = {"cpu": 64.0, "memory_mb": 262144.0, "gpu": 8.0}


def test_change_at_accrues_exactly_as_accrue_to_then_change():
    rng = random.Random(3)
    clock = [0.0]
    inline = UsageMeter(CAP, lambda: clock[0])
    stepwise = UsageMeter(CAP, lambda: clock[0])
    shapes = [Resources(cpu=1, memory_mb=512), Resources(cpu=2.5, memory_mb=1024, gpu=1),
              Resources(memory_mb=300), {"cpu": 0.75, "disk": 9.0}]
    for i in range(3000):
        if rng.random() < 0.7:
            clock[0] += rng.choice((0.0, rng.random(), rng.expovariate(0.1)))
        if i == 1000:
            for m in (inline, stepwise):
                m.restart()
        if i % 500 == 250:
            reserved = {"cpu": rng.random() * 64}
            for m in (inline, stepwise):
                m.set_reserved(reserved)
        busy = rng.choice([*shapes, None])
        held = busy if rng.random() < 0.3 else rng.choice([*shapes, None])
        sign = rng.choice((1, -1))
        inline.change_at(clock[0], busy, held, sign)
        # the reference: accrue first, then apply busy and held one at a time (nothing to
        # accrue any more): holds the inlined accrual and the one-pass busy-is-held case equal
        if not stepwise._frozen:
            stepwise._accrue_to(clock[0])
        stepwise.change_at(clock[0], busy, None, sign)
        stepwise.change_at(clock[0], None, held, sign)
        if i == 2500:
            for m in (inline, stepwise):
                m.freeze()
    for m in (inline, stepwise):
        assert m.busy_int["cpu"] != 0.0 and m.held_int["memory_mb"] != 0.0
    for attr in ("busy", "held", "busy_int", "held_int", "reserved"):
        assert getattr(inline, attr) == getattr(stepwise, attr), attr
    assert inline.totals() == stepwise.totals()


def test_change_is_change_at_now():
    clock = [0.0]
    a, b = UsageMeter(CAP, lambda: clock[0]), UsageMeter(CAP, lambda: clock[0])
    for t in (1.0, 2.5, 2.5, 7.0):
        clock[0] = t
        a.change(Resources(cpu=1), Resources(cpu=2, memory_mb=10), 1)
        b.change_at(t, Resources(cpu=1), Resources(cpu=2, memory_mb=10), 1)
    assert (a.busy_int, a.held_int, a.busy, a.held) == (b.busy_int, b.held_int, b.busy, b.held)
