"""The lane rule's fluid model (`elastic._fluid`) on a crowded node (issue 40): its work grows
with the jobs as n log n, not n^2, and it prices every lane count as the step-by-step model did.

The profile of `bench_scale.py --nodes 16 --trajectories 6000` (pure core, py-spy over the core
alone): `_fluid` was 43% of `Core.handle` (0.3% at 2,000), called from `Elastic.plan` for a
session's elastic test on a node whose elastic actions cannot all run at their maximum. It
walked every running job at every step (one job ends per step): O(jobs^2) per lane count. Now
jobs of one class (the same maximum and parallel fraction) share one speed, so each step looks
at the classes and each job is inserted into and taken off its class's sorted ends once.

The work is counted in calls (Python and builtin, under a profile hook, in a pure-core
subprocess), not time: 8x the jobs made the step-by-step model ~60x the calls; here it stays
under 12x. `REFERENCE` is the step-by-step model as it was (commit 841fbba), against which the
incremental one is checked on seeded cases (the same sums to 1e-12: the same decisions but for
ties within rounding, which golden streams check on whole runs)."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys

from arl_tangram.core.actions import Elasticity, Speedup
from arl_tangram.core.cluster import NodeSpec
from arl_tangram.core.elastic import (
    _best_lanes,
    _efficiency,
    _fluid,
    _fluid_k,
    _fluid_one,
    _kinds_of,
    _lanes_all_at_max,
    _useful,
)
from arl_tangram.core.resources import Resources

PROBE = r"""
import json, sys
from arl_tangram.core.actions import Elasticity, Speedup
from arl_tangram.core import elastic

def calls(fn):
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

EL = Elasticity(1, 4, speedup=Speedup(0.6))  # swe-agent's test
def work(n_run):
    # a 192-core node crowded with n_run running tests of distinct work left, and one more:
    # waiting (as many lanes as run) and starting now (one more), as `_best_lanes` weighs them
    runs = [(0.5 + 37.0 * ((7 * i) % n_run) / n_run, EL) for i in range(n_run)]
    runs.sort(key=lambda j: j[0])
    jobs = runs + [(10.0, EL)]
    return sum(calls(lambda: elastic._fluid(192.0, lanes, jobs, n_run)) for lanes in (n_run, n_run + 1))

print(json.dumps([work(50), work(400)]))
"""


def test_the_fluid_model_works_n_log_n_in_the_jobs_on_the_node() -> None:
    env = dict(os.environ, ARL_TANGRAM_PURE="1")
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         check=True, timeout=300)
    small, large = json.loads(out.stdout.strip().splitlines()[-1])
    assert small > 0
    # 8x the jobs: n^2 work would be ~64x (the step-by-step model made 58x: 2,779 and 162,029 calls; this one 428 and 3,228); n log n ~8-9x
    assert large < 12 * small, (small, large)


def REFERENCE(cap: float, lanes: int, jobs: list[tuple[float, Elasticity]], n_run: int,
              measured: NodeSpec | None = None, base: float = 0.0) -> tuple[float, float]:
    """`_fluid` step by step, every running job at every step (as of commit 841fbba)."""
    import bisect
    left = [w for w, _ in jobs]
    els = [e for _, e in jobs]
    tops = [e.max if measured is None else _useful(e, measured, base, e.max) for e in els]
    limit = lanes if lanes > n_run else n_run
    n = len(jobs)
    order = sorted([(tops[i], i) for i in range(min(n, limit))])
    nxt = len(order)
    join = 0.0 if n_run < nxt else math.inf
    speed = [0.0] * n
    t = cost = 0.0
    while order:
        room, count = cap, len(order)
        for top, i in order:
            w = min(top, room / count)
            speed[i] = els[i].speedup.factor(w) if w > 0 else 0.0
            room -= w
            count -= 1
        if measured is not None:
            eff = _efficiency(measured, base + cap - room)
            for _, i in order:
                speed[i] *= eff
        dt = min((left[i] / speed[i] for _, i in order if speed[i] > 0.0), default=math.inf)
        if dt == math.inf:
            return math.inf, join
        t += dt
        still = []
        for job in order:
            i = job[1]
            left[i] -= dt * speed[i]
            if left[i] <= 1e-9 * (1.0 + t):
                cost += t
            else:
                still.append(job)
        order = still
        while len(order) < limit and nxt < n:
            if nxt == n_run:
                join = t
            bisect.insort(order, (tops[nxt], nxt))
            nxt += 1
    return cost, join


ELS = [Elasticity(1, 4, speedup=Speedup(0.6)), Elasticity(1, 8, speedup=Speedup(0.7)),
       Elasticity(2, 8, speedup=Speedup(0.9)), Elasticity(0.5, 2, speedup=Speedup(0.95))]


def _close(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return all(u == v or abs(u - v) <= 1e-12 * max(abs(u), abs(v)) for u, v in zip(a, b, strict=True))


def test_the_incremental_model_prices_every_lane_count_as_the_step_by_step_one() -> None:
    rng = random.Random(40)
    node = NodeSpec("n0", Resources(cpu=64, memory_mb=8192), pool="cpu",
                    parallel_speedup=((2.0, 1.6), (8.0, 5.0), (64.0, 30.0)))
    checked = 0
    for trial in range(600):
        n_run = rng.randint(0, 40)
        kinds = ELS[:rng.randint(1, len(ELS))]
        runs = sorted(((rng.choice([rng.uniform(0.001, 50.0), 3.0]), rng.choice(kinds))
                       for _ in range(n_run)), key=lambda j: j[0])
        jobs = runs + [(rng.uniform(0.01, 30.0), rng.choice(ELS))] * rng.randint(1, 5)
        cap = rng.choice([8.0, 16.0, 64.0, rng.uniform(1.0, 64.0)])
        for lanes in (n_run, n_run + 1, n_run + 3, len(jobs)):
            want = REFERENCE(cap, lanes, jobs, n_run)
            got = _fluid(cap, lanes, jobs, n_run)
            assert _close(got, want), (trial, lanes, got, want)
            if trial % 3 == 0:  # a measured node: useful widths, every speed scaled
                want = REFERENCE(cap, lanes, jobs, n_run, node, 64.0 - cap)
                got = _fluid(cap, lanes, jobs, n_run, node, 64.0 - cap)
                assert _close(got, want), (trial, lanes, got, want)
            checked += 1
    assert checked == 2400


def test_no_capacity_prices_waiting_and_starting_at_infinity() -> None:
    """On no CPU every job's speed is 0: no job ever ends (cost inf), and a queued job never
    starts (inf) or starts now where a lane is free for it (0.0)."""
    jobs = [(2.0, ELS[0]), (1.0, ELS[1])]
    assert _fluid(0.0, 1, jobs, 1) == (math.inf, math.inf)  # the second waits for a lane
    assert _fluid(0.0, 2, jobs, 1) == (math.inf, 0.0)  # both run, at speed 0


def test_one_class_on_a_heap_prices_as_the_classes_do_to_the_last_bit() -> None:
    """`_fluid_one` (one class, unmeasured: a crowded node's one kind of test) against the
    classes' steps (`_fluid_k`) on the same jobs: the same sums, bit for bit (the same
    decisions, golden streams unchanged); and a case by hand: on 2 cores, a run of work 1.0
    and a job of 1.0, both fully parallel up to 2 cores: waiting, the run ends at 0.5 (2
    cores) and the job at 1.0, a sum of 1.5, the job starting at 0.5; both at once, 1 core
    each, end at 1.0: 2.0, the job starting now."""
    assert _fluid_one(2.0, 1, [1.0, 1.0], 1, 2.0, 1.0) == (1.5, 0.5)
    assert _fluid_one(2.0, 2, [1.0, 1.0], 1, 2.0, 1.0) == (2.0, 0.0)
    assert _fluid_one(0.0, 2, [1.0, 1.0], 1, 2.0, 1.0) == (math.inf, 0.0)
    rng = random.Random(41)
    for _ in range(400):
        n_run = rng.randint(0, 60)
        top, p = rng.choice([(4.0, 0.6), (8.0, 0.7), (2.0, 1.0), (1.5, 0.9), (1.0, 0.0)])
        works = sorted(rng.choice([rng.uniform(1e-4, 50.0), 3.0, 1e-9]) for _ in range(n_run))
        works += [rng.uniform(0.01, 30.0)] * rng.randint(1, 5)
        cap = rng.choice([1.0, 8.0, 192.0, rng.uniform(0.5, 64.0)])
        for limit in {max(n_run, 1), n_run + 1, n_run + 3, len(works)}:
            got = _fluid_one(cap, limit, works, n_run, top, p)
            want = _fluid_k(cap, limit, works, [0] * len(works), [top], [p], n_run, None, 0.0)
            assert got == want, (cap, limit, n_run, got, want)


def test_the_plans_classes_choose_as_the_jobs_own_do() -> None:
    """`Elastic.plan` classes a node's runs once per state (`_kinds_of`) and hands the classes
    to `_lanes_all_at_max` and `_best_lanes`: every choice is the one they make classing the
    jobs themselves, with runs of one class or several (equal elasticities as distinct
    objects too), the job's class among them or new, queued jobs behind it, and a full width
    free elsewhere soon or never."""
    rng = random.Random(42)
    differ = 0
    for trial in range(1500):
        n_run = rng.randint(0, 30)
        pool = [rng.choice(ELS)] if trial % 2 else ELS[:rng.randint(1, len(ELS))]
        pool = pool + [Elasticity(e.min, e.max, speedup=Speedup(e.speedup.parallel_fraction))
                       for e in pool]  # (equal, not the same object)
        runs = sorted(((rng.uniform(0.001, 40.0), rng.choice(pool)) for _ in range(n_run)),
                      key=lambda j: j[0])
        el = rng.choice(pool + ELS)
        x = rng.uniform(0.01, 20.0)
        cap = rng.choice([8.0, 16.0, 64.0, rng.uniform(2.0, 64.0)])
        top = min(el.max, cap)
        behind = rng.choice([0, 0, 1, 3])
        elsewhere = rng.choice([math.inf, 0.0, rng.uniform(0.0, 5.0)])
        kinds = _kinds_of(runs)
        want = _best_lanes(cap, top, el.min, runs, x, el, behind, elsewhere, None, 0.0)
        got = _best_lanes(cap, top, el.min, runs, x, el, behind, elsewhere, None, 0.0, kinds)
        assert got == want, (trial, got, want)
        want = _lanes_all_at_max(cap, top, el.min, runs, x, el)
        assert _lanes_all_at_max(cap, top, el.min, runs, x, el, kinds) == want, trial
        differ += want != _best_lanes(cap, top, el.min, runs, x, el, 0, math.inf, None, 0.0)
    assert differ > 0  # (the shortcut's -1, "not sure", came up: both paths were weighed)



def _factor_calls(cap: float, n: int) -> tuple[int, int]:
    """`_lanes_all_at_max` on ``n`` runs of two classes (maximums 4 and 8, summing to 6n) and
    a job of the first: its answer, and how many times it asked a speedup for a speed
    (`Speedup.factor` is plain Python in either form of the core: a profile hook sees it)."""
    test, final = Elasticity(1, 4, speedup=Speedup(0.6)), Elasticity(1, 8, speedup=Speedup(0.7))
    runs = sorted(((1.0 + i, test if i % 2 else final) for i in range(n)), key=lambda j: j[0])
    kinds = _kinds_of(runs)
    count = [0]

    def hook(frame, event, arg) -> None:
        if event == "call" and frame.f_code.co_name == "factor":
            count[0] += 1

    sys.setprofile(hook)
    try:
        got = _lanes_all_at_max(cap, 4.0, 1.0, runs, 2.0, test, kinds)
    finally:
        sys.setprofile(None)
    return got, count[0]


def test_a_node_whose_runs_cannot_all_run_at_their_maximum_is_not_walked() -> None:
    """`_lanes_all_at_max` on a crowded node: where the runs' maximums (kept per class with
    `plan`'s view of the node) and the job's exceed its elastic capacity, it answers "not
    sure" (-1) reading only the job's speed, not each run's (one `Speedup.factor` call, not
    41); where they fit, it walks the runs (the job's speed and each run's: 41 calls) and
    answers the first lane count above them (cap 288 for 4 + 240 cores: 41 lanes)."""
    assert _factor_calls(1.2 * 6 * 40, 40) == (41, 41)
    assert _factor_calls(6 * 40 / 1.2, 40) == (-1, 1)
