"""UsageMeter: the fast paths of `change_at` compute what the plain ones do, float for float."""

import random

import pytest

from arl_tangram.core.resources import Resources
from arl_tangram.sim import metrics
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


class _OnlineMeter:
    """The plain form the logged meter must equal: every change applied at once (the meter
    before its log: integrate the segment that ends, then add the change)."""

    def __init__(self, capacity, now):
        self.capacity = {d: float(capacity[d]) for d in ("cpu", "memory_mb", "gpu", "gpu_memory_mb")
                         if capacity.get(d, 0.0) > 0}
        self.now = now
        self.dims = {d: [0.0, 0.0, 0.0, 0.0, 0.0] for d in self.capacity}
        self.last = self.start = now()
        self.frozen = False
        self.series = []

    def accrue(self):
        if self.frozen:
            return
        dt = self.now() - self.last
        if dt > 0:
            for v in self.dims.values():
                v[3] += v[0] * dt
                v[4] += (v[1] if v[1] > v[2] else v[2]) * dt
            self.last = self.now()

    def change(self, busy, held, sign):
        self.accrue()
        for i, res in ((0, busy), (1, held)):
            for d, x in (res or {}).items():
                if d in self.dims:
                    self.dims[d][i] += sign * x

    def restart(self):
        self.accrue()
        self.start = self.last
        for v in self.dims.values():
            v[3] = v[4] = 0.0

    def freeze(self):
        self.accrue()
        self.frozen = True

    def set_reserved(self, reserved):
        self.accrue()
        for d, v in self.dims.items():
            v[2] = float(reserved.get(d, 0.0))

    def sample(self):
        self.series.append((self.now(), {d: self.dims[d][0] / c for d, c in self.capacity.items()}))


@pytest.mark.parametrize("limit", [7, 1 << 16])
def test_logged_meter_equals_applying_each_change_at_once(monkeypatch, limit):
    """Whether the log is replayed often (a small limit) or once, and whether changes come
    through `change_at` or the executor's recorder, every figure is the online form's."""
    monkeypatch.setattr(metrics, "_LOG_LIMIT", limit)
    rng = random.Random(limit)
    clock = [0.0]
    now = lambda: clock[0]  # noqa: E731
    meter, ref = UsageMeter(CAP, now), _OnlineMeter(CAP, now)
    log_time, log_entry = meter.recorder()
    shapes = [Resources(cpu=1, memory_mb=512), Resources(cpu=2.5, memory_mb=1024, gpu=1),
              Resources(memory_mb=300), Resources(cpu=0.1, gpu=0.3), {"cpu": 0.7, "disk": 9.0}]
    for i in range(4000):
        if rng.random() < 0.6:
            clock[0] += rng.choice((0.0, rng.random(), rng.expovariate(0.1), 1e-7))
        if i == 700:
            meter.restart()
            ref.restart()
        if i == 3500:
            meter.freeze()
            ref.freeze()
        if i % 400 == 150:
            reserved = {"cpu": rng.random() * 64, "gpu": rng.random()}
            meter.set_reserved(reserved)
            ref.set_reserved(reserved)
        if i % 37 == 0:
            meter.sample()
            ref.sample()
        busy = rng.choice([*shapes, None])
        held = busy if rng.random() < 0.4 else rng.choice([*shapes, None])
        sign = rng.choice((1, -1))
        if busy is not None and busy is held and rng.random() < 0.5:  # the executor's path
            code = meter.code(busy)  # (first: it may replay a full log)
            log_time(clock[0])
            log_entry(code | (metrics.BOTH_ADD if sign > 0 else metrics.BOTH_SUB))
        else:
            meter.change_at(clock[0], busy, held, sign)
        ref.change(busy, held, sign)
    assert ref.dims["cpu"][3] != 0.0 and ref.dims["gpu"][4] != 0.0
    for i, attr in enumerate(("busy", "held", "reserved", "busy_int", "held_int")):
        assert getattr(meter, attr) == {d: v[i] for d, v in ref.dims.items()}, attr
    assert meter.series == ref.series and len(ref.series) > 100
    assert (meter.start, meter._last) == (ref.start, ref.last)


def test_change_takes_sign_one_or_minus_one():
    meter = UsageMeter(CAP, lambda: 0.0)
    with pytest.raises(ValueError, match="sign"):
        meter.change_at(0.0, Resources(cpu=1), None, 2)
