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
        step = self.config.elastic_step
        heap: list[tuple[float, int, str]] = []
        elastic = False  # any elastic action on the node (grown to its max or not)
        for aid in node.running:
            rec = self.actions.get(aid)
            if rec is None or rec.allotment is None:
                continue
            el = rec.spec.elasticity
            if el is None or not el.is_elastic:
                continue
            elastic = True
            if rec.allotment.get(el.dim) >= el.max - 1e-9:
                continue
            heap.append((-_gain(rec, step), rec.seq, aid))
        if not heap:
            if not elastic:
                self._elastic_nodes.discard(node.name)
            return
        heapq.heapify(heap)
        changed: dict[str, ActionRecord] = {}
        while heap:
            g, _, aid = heapq.heappop(heap)
            rec = self.actions[aid]
            el = rec.spec.elasticity
            assert el is not None and rec.allotment is not None
            spare = node.free.get(el.dim, 0.0) - self._reserve_of(node, el.dim)
            k = rec.allotment.get(el.dim)
            delta = min(step, el.max - k, spare)
            if delta <= 1e-9 or g >= 0:
                continue
            node.take({el.dim: delta})
            rec.allotment = rec.allotment.with_amount(el.dim, k + delta)
            changed[aid] = rec
            if k + delta < el.max - 1e-9:
                heapq.heappush(heap, (-_gain(rec, step), rec.seq, aid))
        if changed:
            self.index.update(node.name, node.free)
            self._emit_resizes(node, changed.values())

    def _reclaim(self: Core, node: NodeState, need: Resources) -> bool:
        """Make room for ``need`` on ``node`` by shrinking the elastic actions grown there
        (never below their minimum), the least expected loss first; False, shrinking nothing,
        when that cannot make it fit. Growth is lent, not given: a session's action that can
        run only on this node does not queue behind a test that took its spare cores."""
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
            extra = rec.allotment.get(CPU) - el.min
            if extra > 1e-9:
                spare += extra
                heap.append((_loss(rec, min(step, extra)), rec.seq, aid))
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
            delta = float(min(step, k - el.min, short))
            node.give({CPU: delta})
            rec.allotment = rec.allotment.with_amount(CPU, k - delta)
            changed[aid] = rec
            short -= delta
            if k - delta > el.min + 1e-9:
                heapq.heappush(heap, (_loss(rec, min(step, k - delta - el.min)), rec.seq, aid))
        self.index.update(node.name, node.free)
        self._emit_resizes(node, changed.values())
        return True

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
        cap = cfg.max_warm_per_node
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
            if t > cap:
                t = cap  # min(cap, want // n + (1 if i < want % n else 0))
            if sent.get((name, key), 0) != t:
                sent[(name, key)] = t
                self._out.append(ResizeWarmPool(name, key, t, cause=self._cause))


def _loss(rec: ActionRecord, step: float) -> float:
    """Weighted rise of expected remaining time from one ``step`` less of the elastic dim."""
    el = rec.spec.elasticity
    assert el is not None and rec.allotment is not None
    k = rec.allotment.get(el.dim)
    sp = el.speedup
    return (rec.est / max(sp.factor(k - step), 1e-9) - rec.est / max(sp.factor(k), 1e-9)) * rec.spec.weight


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
