"""Bound (d) of `sim.bounds`: a judge engine's actions can neither all run alone nor all share.

A judge engine (``ModelSpec.max_seqs > 0``, `sim.engine_model`) runs the ``k`` sequences of an
instance together, each at ``r(k) = (a + b) / (a + b k)`` of its speed alone (``a``, ``b``: the
model's alpha and beta). Bound (a) charges every action its time alone (``k = 1``); bound (b)
lets the pool run at its most work per second (``k = max_seqs`` everywhere) and any one action
at that whole speed. Neither sees that work per second needs sequences in flight, and sequences
in flight are actions present: each one present adds to the sum of completion times. (d) keeps
both sides, as a relaxation any schedule of the run satisfies:

- With ``M`` instances (`bounds.model_slots`) and ``x`` actions in flight, the work done per
  second is at most ``G(x) = min(x, M f(x / M))`` with ``f(k) = k r(k)``: each action at most
  its speed alone, and ``f`` concave, so the equal split of ``x`` over ``M`` instances is the
  best one (``x`` at most ``M max_seqs``). So at a rate ``R`` at least ``G^-1(R)`` actions are
  present (``G^-1`` is convex).
- With ``U`` seconds of work left (released, not done), at least ``nu(U)`` actions are present:
  the fewest released actions whose works add up to ``U`` (the largest first).
- An action released at ``r`` with work ``w`` is present at least until ``r + w`` (bound (a)):
  at least ``A(t)`` actions are, those with ``r <= t < r + w``.
- The sum of completion times is the integral of the actions present, ``N(t) >= max(G^-1(R(t)),
  nu(U(t)), A(t))``, and ``U`` follows the releases less the work done (with ``A`` alone the
  integral is bound (a): (d) is never below it). The least such integral over
  every rate path ``R(t)`` is a dynamic program over time slots of ``dt`` and a grid of ``U``;
  each slot is charged what no path through it can undercut: the slot's average rate (Jensen:
  ``G^-1`` convex), ``U`` rounded down to the grid, the work done rounded down by one grid step,
  ``nu`` of the least ``U`` the slot can hold (its end's, less its releases), and ``A`` exactly
  (the slot's integral of ``max(nu, A(t))``, against ``G^-1`` of its average rate). An action
  released inside a slot counts as released at its start (earlier releases only help).

The program runs over the run's busy periods (from a release while nothing was present to the
moment nothing is: ``U = 0`` at both ends, facts of the run as its release times are). Prefill
(``prefill_s``) is left out: it only adds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from ..core.cluster import ModelSpec

# (release, finish, work alone) of one action, seconds on the run's clock
Job = tuple[float, float, float]


def busy_periods(jobs: Sequence[Job]) -> list[list[Job]]:
    """The jobs grouped by the run's busy periods: maximal unions of overlapping
    ``[release, finish]`` intervals."""
    out: list[list[Job]] = []
    end = -math.inf
    for job in sorted(jobs):
        if not out or job[0] > end:
            out.append([])
            end = job[1]
        out[-1].append(job)
        end = max(end, job[1])
    return out


def rate_cap(model: ModelSpec, instances: int) -> float:
    """``G(M max_seqs)``: the most work per second ``instances`` instances of ``model`` do."""
    k, a, b = model.max_seqs, model.alpha, model.beta
    return instances * (k * (a + b) / (a + b * k) if a + b * k > 0 else float(k))


def present_for(rates: np.ndarray, model: ModelSpec, instances: int) -> np.ndarray:
    """``G^-1``: the fewest actions present that do ``rates`` work-seconds per second (inf past
    `rate_cap`)."""
    a, b, m = model.alpha, model.beta, float(instances)
    z = rates / m
    with np.errstate(divide="ignore", invalid="ignore"):
        shared = m * a * z / ((a + b) - b * z)
    out = np.where(rates <= m, rates, shared)
    return np.where(rates <= rate_cap(model, instances) * (1 + 1e-9), out, np.inf)


def engine_flow_bound(jobs: Sequence[Job], model: ModelSpec, instances: int, *, dt: float = 4.0,
                      states: int = 20000, steps: int = 512) -> float:
    """A lower bound on the sum of the jobs' completion times (finish - release) on
    ``instances`` instances of ``model`` (module doc); 0 without jobs or instances. The grid:
    slots of ``dt`` seconds, ``U`` in steps of the larger of a ``steps``-th of what a slot can
    do and a ``states``-th of the period's work (finer grids give a higher bound, slower:
    genrm-engine at load 4, per action, 8.69 s with 256 steps, 8.755 s at these defaults, 8.785 s
    with 1,024 steps, 8.807 s with 1,024 steps and ``dt`` 2 s; 0.1, 0.3, 1.7 and 14 s here)."""
    if instances < 1 or model.max_seqs < 1:
        return 0.0
    return sum(_period(p, model, instances, dt, states, steps) for p in busy_periods(jobs))


def _period(jobs: list[Job], model: ModelSpec, instances: int, dt: float, states: int,
            steps: int) -> float:
    t0 = min(j[0] for j in jobs)
    t1 = max(j[1] for j in jobs)
    total = sum(j[2] for j in jobs)
    if total <= 0.0 or t1 <= t0:
        return 0.0
    slots = max(1, math.ceil((t1 - t0) / dt))
    d = (t1 - t0) / slots
    alone = _alone_table(jobs, t0, d, slots)  # [slot, v]: its integral of max(v, A(t))
    cap = rate_cap(model, instances) * d  # the most work one slot does
    delta = max(total / states, cap / steps)  # (a slot moves U by at most `steps` grid steps)
    n = math.ceil(total / delta) + 2  # U = i delta, i = 0 .. (the grid's slack of one step)
    rel = np.zeros(slots)
    arrive: list[list[float]] = [[] for _ in range(slots)]
    for r, _, w in jobs:
        s = min(slots - 1, int((r - t0) / d))
        rel[s] += w
        arrive[s].append(w)
    cums: list[np.ndarray] = []  # per slot: sums of the k largest works released by its end
    sizes: list[float] = []
    for s in range(slots):
        if arrive[s] or not cums:
            sizes.extend(arrive[s])
            cums.append(np.concatenate(([0.0], np.cumsum(sorted(sizes, reverse=True)))))
        else:
            cums.append(cums[-1])
    width = int(cap / delta) + 3
    grid = np.arange(n)
    ks = np.arange(-(n - 1), n)  # i - j, from a slot's start U = i delta to its end's j delta
    value = np.full(n, np.inf)
    value[0] = 0.0  # the period ends with nothing left
    for s in range(slots - 1, -1, -1):
        avail = grid * delta + rel[s]  # U at the slot's start, its releases in
        hi = np.minimum(n - 1, np.floor(avail / delta).astype(int) + 1)
        lo = np.maximum(0, np.ceil((avail - delta - cap) / delta).astype(int))
        nxt = lo[:, None] + np.arange(width)[None, :]
        ok = nxt <= hi[:, None]
        nxt = np.minimum(nxt, n - 1)
        # the work done, avail_i - (j + 1) delta, depends on i - j only: G^-1 of it once per
        # difference; `nu` of the end's U on j only: both looked up, not recomputed per pair
        done = np.maximum(0.0, (ks - 1) * delta + rel[s])
        need = d * present_for(done / d, model, instances)
        least_u = np.maximum(0.0, grid * delta - rel[s])
        held = np.minimum(np.searchsorted(cums[s], least_u, side="left"), len(jobs))
        cost = np.maximum(need[grid[:, None] - nxt + (n - 1)], alone[s][held][nxt]) + value[nxt]
        cost[~ok] = np.inf
        value = cost.min(axis=1)
    return float(value[0])


def _alone_table(jobs: list[Job], t0: float, d: float, slots: int) -> np.ndarray:
    """``[s, v]``: the integral over slot ``s`` of ``max(v, A(t))``, ``A(t)`` the actions that
    cannot have finished by ``t`` (released at ``r <= t < r + w``), for ``v = 0 .. len(jobs)``."""
    cuts = [t0 + s * d for s in range(slots + 1)]
    events = sorted([(r, 1) for r, _, _ in jobs] + [(r + w, -1) for r, _, w in jobs])
    times = sorted({*cuts, *(t for t, _ in events if t0 <= t <= cuts[-1])})
    table = np.zeros((slots, len(jobs) + 1))
    v = np.arange(len(jobs) + 1, dtype=float)
    k, level = 0, 0
    for a, b in itertools.pairwise(times):
        while k < len(events) and events[k][0] <= a:
            level += events[k][1]
            k += 1
        s = min(slots - 1, int((a - t0) / d + 1e-9))
        table[s] += (b - a) * np.maximum(v, level)
    return table
