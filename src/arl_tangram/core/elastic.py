# mypy: disable-error-code="misc"
"""Tangram's elasticity: spare capacity to elastic actions, warm-pool sizing.

Invariant: expansion never takes a node's free capacity below its reserve in the elastic
dimension (``reserve_fraction`` of it, and in CPU at least the largest minimum demand arrivals
have had: `_reserve_of`), never grows an action past its ``elasticity.max``, and runs only when no
shared-pool work is queued (pending work comes first). An allotment grown before its
StartAction left the core is sent as a bigger StartAction, otherwise as a ResizeAction.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from mypy_extensions import trait

from .actions import Elasticity
from .commands import ResizeAction, ResizeWarmPool, StartAction
from .nodeindex import RES
from .records import ActionRecord, NodeState
from .records import warm_key as warm_key  # re-exported (it lived here)
from .resources import CPU, Resources

if TYPE_CHECKING:
    from .core import Core


@trait  # (a part of `Core`: mypyc compiles it into that class; see `_native.py`)
class ElasticMixin:
    """Part of `Core`: elastic expansion and warm pools (tangram)."""

    rate_counts: dict[str, int]  # arrivals per warm key since the last Tick
    rate_peaks: dict[str, float]  # per warm key, the highest tick rate, decaying
    last_rate_time: float | None  # time of the last Tick that sized warm pools
    _grow: set[str]  # nodes where an elastic action started in this event
    # Nodes where an elastic action started since a scan of the node last found none running
    # (placement's `_start` adds, `_expand_node` drops): no other node runs one, so expansion
    # skips them (with no elastic action anywhere, `_expand` does nothing at all).
    _elastic_nodes: set[str]
    _warm_names: list[str] | None  # CPU nodes warm pools are spread over (None: recompute)
    _warm_want: dict[str, int]  # warm key -> executors last spread over `_warm_names`

    def _expand(self: Core) -> None:
        """Give spare capacity (beyond the reserve) to elastic actions on changed nodes,
        one step at a time to the action whose expected completion time drops the most. It
        runs after the event's scheduling pass, so queued work has taken what it fits first:
        what is left on a node fits no queued head (work conservation) and would sit idle."""
        live = self._elastic_nodes
        if not live:
            return  # no elastic action runs anywhere (and `_grow`, a subset, is empty)
        nodes = (self._grow | self._dirty) & live  # a node off `live`: nothing to expand
        self._grow = set()
        for name in sorted(nodes) if len(nodes) > 1 else nodes:
            node = self.nodes.get(name)
            if node is None or not node.alive or name in self.reserved:
                continue
            if node.running:
                self._expand_node(node)

    def _expand_node(self: Core, node: NodeState) -> None:
        """Spare capacity to the node's elastic actions below their maximum, the least
        expected work left first (heSRPT gives the most to the shortest: Berg, Vesilo and
        Harchol-Balter, SIGMETRICS 2020), one `elastic_step` at a time while it speeds it up."""
        step = self.config.elastic_step
        heap: list[tuple[float, int, str]] = []
        elastic = False  # any elastic action on the node (grown to its max or not)
        for aid in node.running:
            rec = self.actions.get(aid)
            if rec is None or rec.allotment is None or not rec.elastic:
                continue
            el = rec.spec.elasticity
            assert el is not None
            elastic = True
            if rec.allotment.get(el.dim) >= el.max - 1e-9:
                continue
            heap.append((self._remaining(rec), rec.seq, aid))
        if not heap:
            if not elastic:
                self._elastic_nodes.discard(node.name)
            return
        heapq.heapify(heap)
        changed: dict[str, ActionRecord] = {}
        while heap:
            _, _, aid = heapq.heappop(heap)
            rec = self.actions[aid]
            el = rec.spec.elasticity
            assert el is not None and rec.allotment is not None
            spare = node.free.get(el.dim, 0.0) - self._reserve_of(node, el.dim)
            k = rec.allotment.get(el.dim)
            delta = min(el.max - k, spare)
            if delta > step:
                delta = step
            if delta <= 1e-9 or _gain(rec, delta) <= 0.0:
                continue
            self._retime(rec)
            node.take({el.dim: delta})
            rec.allotment = rec.allotment.with_amount(el.dim, k + delta)
            changed[aid] = rec
            if k + delta < el.max - 1e-9:
                heapq.heappush(heap, (self._remaining(rec), rec.seq, aid))
        if changed:
            self.index.update(node.name, node.free)
            self._emit_resizes(node, changed.values())

    def _reclaim(self: Core, node: NodeState, need: Resources, floor: float = 0.0) -> bool:
        """Make room for ``need`` on ``node`` by shrinking the elastic actions grown there
        (never below their minimum, nor below ``floor`` where their range allows), the most
        expected work left first (the shortest keep their cores: SRPT); False, shrinking
        nothing, when that cannot make it fit. Growth is lent, not given: a session's action
        that can run only on this node does not queue behind a test that took its spare cores."""
        short = 0.0
        for dim, v in need.items():
            lack = v - node.free.get(dim, 0.0)
            if lack > 1e-9:
                if dim != CPU:
                    return False  # only CPU stretches
                short = lack
        if short <= 1e-9:
            return True
        step = self.config.elastic_step
        heap: list[tuple[float, int, str]] = []
        spare = 0.0
        for aid in node.running:
            rec = self.actions.get(aid)
            el = rec.spec.elasticity if rec is not None else None
            if rec is None or el is None or el.dim != CPU or rec.allotment is None:
                continue
            extra = rec.allotment.get(CPU) - _floor_of(el, floor)
            if extra > 1e-9:
                spare += extra
                heap.append((-self._remaining(rec), rec.seq, aid))
        if spare < short - 1e-9:
            return False
        heapq.heapify(heap)
        changed: dict[str, ActionRecord] = {}
        while short > 1e-9 and heap:
            _, _, aid = heapq.heappop(heap)
            rec = self.actions[aid]
            el = rec.spec.elasticity
            assert el is not None and rec.allotment is not None
            k = float(rec.allotment.get(CPU))  # (floats: the same repr compiled and pure)
            lo = _floor_of(el, floor)
            delta = float(min(step, k - lo, short))
            self._retime(rec)
            node.give({CPU: delta})
            rec.allotment = rec.allotment.with_amount(CPU, k - delta)
            changed[aid] = rec
            short -= delta
            if k - delta > lo + 1e-9:
                heapq.heappush(heap, (-self._remaining(rec), rec.seq, aid))
        self.index.update(node.name, node.free)
        self._emit_resizes(node, changed.values())
        return True

    # ---- the width of an elastic action: heSRPT rounded to whole cores --------------------------
    def _remaining(self: Core, rec: ActionRecord) -> float:
        """Expected work left of a running action (seconds at speed 1), given the work its
        allotments have done since it started (`done`, brought up to now): the estimator's
        mean excess (`remaining_work`), else its estimate less that work."""
        done = rec.done
        if rec.allotment is not None and self.now > rec.since:
            done += (self.now - rec.since) * rec.spec.speed(rec.allotment)
        left = self._estimator.remaining_work(rec.ekey, rec.units, done)
        if left is None:
            left = rec.est - done
        return left if left > 1e-9 else 1e-9

    def _size(self: Core, rec: ActionRecord) -> float:
        """Expected work of a queued action (seconds at speed 1): the estimator's mean, else
        its estimate."""
        got = self._estimator.mean_work(rec.ekey, rec.units)
        return rec.est if got is None else got

    def _retime(self: Core, rec: ActionRecord) -> None:
        """Bring an action's `done` up to now, before its allotment changes."""
        if rec.allotment is not None and self.now > rec.since:
            rec.done += (self.now - rec.since) * rec.spec.speed(rec.allotment)
        rec.since = self.now

    def _overdue(self: Core, rec: ActionRecord) -> bool:
        """Whether a queued elastic action has waited longer than its expected run at its
        maximum: it then starts at whatever width it can get (no wait for a width is longer
        than the run it saves)."""
        el = rec.spec.elasticity
        assert el is not None
        return self.now - rec.submit_time >= self._size(rec) / max(el.speedup.factor(el.max), 1e-9)

    def _queued_elastic(self: Core) -> int:
        """Elastic actions waiting in the shared pool's queues."""
        n = 0
        qlive = self.qlive
        for key in self.shape_keys:
            if key.elastic:
                n += qlive.get(key, 0)
        return n

    def _plan(self: Core, rec: ActionRecord, node: NodeState, behind: int,
              elsewhere: float = math.inf) -> tuple[float, float]:
        """How elastic ``rec`` (a queue head) should start on ``node`` now: ``(width, floor)``,
        width 0.0 to wait; ``floor`` is how far the node's running elastic actions may be
        shrunk to make room for it.

        The rule is heSRPT's (Berg, Vesilo and Harchol-Balter, SIGMETRICS 2020: finish jobs
        shortest first, the most cores to the shortest; share only as far as the speedup curve
        pays for it) rounded to whole lanes: the node's elastic capacity (its free CPU plus
        what its elastic actions hold) is cut into L lanes of equal width; the running elastic
        actions keep one lane each (they are not stopped), ``rec`` and the ``behind`` actions
        queued after it (the node's share of the queue, assumed of ``rec``'s size) go, shortest
        first, to the lane free first; each job runs at its speed at the lane's width. Of the L
        from "no new lane" (wait: ``rec`` starts when a lane frees) to the most lanes of the
        action's minimum, the one with the least sum of completion times wins (ties: fewer,
        wider lanes). Waiting here is waiting for the first width free anywhere: ``rec`` may
        start at its full width on another node ``elsewhere`` seconds from now (`_free_at`), if
        that comes before a lane here. On 2 cores with n equal jobs waiting that is the rule
        "sharing wins only when s(2) <= 2(n+1)/(n+2)". Decisions cost O(lanes tried x jobs),
        no solver."""
        el = rec.spec.elasticity
        assert el is not None
        free = node.free.get(CPU, 0.0)
        held = 0.0
        runs: list[tuple[float, Elasticity]] = []  # (work left, elasticity) of its elastic runs
        for aid in node.running:
            other = self.actions.get(aid)
            if other is None or not other.elastic or other.allotment is None:
                continue
            oel = other.spec.elasticity
            assert oel is not None
            if oel.dim != CPU:
                continue
            held += other.allotment.get(CPU)
            runs.append((self._remaining(other), oel))
        cap = free + held
        lo = el.min
        top = el.max if el.max < cap else cap
        if top < lo - 1e-9:
            return 0.0, 0.0
        n_run = len(runs)
        most = int(cap / lo + 1e-9)
        step = self.config.elastic_step
        # lane counts worth trying: wait (as many lanes as runs), one more, and the widths
        # top, top/2, top/4, ... down to the minimum
        tries: list[int] = []
        if n_run > 0:
            tries.append(n_run)
        w = top
        while w >= lo - 1e-9:
            lanes = int(cap / w + 1e-9)
            if lanes > n_run and lanes not in tries:
                tries.append(lanes)
            w /= 2.0
        if n_run + 1 <= most and n_run + 1 not in tries:
            tries.append(n_run + 1)
        tries.sort()
        x = self._size(rec)
        best_cost = math.inf
        best_lanes = 0
        best_w = 0.0
        for lanes in tries:
            width = cap / lanes
            width = math.floor(width / step + 1e-9) * step if width >= step else width
            if width < lo - 1e-9 and lanes > n_run:
                continue  # too narrow for the action
            ends: list[float] = [0.0] * (lanes - n_run) if lanes > n_run else []
            cost = 0.0
            for left, oel in runs:
                ow = width if width < oel.max else oel.max
                t = left / max(oel.speedup.factor(ow if ow > oel.min else oel.min), 1e-9)
                cost += t
                ends.append(t)
            mine = width if width < el.max else el.max
            run = x / max(el.speedup.factor(mine), 1e-9)
            heapq.heapify(ends)
            jobs = 1 + behind
            if lanes <= n_run and elsewhere < ends[0]:  # waiting: a width frees elsewhere first
                cost += elsewhere + x / max(el.speedup.factor(el.max), 1e-9)
                jobs -= 1
            for _ in range(jobs):
                t = heapq.heappop(ends) + run
                cost += t
                heapq.heappush(ends, t)
            if cost < best_cost - 1e-12 * cost:
                best_cost, best_lanes, best_w = cost, lanes, mine
        if best_lanes <= n_run:
            return 0.0, 0.0
        return best_w, best_w

    def _free_at(self: Core, node: NodeState, width: float) -> float:
        """Expected seconds until ``width`` CPU is free on ``node`` (as its running actions
        end: elastic ones at their current speed, rigid ones at their estimate), inf if never
        (sessions and other holdings stay)."""
        have = node.free.get(CPU, 0.0)
        if have >= width - 1e-9:
            return 0.0
        ends: list[tuple[float, float]] = []
        now = self.now
        for aid in node.running:
            other = self.actions.get(aid)
            if other is None or other.allotment is None:
                continue
            c = other.allotment.get(CPU)
            if c <= 0.0:
                continue
            if other.elastic:
                t = self._remaining(other) / max(other.spec.speed(other.allotment), 1e-9)
            else:
                t = other.est - (now - (other.start_time if other.start_time is not None else now))
                t = t if t > 0.0 else 0.0
            ends.append((t, c))
        ends.sort()
        for t, c in ends:
            have += c
            if have >= width - 1e-9:
                return t
        return math.inf

    def _elastic_start(self: Core, rec: ActionRecord, node: NodeState, behind: int,
                       elsewhere: float = math.inf) -> tuple[float, float]:
        """``(width, floor)`` at which elastic ``rec`` starts on ``node`` now (width 0.0: it
        waits): the width `_plan` chose, as far as free CPU and what the node's elastic actions
        hold above ``floor`` allow; where the plan says wait but the node's elastic actions
        could not take its free CPU (at their maximum, or none), what they cannot take (an
        idle core helps no one, and the action grows as cores free: growth is real); once
        overdue (`_overdue`), any width from its minimum."""
        el = rec.spec.elasticity
        assert el is not None
        free = node.free.get(CPU, 0.0)
        if self._overdue(rec):
            if free >= el.min - 1e-9:
                return (free if free < el.max else el.max), 0.0
            if free + self._lendable(node, 0.0) >= el.min - 1e-9:
                return el.min, 0.0  # (`_reclaim` takes lent cores down to their minimum)
            return 0.0, 0.0
        width, floor = self._plan(rec, node, behind, elsewhere)
        if width > 0.0:
            room = free + self._lendable(node, floor)
            if self.config.reserve_fraction > 0.0:  # the reserve: beyond the minimum, untouched
                keep = free - self._reserve_of(node, CPU)
                room = keep if keep > el.min else el.min
            if room < width:
                width = room
            return (width if width >= el.min - 1e-9 else 0.0), floor
        absorb = 0.0  # what the node's elastic actions below their maximum could still take
        for aid in node.running:
            other = self.actions.get(aid)
            if other is None or not other.elastic or other.allotment is None:
                continue
            oel = other.spec.elasticity
            assert oel is not None
            if oel.dim == CPU:
                absorb += oel.max - other.allotment.get(CPU)
        left = free - absorb
        if left >= el.min - 1e-9:
            return (left if left < el.max else el.max), 0.0
        if free > 1e-9:
            self._grow.add(node.name)  # it waits for them to go wide: expansion looks here
        return 0.0, 0.0

    def _lendable(self: Core, node: NodeState, floor: float) -> float:
        """CPU the node's elastic actions hold above ``floor`` (above their minimum where
        that is higher, never where their range ends below ``floor``)."""
        total = 0.0
        for aid in node.running:
            rec = self.actions.get(aid)
            if rec is None or not rec.elastic or rec.allotment is None:
                continue
            el = rec.spec.elasticity
            assert el is not None
            if el.dim == CPU:
                extra = rec.allotment.get(CPU) - _floor_of(el, floor)
                if extra > 0.0:
                    total += extra
        return total

    def _place_elastic(self: Core, rec: ActionRecord) -> bool:
        """Start a shared-pool elastic head where it gets the widest start (`_elastic_start`)
        among the few nodes with the most free CPU that fit its other dimensions (a warm one
        first among equals); False when every one says wait."""
        index = self.index
        if index._held is not None:
            index.flush()
        nodes, reserved = self.nodes, self.reserved
        shape = rec.shape
        n = self._cpu_nodes()
        queued = self._queued_elastic() - 1  # (this head is still queued)
        behind = 0 if queued <= 0 else min(32, -(-queued // n))
        enough = self.config.fit_candidates
        cands: list[NodeState] = []
        for lvl in reversed(index.levels):
            for name in index._buckets[lvl]:
                if name in reserved:
                    continue
                node = nodes[name]
                free = node.free
                fits = True
                for k, v in shape:
                    if k != CPU and v > free.get(k, 0.0) + 1e-9:
                        fits = False
                        break
                if fits:
                    cands.append(node)
                    if len(cands) >= enough:
                        break
            if len(cands) >= enough:
                break
        el = rec.spec.elasticity
        assert el is not None
        # when each candidate could start it at its full width: waiting on one node is
        # waiting for the first of them
        first = second = math.inf
        first_node = ""
        if len(cands) > 1:
            for node in cands:
                c = node.cap.get(CPU, 0.0)
                t = self._free_at(node, el.max if el.max < c else c)
                if t < first:
                    second, first, first_node = first, t, node.name
                elif t < second:
                    second = t
        best: NodeState | None = None
        best_w = 0.0
        best_floor = 0.0
        best_warm = False
        wkey = rec.wkey
        for node in cands:
            elsewhere = second if node.name == first_node else first
            width, floor = self._elastic_start(rec, node, behind, elsewhere)
            warm = node.warm.get(wkey, 0) > 0 if node.warm else False
            if width > best_w + 1e-9 or (width > 0.0 and abs(width - best_w) <= 1e-9
                                         and warm and not best_warm):
                best, best_w, best_floor, best_warm = node, width, floor, warm
        if best is None:
            return False
        self._start_elastic(rec, best, best_w, best_floor)
        return True

    def _start_elastic(self: Core, rec: ActionRecord, node: NodeState, width: float, floor: float) -> None:
        """Start elastic ``rec`` on ``node`` at ``width``, shrinking the node's elastic actions
        (not below ``floor``) for the CPU it lacks."""
        alloc = rec.spec.allotment(width)
        if not node.fits(alloc):
            ok = self._reclaim(node, alloc, floor)
            assert ok, f"{rec.spec.id}: no room for {alloc} on {node.name}"
        self._start(rec, node, alloc, True if rec.spec.session is not None else
                    (self._take_warm(node, rec.wkey) if node.warm else False))

    def _cpu_nodes(self: Core) -> int:
        """Alive nodes with CPU (the queue's elastic actions spread over them)."""
        names = self._warm_names  # (the same list warm pools spread over; reset on changes)
        if names is None:
            names = [n.name for n in self.nodes.values() if n.alive and n.cap.get(CPU, 0.0) > 0]
            self._warm_names = names
        return len(names) if names else 1

    def _reserve_of(self: Core, node: NodeState, dim: str) -> float:
        """What expansion leaves free on ``node`` for expected arrivals: ``reserve_fraction``
        of it, and in CPU never less than the largest minimum demand arrivals have had, so
        that the next action starts at once rather than queueing behind grown ones
        (``reserve_fraction=0`` keeps none). A node
        without sessions (whose arrivals may go anywhere) keeps none while another node has
        that much free: the reserve is the cluster's, not every node's."""
        cap = node.cap.get(dim, 0.0)
        r = self.config.reserve_fraction * cap
        if dim != CPU or r <= 0.0:
            return r  # (reserve_fraction=0: no reserve at all)
        if self._expect_cpu > r:
            r = self._expect_cpu if self._expect_cpu < cap else cap
        if not node.sessions and self._room_elsewhere(node.name, r):
            return 0.0
        return r

    def _room_elsewhere(self: Core, name: str, cpu: float) -> bool:
        """Whether an alive node other than ``name``, not reserved, has ``cpu`` free."""
        index = self.index
        if index._held is not None:
            index.flush()
        least = int(cpu * RES + 1e-9) if cpu > 0 else 0  # nodeindex.level
        for lvl in reversed(index.levels):
            if lvl < least:
                return False
            for other in index._buckets[lvl]:
                if other != name and other not in self.reserved:
                    return True
        return False

    def _emit_resizes(self: Core, node: NodeState, recs: Iterable[ActionRecord]) -> None:
        for rec in recs:
            assert rec.allotment is not None
            i = self._starts.get(rec.spec.id)
            if i is not None:  # not sent yet: start it bigger
                old = self._out[i]
                assert isinstance(old, StartAction)
                self._out[i] = StartAction(old.action, old.node, rec.allotment, old.warm, old.cause)
            else:
                self._out.append(ResizeAction(rec.spec.id, node.name, rec.allotment, cause=self._cause))
            rec.note(self.now, f"allotment -> {rec.allotment}", self._cause)

    def _count_arrival(self: Core, rec: ActionRecord) -> None:
        if self.policy.warm_pools and rec.spec.session is None and not rec.is_model:
            k = rec.wkey
            self.rate_counts[k] = self.rate_counts.get(k, 0) + 1

    def _warm_targets(self: Core) -> None:
        """Size warm pools from arrival rates: enough warm executors to absorb the arrivals of
        two cold-start times at the recent peak rate (the highest tick's rate, decaying over
        `rate_window_s`, or the smoothed one when higher: pools follow a burst at once and
        shrink slowly), and at least
        ``min_warm_per_node`` per node for every key still in use, spread over the CPU nodes."""
        last, now = self.last_rate_time, self.now
        if last is None or now <= last:
            self.last_rate_time = now if last is None else last
            return
        dt = now - last
        self.last_rate_time = now
        a = min(1.0, dt / self.config.rate_window_s)
        b = min(1.0, dt / self.config.peak_memory_s)
        counts, self.rate_counts = self.rate_counts, {}
        peaks = self.rate_peaks
        for key in sorted(set(counts) | set(self.rates)):
            burst = counts.get(key, 0) / dt
            rate = self.rates.get(key, 0.0) * (1 - a) + a * burst
            self.rates[key] = rate
            peak = peaks.get(key, 0.0) * (1 - b)  # the recent peak, forgotten over `peak_memory_s`
            if burst > peak:
                peak = burst
            peaks[key] = peak
            self._spread_warm(key, peak if peak > rate else rate)

    def _boot_warm(self: Core) -> None:
        """At the first event: warm pools for the keys the operator named (`warm_keys`), as a
        static stack provisions its sandboxes before the first action."""
        if not self.policy.warm_pools:
            return
        for key in self.config.warm_keys:
            self.rates.setdefault(key, 0.0)
            self._spread_warm(key, 0.0)

    def _spread_warm(self: Core, key: str, rate: float) -> None:
        """Send the warm-pool targets of ``key`` for an arrival ``rate`` (per second); a
        named key keeps at least its `warm_boot` count over the cluster."""
        names = self._warm_names  # reset by `_node_changed`, with `_warm_want`
        if names is None:
            names = [n.name for n in self.nodes.values() if n.alive and n.cap.get(CPU, 0.0) > 0]
            self._warm_names = names
        if not names:
            return
        cfg = self.config
        fixed = cfg.max_warm_per_node
        n = len(names)
        want = math.ceil(rate * cfg.sandbox_cold_s * 2)
        if (rate * cfg.rate_window_s >= 1.0 or key in cfg.warm_keys) and want < cfg.min_warm_per_node * n:
            want = cfg.min_warm_per_node * n  # a key in use (or named) keeps a floor on every node
        boot = cfg.warm_boot
        if boot is not None and key in cfg.warm_keys:
            floor = boot.get(key, 0)
            if want < floor:
                want = floor
        done = self._warm_want
        old = done.get(key)
        if old == want:
            return  # same targets on the same nodes as last time: all sent already
        done[key] = want
        sent = self.warm_sent
        q, r = divmod(want, n)
        lo, hi = 0, n  # the nodes whose target may differ from the last spread's
        if old is not None and old // n == q:
            # The last spread over these same nodes (`done` is reset with `names`) sent
            # node i its target min(cap, q + (i < old % n)); with the same q only the
            # nodes between the two remainders can get a different target.
            r0 = old % n
            lo, hi = (r0, r) if r0 < r else (r, r0)
        for i in range(lo, hi):
            name = names[i]
            t = q + 1 if i < r else q
            cap = fixed if fixed is not None else _warm_cap(self.nodes[name])
            if t > cap:
                t = cap  # min(cap, want // n + (1 if i < want % n else 0))
            if sent.get((name, key), 0) != t:
                sent[(name, key)] = t
                self._out.append(ResizeWarmPool(name, key, t, cause=self._cause))


def _warm_cap(node: NodeState) -> int:
    """Most warm executors per key on ``node`` (`CoreConfig.max_warm_per_node` None): two
    per core, at least 8."""
    c = int(2 * node.cap.get(CPU, 0.0))
    return c if c > 8 else 8


def _floor_of(el: Elasticity, floor: float) -> float:
    """How far a reclaim may shrink an action of ``el``: ``floor`` within its range."""
    if floor <= el.min:
        return el.min
    return floor if floor < el.max else el.max


def _gain(rec: ActionRecord, step: float) -> float:
    """Weighted drop of expected remaining time from one more ``step`` of the elastic dim."""
    el = rec.spec.elasticity
    assert el is not None and rec.allotment is not None
    k = rec.allotment.get(el.dim)
    work = rec.est  # seconds at one unit of speed (the estimate is at speed 1)
    sp = el.speedup
    now_t = work / max(sp.factor(k), 1e-9)
    next_t = work / max(sp.factor(min(el.max, k + step)), 1e-9)
    return (now_t - next_t) * rec.spec.weight
