"""Tangram's elasticity: the width an elastic action starts at, where, and spare capacity to it.

Invariant: expansion never takes a node's free capacity below its reserve in the elastic
dimension (``reserve_fraction`` of it, and in CPU at least the largest minimum demand arrivals
have had: `reserve_of`), never grows an action past its ``elasticity.max``, and runs only when no
shared-pool work is queued (pending work comes first). An allotment grown before its
StartAction left the core is sent as a bigger StartAction, otherwise as a ResizeAction.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterable
from typing import Final

from .actions import Elasticity
from .cluster import NodeSpec
from .commands import ResizeAction, StartAction
from .fit import fits_besides_cpu
from .placement import WARM_SCAN, Placer
from .queues import Queues
from .records import ActionRecord, NodeState
from .resources import CPU, Resources
from .state import CoreState
from .warmpools import WarmPools

_insort: Final = bisect.insort  # (Final: compiled, read without the module's lookup)
# The fluid model's jobs of a node's elastic runs, without a speedup measured there: their work
# left (sorted), the class of each, each class's maximum and parallel fraction (`_classes`), and
# the sum of their maximums
_Kinds = tuple[list[float], list[int], list[float], list[float], float]


class Elastic:
    """Elastic actions (tangram): the width each starts at, where, and growth into spare CPU."""

    def __init__(self, st: CoreState, queues: Queues, placer: Placer, warm: WarmPools) -> None:
        self.st = st
        self.queues = queues
        self.placer = placer
        self.warm = warm
        self.largest_min_cpu = 0.0  # the largest minimum CPU demand an action arrived with
        # the instant and state of the estimator that `_waited` and `_runs` below hold for
        self._left_now = -1.0
        self._left_version = -1
        # at the same instant and state of the estimator: (node, its `moves`, elasticity) ->
        # the least expected work of a session's head that waited there (`width_on`)
        self._waited: dict[tuple[NodeState, int, Elasticity], float] = {}
        # across instants and states: node -> elasticity -> the expected works (least first,
        # at most `_HINTS`) of heads that waited there lately (`width_on`'s probes)
        self._hints: dict[NodeState, dict[Elasticity, list[float]]] = {}
        # and `plan`'s view of a node's elastic runs: node -> (its `moves`, CPU they hold, their
        # (work left, elasticity) by work left, and their classes in the fluid model: `_Kinds`)
        self._runs: dict[NodeState, tuple[int, float, list[tuple[float, Elasticity]],
                                          _Kinds]] = {}
        # `absorb` and `lendable` of a node as of its `moves` (they read only its elastic
        # actions' allotments, which change only with it): node (and floor) -> (moves, CPU)
        self._absorbs: dict[NodeState, tuple[int, float]] = {}
        self._holds: dict[NodeState, tuple[int, float, int]] = {}  # `_holding`: (moves, CPU, runs)
        self._lends: dict[tuple[NodeState, float], tuple[int, float]] = {}

    def arrived(self, cpu: float) -> None:
        """An action arrived with ``cpu`` as its (minimum) CPU demand: the reserve follows it."""
        if cpu > self.largest_min_cpu:
            self.largest_min_cpu = cpu

    def expand(self) -> None:
        """Give spare capacity (beyond the reserve) to elastic actions on changed nodes,
        one step at a time to the action whose expected completion time drops the most. It
        runs after the event's scheduling pass, so queued work has taken what it fits first:
        what is left on a node fits no queued head (work conservation) and would sit idle."""
        live = self.st.elastic_nodes
        if not live:
            return  # no elastic action runs anywhere (and `expand_at` holds none of them)
        nodes = (self.st.expand_at | self.st.dirty) & live  # a node off `live`: nothing to expand
        self.st.expand_at.clear()
        for name in sorted(nodes) if len(nodes) > 1 else nodes:
            node = self.st.nodes.get(name)
            if node is None or not node.alive or name in self.st.reserved:
                continue
            if node.running:
                self.expand_node(node)

    def expand_node(self, node: NodeState) -> None:
        """Spare capacity to the node's elastic actions below their maximum, the least
        expected work left first (heSRPT gives the most to the shortest: Berg, Vesilo and
        Harchol-Balter, SIGMETRICS 2020), one `elastic_step` at a time while it speeds it up."""
        step = self.st.config.elastic_step
        heap: list[tuple[float, int, ActionRecord]] = []  # (the seq breaks ties: records never compared)
        actions = self.st.actions
        running = node.running
        growable = self.placer.growable.get(node.name)
        reserve = -1.0  # the node's CPU reserve (`reserve_of`), once an action asks
        if growable and not self.placer.other_dims:
            reserve = self.reserve_of(node, CPU)
            if node.free.get(CPU, 0.0) - reserve <= 1e-9:
                growable = None  # no spare CPU: no turn below would give anything
        # the node's elastic actions below their maximum: all of them are in `growable`
        # (placement adds each start, `reclaim` each shrink); the others met there leave it
        # (a superset's order: the heap's keys decide, as over `node.running`)
        gone: list[str] = []
        for aid in growable if growable else ():
            rec = actions.get(aid)
            if rec is None or aid not in running or rec.allotment is None or not rec.elastic:
                gone.append(aid)
                continue
            if rec.el_cpu:
                if reserve < 0.0:
                    reserve = self.reserve_of(node, CPU)
                if node.free.get(CPU, 0.0) - reserve <= 1e-9:
                    continue  # no spare CPU: its turn below would give it nothing (a full
                    # node's expansion looks at each action, not at its expected work left)
            if rec.width >= rec.el_max - 1e-9:  # pragma: no mutate (the tolerance's edge; `width`: its allotment in its elastic dimension)
                gone.append(aid)
                continue
            heap.append((self.remaining(rec), rec.seq, rec))
        if gone and growable:
            for aid in gone:
                del growable[aid]
        if not heap:
            if not node.elastic:  # (no elastic action runs on it)
                self.st.elastic_nodes.discard(node.name)
            return
        heapq.heapify(heap)
        changed: dict[str, ActionRecord] = {}
        cpu_only = not self.placer.other_dims  # (every action here stretches in CPU)
        spent = False  # no spare CPU left: every later turn would give nothing (issue 40)
        while heap and not spent:
            rec = heapq.heappop(heap)[2]
            aid = rec.spec.id
            el = rec.spec.elasticity
            assert el is not None and rec.allotment is not None
            # its turns, one step each: its work left (the heap's key) is the same after a
            # step, which changes its width, not its work done, so it stays the least on the
            # heap and takes the next turn too, until it stops (issue 40: the heap is not
            # touched per step)
            while True:  # (it stops at its maximum: its next delta is 0)
                # (`free` holds the dim: `take` wrote it when the action started there)
                spare = node.free.get(el.dim, 0.0)  # pragma: no mutate
                spare -= self.reserve_of(node, el.dim)
                if cpu_only and spare <= 1e-9:  # pragma: no mutate (the tolerance's edge)
                    spent = True
                    break
                k = rec.width
                delta = min(el.max - k, spare)
                if delta > step:  # pragma: no mutate (at equality, the same delta)
                    delta = step
                if delta <= 1e-9:  # pragma: no mutate (the tolerance's edge)
                    break
                if _gain(rec, delta) <= 0.0:
                    break
                if node.spec.parallel_speedup and el.dim == CPU:  # noqa: SIM102 (the node's measured
                    # speedup: everyone there may slow more than it gains; a gain of exactly
                    # 0.0: a tie, either way; a width in another dimension busies no core)
                    if self.node_gain(node, rec, delta) <= 0.0:  # pragma: no mutate
                        break
                self.retime(rec)
                node.take({el.dim: delta})
                if self.st.fair:
                    self.st.tenant_take(rec.tenant, {el.dim: delta}, 1.0)
                rec.allot(rec.allotment.with_amount(el.dim, k + delta))
                changed[aid] = rec
        if changed:
            self.st.index.update(node.name, node.free)
            self.emit_resizes(node, changed.values())

    def node_gain(self, node: NodeState, rec: ActionRecord, delta: float) -> float:
        """On a node with a measured ``parallel_speedup``: the weighted drop of expected
        remaining time, over every action running there, from ``delta`` more CPU to ``rec``.
        Its cores then deliver less each (`_efficiency`), so the others slow down while
        ``rec`` speeds up; where the node hardly gains from a second busy core, growth loses."""
        el = rec.spec.elasticity
        assert el is not None and rec.allotment is not None
        busy = node.cap.get(CPU, 0.0) - node.free.get(CPU, 0.0)
        e0 = _efficiency(node.spec, busy)
        e1 = _efficiency(node.spec, busy + delta)
        k = rec.width
        left = self.remaining(rec)
        sp = el.speedup
        gain = left * (1.0 / max(sp.factor(k) * e0, 1e-9)
                       - 1.0 / max(sp.factor(k + delta) * e1, 1e-9)) * rec.spec.weight
        if e1 >= e0:
            return gain
        for aid in node.running:
            other = self.st.actions.get(aid)
            if other is None or other is rec or other.allotment is None or other.allotment.get(CPU) <= 0.0:
                continue
            t = self.remaining(other) / max(other.speed() * e0, 1e-9)
            gain -= t * (e0 / e1 - 1.0) * other.spec.weight
        return gain

    def lender(self, rec: ActionRecord) -> NodeState | None:
        """No node fits a shared-pool head: the node whose grown elastic actions can lend it
        the CPU it lacks (the one with the most lent out), after they lent it; else None."""
        best: NodeState | None = None
        most = 1e-9  # (a node that lends nothing cannot help)
        need = rec.charge if rec.charge is not None else rec.spec.demand
        for name in self.st.elastic_nodes:
            node = self.st.nodes[name]
            if not node.alive or name in self.st.reserved:
                continue
            lent = 0.0
            for other in node.elastic.values():  # (a fixed width, max = min, lends nothing)
                if other.el_cpu:  # (running: its allotment is set until `Core._release`)
                    lent += other.width - other.el_min  # (`width`: its allotment's CPU)
            if lent + node.free.get(CPU, 0.0) < rec.cpu - 1e-9 or lent < most - 1e-12:
                continue
            if lent > most + 1e-12 or best is None or name < best.name:  # (ties: by name, as
                best, most = node, lent  # a set's order differs from process to process)
        if best is None or not self.reclaim(best, need):
            return None
        return best


    def reclaim(self, node: NodeState, need: Resources, floor: float = 0.0) -> bool:
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
        # `lendable`'s sum, where kept for this state of the node: a crowded node's waiting
        # heads ask again and again, each a walk over its hundreds of elastic runs (issue 40).
        # Every extra summed in ``spare`` below is in that sum too, so it is never short where
        # that is not; where it is not kept, the one walk below keeps it
        seen = self._lends.get((node, floor))
        if seen is not None and seen[0] == node.moves and seen[1] < short - 1e-9:  # pragma: no mutate (<=: the tolerance's edge)
            return False
        lenders: list[ActionRecord] = []
        spare = self._lenders(node, floor, lenders)[1]
        if spare < short - 1e-9:
            return False  # (summed before any work left is read: a reclaim that cannot make
            # room costs one pass over the widths, not an estimate per lender; issue 40)
        step = self.st.config.elastic_step
        heap = [(-self.remaining(rec), rec.seq, rec) for rec in lenders]  # (the seq breaks ties)
        heapq.heapify(heap)
        changed: dict[str, ActionRecord] = {}
        while short > 1e-9 and heap:
            rec = heapq.heappop(heap)[2]
            aid = rec.spec.id
            assert rec.allotment is not None
            k = float(rec.width)  # (floats: the same repr compiled and pure)
            lo = _floor_of(rec, floor)
            delta = float(min(step, k - lo, short))
            self.retime(rec)
            node.give({CPU: delta})
            if self.st.fair:
                self.st.tenant_take(rec.tenant, {CPU: delta}, -1.0)
            rec.allot(rec.allotment.with_amount(CPU, k - delta))
            self.placer.may_grow(node.name, aid)
            changed[aid] = rec
            short -= delta
            if k - delta > lo + 1e-9:
                heapq.heappush(heap, (-self.remaining(rec), rec.seq, rec))
        self.st.index.update(node.name, node.free)
        self.emit_resizes(node, changed.values())
        return True

    # ---- the width of an elastic action: heSRPT rounded to whole cores --------------------------
    def remaining(self, rec: ActionRecord) -> float:
        """Expected work left of a running action (seconds at speed 1), given the work its
        allotments have done since it started (`done`, brought up to now): the estimator's
        mean excess (`remaining_work`: a bisection of the key's values), else its estimate
        less that work. The answer is a function of that work and the estimator's state alone,
        so it is kept on the record for both: an event that plans a crowded node, then
        reclaims and expands there, asks it of the same runs up to three times (issue 40)."""
        st = self.st
        now = st.now
        done = rec.done
        if rec.allotment is not None and now > rec.since:
            done += (now - rec.since) * rec.speed()
        version = st.estimator.version
        if rec.left_version == version and rec.left_done == done:
            return rec.left
        left = st.estimator.remaining_work(rec.ekey, rec.units, done)
        if left is None:
            left = rec.est - done
        if left <= 1e-9:
            left = 1e-9
        rec.left = left
        rec.left_done = done
        rec.left_version = version
        return left

    def _forget(self) -> None:
        """Forget the answers of another instant or state of the estimator (`width_on`'s,
        `plan`'s)."""
        self._waited.clear()
        self._runs.clear()
        self._left_now = self.st.now
        self._left_version = self.st.estimator.version

    def retime(self, rec: ActionRecord) -> None:
        """Bring an action's `done` up to now, before its allotment changes."""
        if rec.allotment is not None and self.st.now > rec.since:
            rec.done += (self.st.now - rec.since) * rec.speed()
        rec.since = self.st.now

    def overdue(self, rec: ActionRecord) -> bool:
        """Whether a queued elastic action has waited longer than its expected run at its
        maximum: it then starts at whatever width it can get (no wait for a width is longer
        than the run it saves)."""
        return self.st.now >= self.queues.overdue_from(rec)

    def plan(self, rec: ActionRecord, node: NodeState, behind: int,
             elsewhere: float = math.inf, work: float = -1.0) -> tuple[float, float]:
        """How elastic ``rec`` (a queue head) should start on ``node`` now: ``(width, floor)``,
        width 0.0 to wait; ``floor`` is how far the node's running elastic actions may be
        shrunk to make room for it.

        The rule is heSRPT's (Berg, Vesilo and Harchol-Balter, SIGMETRICS 2020: finish jobs
        shortest first, the most cores to the shortest; share only as far as the speedup curve
        pays for it) on whole lanes: of "at most L at once" on the node's elastic capacity
        (its free CPU plus what its elastic actions hold), from L = the elastic actions running
        there (wait: ``rec`` starts when one ends) up to the most of ``rec``'s minimum, the L
        with the least sum of expected completion times wins (`_fluid`; ties: fewer, wider).
        The jobs are the running elastic actions (never stopped), ``rec`` and the ``behind``
        actions queued after it (the node's share of the queue, taken as ``rec``'s size),
        shortest first; those running share the capacity, each up to its maximum, and widen
        as others end. Waiting is waiting for the first full width anywhere: ``rec`` may start
        at its maximum on another node ``elsewhere`` seconds from now (`free_at`), if that
        comes before its turn here. On 2 cores with n equal jobs waiting this is "one after
        another wins while s(2) > 2(n+1)/(n+2)". O(lanes tried x jobs log jobs) (`_fluid`), no
        solver. ``work``: plan as if ``rec``'s expected work were that (`width_on`'s probe).

        Waiting is for a width: a session's head (``behind`` 0, nowhere ``elsewhere``) whose
        lane at the first end would be no wider than its lane now, both rounded as started
        (`_no_wider_later`), starts now with one lane more, without the model: the runs' lanes,
        rounded, are the same with it or without it, so it takes only cores the rounding left
        over (not on a node with a measured speedup, where one more busy core slows every
        other: the model weighs that). The model's
        "wait" is a plan made once (start at the first end) but carried out again at every
        event: at that end the rule weighs the same kind of state and waits again, so on a
        crowded node (150 tests at their 1-core minimum beside 1 free core) every head waited
        until overdue while each free core widened the shortest run by 0.4 of a core's speed.
        heSRPT serves every job at once under concave speedups, none at zero while cores are
        free; a head that waiting cannot widen is, for this choice, an inelastic job, and
        Inelastic-First (Berg, Dorsman and Harchol-Balter, SIGMETRICS 2018) runs those first.
        (docs/core.md, "Waiting is for a width".)"""
        el = rec.spec.elasticity
        assert el is not None
        held, n_run = self._holding(node)
        free = node.free.get(CPU, 0.0)  # pragma: no mutate (a node of elastic runs and heads has CPU: never the default)
        cap = free + held
        lo = el.min
        top = el.max if el.max < cap else cap
        if top < lo - 1e-9:
            return 0.0, 0.0
        measured = node.spec if node.spec.parallel_speedup else None
        base = node.cap.get(CPU, 0.0) - cap  # CPU held there by others than its elastic actions
        if measured is not None:
            top = _useful(el, measured, base, top)
        step = self.st.config.elastic_step
        best_lanes = -1
        if (behind == 0 and elsewhere == math.inf and measured is None
                and _no_wider_later(cap, top, lo, n_run, step)):
            best_lanes = n_run + 1  # (waiting would buy it no width: one lane more, now)
        else:
            _, runs, kinds = self._view(node)  # (the runs' work left: the model's jobs)
            x = self.st.expected_work(rec) if work < 0.0 else work  # pragma: no mutate (<=: a probe's work is a waited head's, above 0)
            if behind == 0 and measured is None and elsewhere == math.inf:
                best_lanes = _lanes_all_at_max(cap, top, lo, runs, x, el, kinds)
            if best_lanes < 0:  # pragma: no mutate (< 1, <= 0: `_lanes_all_at_max` gives -1 or a count above the runs)
                best_lanes = _best_lanes(cap, top, lo, runs, x, el, behind, elsewhere, measured,
                                         base, kinds if measured is None else None)
        if best_lanes <= n_run:
            return 0.0, 0.0
        width = _rounded(cap / best_lanes, step, top)
        return width, width

    def _view(self, node: NodeState) -> tuple[float, list[tuple[float, Elasticity]], _Kinds]:
        """`plan`'s view of ``node``'s elastic runs (those that stretch in CPU): the CPU they
        hold, their (work left, elasticity) by work left, and their classes (`_Kinds`); built
        once per instant, state of the estimator and of the node (`NodeState.moves`)."""
        st = self.st
        if st.now != self._left_now or st.estimator.version != self._left_version:
            self._forget()
        seen = self._runs.get(node)
        if seen is not None and seen[0] == node.moves:  # (another head, the node unchanged)
            return seen[1], seen[2], seen[3]
        held = 0.0
        runs: list[tuple[float, Elasticity]] = []
        for other in node.elastic.values():
            if other.el_cpu:
                oel = other.spec.elasticity
                assert oel is not None
                held += other.width
                runs.append((self.remaining(other), oel))
        runs.sort(key=_first)
        kinds = _kinds_of(runs)  # (once per node's state, not per head and lane count)
        self._runs[node] = (node.moves, held, runs, kinds)
        return held, runs, kinds

    def _holding(self, node: NodeState) -> tuple[float, int]:
        """The CPU ``node``'s elastic runs (those that stretch in CPU) hold and how many they
        are, kept as of its `moves`: what `plan` and `_no_wider` weigh before the runs' work
        left (`_view`, rebuilt at every instant: on a crowded node each event's heads asked it
        of ~150 runs only to count them)."""
        seen = self._holds.get(node)
        if seen is not None and seen[0] == node.moves:  # pragma: no mutate (a miss: the same sums)
            return seen[1], seen[2]
        held = 0.0
        n = 0
        for other in node.elastic.values():  # (the order of `_view`'s sum: the same float)
            if other.el_cpu:
                held += other.width
                n += 1
        self._holds[node] = (node.moves, held, n)
        return held, n

    def _no_wider(self, el: Elasticity, node: NodeState) -> bool:
        """Whether a session's head of ``el`` would start no wider on ``node`` at the first
        end of its elastic runs than now (`_no_wider_later`, as `plan` weighs it; never on a
        node with a measured speedup): then it starts now whatever its work, so `width_on`'s
        memo and probes do not apply."""
        if node.spec.parallel_speedup:
            return False  # pragma: no mutate (None: as False to `width_on`)
        held, n_run = self._holding(node)
        free = node.free.get(CPU, 0.0)  # pragma: no mutate (as in `plan`: never the default)
        cap = free + held
        top = el.max if el.max < cap else cap  # pragma: no mutate (<=: equal, the same value)
        return _no_wider_later(cap, top, el.min, n_run, self.st.config.elastic_step)

    def free_at(self, node: NodeState, width: float) -> float:
        """Expected seconds until ``width`` CPU is free on ``node`` (as its running actions
        end, each its expected work left at its current speed), inf if never (sessions and
        other holdings stay)."""
        have = node.free.get(CPU, 0.0)
        if have >= width - 1e-9:
            return 0.0
        ends: list[tuple[float, float]] = []
        for aid in node.running:
            other = self.st.actions.get(aid)
            if other is None or other.allotment is None:
                continue
            c = other.allotment.get(CPU)
            if c <= 0.0:
                continue
            t = self.remaining(other) / max(other.speed(), 1e-9)
            ends.append((t, c))
        ends.sort()
        for t, c in ends:
            have += c
            if have >= width - 1e-9:
                return t
        return math.inf

    def width_on(self, rec: ActionRecord, node: NodeState, behind: int,
                       elsewhere: float = math.inf) -> tuple[float, float]:
        """``(width, floor)`` at which elastic ``rec`` starts on ``node`` now (width 0.0: it
        waits): the width `plan` chose, as far as free CPU and what the node's elastic actions
        hold above ``floor`` allow; where the plan says wait but the node's elastic actions
        could not take its free CPU (at their maximum, or none), what they cannot take (an
        idle core helps no one, and the action grows as cores free: growth is real); once
        overdue (`overdue`), any width from its minimum.

        A session's head (``behind`` 0, nowhere ``elsewhere``: `SchedulingPass.try_place`) that
        would start no sooner than one of the same elasticity that waited on the same node at
        the same instant, with nothing started, ended or resized there since (`NodeState
        .moves`), and with at least its expected work, waits too without a plan: heSRPT never
        gives a longer job more than a shorter one (issue 40: on a crowded node every event
        planned each of the node's waiting heads over every elastic action running there).
        Such a head with more work than the least of its elasticity that waited there lately
        (`_hint`, at another instant or state) is first planned as if it had that work (a
        probe): if that waits, the memo takes that work and the head waits; if it would start,
        those hints go and the head is planned as itself. On a crowded node the aged heads come
        oldest first, each with less work than the last: the memo alone answered none of them.
        Like the memo, an approximation where the lane rule is not monotone in work (rare:
        docs/core.md, "Probes at the least work that waited"). Neither applies where waiting
        would buy the head no width (`_no_wider`): it starts then whatever its work (`plan`).
        A head that could not have its minimum even with every lent core back (free CPU and
        `lendable` down to the runs' minimums) waits without a plan, memo or hint: whatever a
        plan said, `reclaim` could not make room for a width of it (not with a standing reserve,
        whose start may take its minimum from the reserve). On a crowded node (every run at its
        1-core minimum, no core free) each event probed a head over ~150 runs to wait."""
        el = rec.spec.elasticity
        assert el is not None
        if el.dim != CPU:  # (the lane rule weighs cores: a width in another dimension starts
            # at its minimum where its demand fits, and expansion grows it as that frees)
            width = el.min if node.fits(rec.spec.demand) else 0.0
            return width, 0.0  # pragma: no mutate (no floor: a start whose demand fits reclaims no CPU)
        free = node.free.get(CPU, 0.0)
        widest = el.max
        if node.spec.parallel_speedup:
            widest = _useful(el, node.spec, node.cap.get(CPU, 0.0) - free - self.lendable(node, 0.0), el.max)
        if self.overdue(rec):
            if free >= el.min - 1e-9:
                return (free if free < widest else widest), 0.0
            if free + self.lendable(node, 0.0) >= el.min - 1e-9:
                return el.min, 0.0  # (`reclaim` takes lent cores down to their minimum)
            return 0.0, 0.0
        if (free < el.min - 1e-9 and self.st.config.reserve_fraction <= 0.0
                and free + self.lendable(node, 0.0) < el.min - 1e-9):
            return 0.0, 0.0  # (no room for its minimum, whatever a plan says)
        key: tuple[NodeState, int, Elasticity] | None = None
        x = 0.0  # pragma: no mutate (read only where `key` is set, and set with it)
        if behind == 0 and elsewhere == math.inf and not self._no_wider(el, node):
            st = self.st
            if st.now != self._left_now or st.estimator.version != self._left_version:
                self._forget()
            key = (node, node.moves, el)
            x = st.expected_work(rec)
            least = self._waited.get(key)
            if least is not None and x >= least:
                return 0.0, 0.0
            hints = self._hints.get(node)
            works = None if hints is None else hints.get(el)
            if hints is not None and works is not None and works[0] < x:
                # the probe: plan as the least head that waited here lately; if that waits, so
                # does this one (more work), and every head of at least that work, this
                # instant; if it would start now, the node has room it had not: the hints go
                if self.plan(rec, node, 0, math.inf, works[0])[0] == 0.0:  # pragma: no mutate (its [1]: a plan's floor is its width)
                    return self._left_over(node, el, widest, free, key, works[0])
                del hints[el]
        width, floor = self.plan(rec, node, behind, elsewhere)
        if width > 0.0:
            if self.st.config.reserve_fraction > 0.0:  # the reserve: beyond the minimum, untouched
                keep = free - self.reserve_of(node, CPU)
                room = keep if keep > el.min else el.min
            else:  # free CPU, and what the node's elastic actions lend (looked at where needed)
                room = free if free >= width else free + self.lendable(node, floor)
            if room < width:
                width = room
            return (width if width >= el.min - 1e-9 else 0.0), floor
        return self._left_over(node, el, widest, free, key, x)

    def _hint(self, node: NodeState, el: Elasticity, x: float) -> None:
        """A head of elasticity ``el`` and expected work ``x`` waited on ``node`` by the plan:
        kept for `width_on`'s probes (of at most `_HINTS` elasticities a node: the oldest
        goes)."""
        hints = self._hints.get(node)
        if hints is None:
            hints = self._hints[node] = {}
        works = hints.get(el)
        if works is None:
            if len(hints) >= _HINTS:
                del hints[next(iter(hints))]
            hints[el] = [x]
            return
        if x in works:
            return
        bisect.insort(works, x)
        if len(works) > _HINTS:
            works.pop()

    def _left_over(self, node: NodeState, el: Elasticity, widest: float, free: float,
                   key: tuple[NodeState, int, Elasticity] | None, x: float) -> tuple[float, float]:
        """`width_on` where the plan (or a probe at work ``x``) says wait: what the node's
        elastic actions cannot take of its ``free`` CPU (up to ``widest``), if that is the
        minimum; else a wait, remembered for a session's head (``key``: the memo, and a hint)."""
        left = free - self.absorb(node)
        if left >= el.min - 1e-9:
            return (left if left < widest else widest), 0.0
        if key is not None:  # (none waited there yet, or only with more work)
            self._waited[key] = x
            self._hint(node, el, x)
        return 0.0, 0.0

    def absorb(self, node: NodeState) -> float:
        """CPU the node's elastic actions below their maximum could still take."""
        seen = self._absorbs.get(node)
        if seen is not None and seen[0] == node.moves:  # pragma: no mutate (a miss: the same sum)
            return seen[1]
        total = 0.0
        for rec in node.elastic.values():  # (those that stretch in CPU below)
            if rec.el_cpu:
                total += rec.el_max - rec.width
        self._absorbs[node] = (node.moves, total)
        return total

    def lendable(self, node: NodeState, floor: float) -> float:
        """CPU the node's elastic actions hold above ``floor`` (above their minimum where
        that is higher, never where their range ends below ``floor``)."""
        seen = self._lends.get((node, floor))
        if seen is not None and seen[0] == node.moves:  # pragma: no mutate (a miss: the same sum)
            return seen[1]
        return self._lenders(node, floor, None)[0]

    def _lenders(self, node: NodeState, floor: float,
                 lenders: list[ActionRecord] | None) -> tuple[float, float]:
        """One walk over the node's elastic actions that hold more than their minimum
        (`NodeState.lent`, in the order of `NodeState.elastic`: the others add nothing above any
        floor, so the sums are those of a walk over every one, to the bit): `lendable`'s sum
        (kept as of the node's `moves`: it reads only their allotments, which change only
        with it) and the sum of the extras above 1e-9, those actions appended to ``lenders``
        in the node's order (`reclaim`'s, from the same walk). On a crowded node most runs
        sit at their minimum: a walk over ~150 of them at every start there was 7% of the
        core's time (issue 40)."""
        total = spare = 0.0
        lent = node.lent  # (a run at its minimum has no extra above any floor: the walk of
        # `elastic` in its order, less the runs that add nothing)
        for rec in (lent.values() if len(lent) < 2 else sorted(lent.values(), key=_el_rank)):
            extra = rec.width - _floor_of(rec, floor)  # (`width`: its allotment's CPU; all stretch in CPU)
            if extra > 0.0:  # pragma: no mutate (>=: an extra of 0.0 adds nothing)
                total += extra
                if extra > 1e-9 and lenders is not None:  # pragma: no mutate (the tolerance's edge)
                    spare += extra
                    lenders.append(rec)
        self._lends[(node, floor)] = (node.moves, total)
        return total, spare

    def place(self, rec: ActionRecord) -> bool:
        """Start a shared-pool elastic head where `choose` says; False when it waits
        (then the candidates with free CPU are where expansion looks: their elastic actions
        go wide while it waits)."""
        best, width, floor, cands = self.choose(rec)
        if best is None:
            for node in cands:
                if node.free.get(CPU, 0.0) > 1e-9:
                    self.st.expand_at.add(node.name)
            if width < 0.0 and rec.queue_key is not None:  # waits for a warm node: looks
                self.placer.wait_for_warm(rec.queue_key)  # again when a warm pool runs dry
            return False
        self.start(rec, best, width, floor)
        return True

    def choose(self, rec: ActionRecord,
                        ) -> tuple[NodeState | None, float, float, list[NodeState]]:
        """Where a shared-pool elastic head starts now, and at what width: ``(node, width,
        floor, candidates)``, node None to wait (width -1.0: for a warm node). It goes where it
        is expected to finish first:
        a cold start (`sandbox_cold_s`; none on a node with a warm executor for it, or where
        sandboxes stay resident) plus its run at the width it gets there (`width_on`),
        among the few nodes with the most free CPU and the few warm for it that fit its other
        dimensions; when that is a cold start, it waits instead for a node warm for it that is
        expected to free its full width sooner. Waiting there is waiting for the first of the
        candidates to free its full width (`_first_two_full`; the second, for that node itself),
        and where it would start narrower than that, for the first (and second) of every node of
        the pool that fits it: the candidates of a full pool are any few of its nodes, not those
        about to free. Decides only (`validate` asks it too)."""
        names = self.warm.cpu_nodes()  # (the queue's elastic actions spread over them)
        n = len(names) if names else 1
        queued = self.queues.queued_elastic() - 1  # (this head is still queued)
        behind = 0 if queued <= 0 else min(32, -(-queued // n))
        cands, ws = self._candidates(rec)
        el = rec.spec.elasticity
        assert el is not None
        first, second, first_node = self._first_two_full(cands, el.max)
        x = self.st.expected_work(rec)
        best, best_t, best_w, best_floor, best_cold = self._fastest(rec, cands, behind, x, first,
                                                                    second, first_node)
        cap = best.cap.get(CPU, 0.0) if best is not None else 0.0  # pragma: no mutate (a candidate has CPU; None is not read)
        if best is not None and best_w < (el.max if el.max < cap else cap) - 1e-9:  # pragma: no mutate (at its full width it starts now: no wait elsewhere beats that, the scan only costs)
            # it would start narrow: waiting is waiting for the first full width on any node of
            # the pool, not only on the few candidates (all full, they may be the last to free)
            pool = self._first_two_full(self._all_fitting(rec), el.max)
            if pool != (first, second, first_node):
                best, best_t, best_w, best_floor, best_cold = self._fastest(
                    rec, cands, behind, x, *pool)
        if best is None:
            return None, 0.0, 0.0, cands
        cold = 0.0 if self.st.resident else self.st.config.sandbox_cold_s  # pragma: no mutate (only tangram places here, never resident: policies.py)
        if (best_cold and cold > 0.0 and ws and not self.overdue(rec)
                and self._warm_sooner(rec, best, ws, x, best_t)):
            return None, -1.0, 0.0, cands  # it waits for the warm node (a finish there retries it)
        return best, best_w, best_floor, cands

    def _fastest(self, rec: ActionRecord, cands: list[NodeState], behind: int, x: float,
                 first: float, second: float, first_node: str,
                 ) -> tuple[NodeState | None, float, float, float, bool]:
        """Of ``cands``, where ``rec`` (expected work ``x``) finishes first if it starts now,
        waiting elsewhere being a full width ``first`` seconds from now on ``first_node``
        (``second`` for that node itself): ``(node, time, width, floor, cold)``, node None
        where it waits on every candidate."""
        el = rec.spec.elasticity
        assert el is not None
        best: NodeState | None = None
        best_t = math.inf
        best_w = 0.0
        best_floor = 0.0
        best_cold = False
        cold = 0.0 if self.st.resident else self.st.config.sandbox_cold_s
        wkey = rec.wkey
        for node in cands:
            elsewhere = second if node.name == first_node else first
            width, floor = self.width_on(rec, node, behind, elsewhere)
            if width <= 0.0:
                continue
            warm = node.warm.get(wkey, 0) > 0 if node.warm else False
            speed = el.speedup.factor(width)
            if node.spec.parallel_speedup:  # what its cores deliver once it runs there
                cores = width if el.dim == CPU else rec.cpu
                busy = node.cap.get(CPU, 0.0) - node.free.get(CPU, 0.0)  # pragma: no mutate (both hold CPU)
                speed *= _efficiency(node.spec, busy + cores)
            t = (0.0 if warm else cold) + x / max(speed, 1e-9)
            if t < best_t - 1e-12 or (t <= best_t + 1e-12 and width > best_w):
                best, best_t, best_w, best_floor, best_cold = node, t, width, floor, not warm
        return best, best_t, best_w, best_floor, best_cold

    def _all_fitting(self, rec: ActionRecord) -> list[NodeState]:
        """Every node of the free index (alive, in the shared pool) not reserved that fits
        ``rec`` besides CPU."""
        nodes, reserved = self.st.nodes, self.st.reserved
        shape = rec.shape
        return [nodes[name] for bucket in self.st.index.buckets_down() for name in bucket
                if name not in reserved and fits_besides_cpu(nodes[name], shape)]

    def _candidates(self, rec: ActionRecord) -> tuple[list[NodeState], dict[str, None] | None]:
        """The nodes ``choose`` weighs for ``rec``: the few with the most free CPU that fit its
        other dimensions, then the few warm for it with its minimum free; and the names of the
        nodes warm for it (None: none)."""
        nodes, reserved = self.st.nodes, self.st.reserved
        shape = rec.shape
        enough = self.st.config.fit_candidates
        cands: list[NodeState] = []
        for bucket in self.st.index.buckets_down():  # the most free CPU first
            for name in bucket:
                if name not in reserved and fits_besides_cpu(nodes[name], shape):
                    cands.append(nodes[name])
                    if len(cands) >= enough:
                        break
            if len(cands) >= enough:
                break
        ws = self.placer.warm_nodes.get(rec.wkey) if self.placer.warm_nodes else None
        if ws:
            found = 0
            for seen, name in enumerate(ws):
                if seen >= WARM_SCAN or found >= enough:
                    break
                node = nodes[name]
                if (node.alive and name not in reserved and node not in cands
                        and node.free.get(CPU, 0.0) >= rec.cpu - 1e-9
                        and fits_besides_cpu(node, shape)):
                    cands.append(node)
                    found += 1
        return cands, ws

    def _first_two_full(self, cands: list[NodeState], top: float) -> tuple[float, float, str]:
        """When the first and the second of ``cands`` could give ``top`` cores (at most their
        capacity), and the first's name: waiting on one node is waiting for the first of the
        others (none with a single candidate)."""
        first = second = math.inf
        first_node = ""
        if len(cands) > 1:
            for node in cands:
                c = node.cap.get(CPU, 0.0)
                t = self.free_at(node, top if top < c else c)
                if t < first:
                    second, first, first_node = first, t, node.name
                elif t < second:
                    second = t
        return first, second, first_node

    def _warm_sooner(self, rec: ActionRecord, best: NodeState, ws: dict[str, None], x: float,
                     best_t: float) -> bool:
        """Whether a node warm for ``rec`` that frees its full width soon finishes it before a
        cold start on ``best`` does (a run of milliseconds does not pay a cold start to avoid
        a wait of milliseconds). Where it could start now, starting narrow and growing is
        sooner: such nodes are left out."""
        nodes, reserved = self.st.nodes, self.st.reserved
        el = rec.spec.elasticity
        assert el is not None
        for seen, name in enumerate(ws):
            if seen >= WARM_SCAN:
                break
            node = nodes[name]
            if (node is best or not node.alive or name in reserved
                    or not fits_besides_cpu(node, rec.shape)
                    or node.free.get(CPU, 0.0) - self.absorb(node) >= el.min - 1e-9):
                continue
            c = node.cap.get(CPU, 0.0)
            top = el.max if el.max < c else c
            if self.free_at(node, top) + x / max(el.speedup.factor(top), 1e-9) < best_t:
                return True
        return False

    def start(self, rec: ActionRecord, node: NodeState, width: float, floor: float) -> None:
        """Start elastic ``rec`` on ``node`` at ``width``, shrinking the node's elastic actions
        (not below ``floor``) for the CPU it lacks."""
        alloc = rec.spec.allotment(width)
        if not node.fits(alloc):
            ok = self.reclaim(node, alloc, floor)
            assert ok, f"{rec.spec.id}: no room for {alloc} on {node.name}"
        self.placer.start(rec, node, alloc, True if rec.spec.session is not None else
                    (self.placer.take_warm(node, rec.wkey) if node.warm else False))

    def reserve_of(self, node: NodeState, dim: str) -> float:
        """What expansion leaves free on ``node`` for expected arrivals: ``reserve_fraction``
        of it, and in CPU never less than the largest minimum demand arrivals have had, so
        that the next action starts at once rather than queueing behind grown ones
        (``reserve_fraction=0`` keeps none). A node
        without sessions (whose arrivals may go anywhere) keeps none while another node has
        that much free: the reserve is the cluster's, not every node's."""
        cap = node.cap.get(dim, 0.0)
        r = self.st.config.reserve_fraction * cap
        if dim != CPU or r <= 0.0:
            return r  # (reserve_fraction=0: no reserve at all)
        if self.largest_min_cpu > r:
            r = self.largest_min_cpu if self.largest_min_cpu < cap else cap
        if not node.sessions and self.room_elsewhere(node.name, r):
            return 0.0
        return r

    def room_elsewhere(self, name: str, cpu: float) -> bool:
        """Whether an alive node other than ``name``, not reserved, has ``cpu`` free."""
        reserved = self.st.reserved
        for bucket in self.st.index.buckets_down(cpu):
            for other in bucket:
                if other != name and other not in reserved:
                    return True
        return False

    def emit_resizes(self, node: NodeState, recs: Iterable[ActionRecord]) -> None:
        for rec in recs:
            assert rec.allotment is not None
            i = self.st.start_index.get(rec.spec.id)
            if i is not None:  # not sent yet: start it bigger
                old = self.st.out[i]
                assert isinstance(old, StartAction)
                self.st.out[i] = StartAction(old.action, old.node, rec.allotment, old.warm, old.cause)
            else:
                self.st.out.append(ResizeAction(rec.spec.id, node.name, rec.allotment, cause=self.st.cause))
            el = rec.spec.elasticity
            assert el is not None
            rec.note_width(self.st.now, el.dim, rec.width, self.st.cause)


# `Elastic.width_on`'s probes per node: of so many elasticities, the so many least works of
# heads that waited there lately
_HINTS: Final = 4


def _lane_tries(cap: float, top: float, lo: float, n_run: int) -> list[int]:
    """The lane counts `Elastic.plan` weighs on ``cap`` cores with ``n_run`` elastic actions
    running, ascending: wait (as many as run), one more (if the minimum ``lo`` allows), and as
    many as the widths ``top``, ``top/2``, ``top/4``, ... down to the minimum allow."""
    tries: list[int] = []
    if n_run > 0:
        tries.append(n_run)
    w = top
    while w >= lo - 1e-9:
        lanes = int(cap / w + 1e-9)
        if lanes > n_run and lanes not in tries:
            tries.append(lanes)
        w /= 2.0
    if n_run + 1 <= int(cap / lo + 1e-9) and n_run + 1 not in tries:
        tries.append(n_run + 1)
    tries.sort()
    return tries


def _best_lanes(cap: float, top: float, lo: float, runs: list[tuple[float, Elasticity]], x: float,
                el: Elasticity, behind: int, elsewhere: float, measured: NodeSpec | None,
                base: float, kinds: _Kinds | None = None) -> int:
    """`Elastic.plan`'s choice: of the lane counts `_lane_tries` gives, the one with the least
    sum of completion times (`_fluid`) of ``runs`` (running, sorted by work left), the job of
    work ``x`` and the ``behind`` like it queued after it; ties to fewer lanes. A count at or
    below ``len(runs)`` is waiting. ``kinds``: the classes of ``runs`` (`_classes`), where no
    speedup was ``measured``: the model then runs on them as `_fluid` would on its own."""
    n_run = len(runs)
    tries = _lane_tries(cap, top, lo, n_run)
    if not tries or tries[-1] <= n_run:  # only waiting to weigh (a full node: no lane more)
        return n_run
    jobs = runs + [(x, el)] * (1 + behind)
    if kinds is not None:  # the jobs' classes: the runs', and the job's (a new one, or theirs)
        works, run_cls, tops, pfs, _ = kinds
        c = _class_index(tops, pfs, el.max, el.speedup.parallel_fraction)
        tops_x, pfs_x = tops, pfs
        if c < 0:  # pragma: no mutate (c = 0 as new: one class twice, the same prices to rounding)
            c = len(tops)
            tops_x, pfs_x = [*tops, el.max], [*pfs, el.speedup.parallel_fraction]
        works_x = works + [x] * (1 + behind)
        cls_x = run_cls + [c] * (1 + behind)  # pragma: no mutate (one more: never read, as works_x)
    best_cost = math.inf
    best_lanes = 0
    n_jobs = len(jobs)
    done_all = -1.0  # the cost with every job at once: the same for every lanes >= n_jobs
    for lanes in tries:
        if lanes >= n_jobs and done_all >= 0.0:
            continue  # (it would tie with the fewer lanes already weighed, which win ties)
        if kinds is not None:
            limit = lanes if lanes > n_run else n_run  # pragma: no mutate (>=: equal at n_run)
            cost, join = _fluid_on(cap, limit, works_x, cls_x, tops_x, pfs_x, n_run)
        else:
            cost, join = _fluid(cap, lanes, jobs, n_run, measured, base)
        if lanes >= n_jobs:
            done_all = cost
        if lanes <= n_run and elsewhere < join:  # waiting: a full width frees elsewhere first
            if kinds is None:
                cost = _fluid(cap, lanes, runs + [(x, el)] * behind, n_run, measured, base)[0]
            elif behind:  # (the job's class is among these jobs': the same classes)
                cost = _fluid_on(cap, n_run, works_x[:-1], cls_x[:-1], tops_x, pfs_x, n_run)[0]
            else:  # (the runs alone: their classes)
                cost = _fluid_on(cap, n_run, works, run_cls, tops, pfs, n_run)[0]
            cost += elsewhere + x / max(el.speedup.factor(el.max), 1e-9)
        if cost < best_cost - 1e-12 * cost:
            best_cost, best_lanes = cost, lanes
    return best_lanes


def _lanes_all_at_max(cap: float, top: float, lo: float, runs: list[tuple[float, Elasticity]],
                      x: float, el: Elasticity, kinds: _Kinds | None = None) -> int:
    """`_best_lanes` without `_fluid`, where it is sure (else -1): no one queued behind, no
    measured speedup, and the node's elastic capacity ``cap`` holds every job at its maximum
    at once. Then every lane count above the running ones runs every job at its maximum from
    now (the least sum there is: the first such count wins), and waiting costs exactly the
    delay until the first running job ends; that delay must clear `_fluid`'s tolerances
    (1e-9 of work per job) by a wide margin, or the exact path decides."""
    if lo <= 0.0 or not 0.0 <= x < math.inf:
        return -1
    total = el.max
    slowest = el.speedup.factor(el.max)
    if slowest <= 0.0:
        return -1
    if kinds is not None:
        need = el.max + kinds[4]  # every job at its maximum
        if need > cap * _SURELY_MORE:  # pragma: no mutate (a margin: see _SURELY_MORE)
            return -1  # (not sure, as the sum one by one below would find)
    cost = x / slowest
    first_end = math.inf
    for left, oel in runs:
        total += oel.max
        s = oel.speedup.factor(oel.max)
        if s <= 0.0 or not 0.0 <= left < math.inf:
            return -1
        d = left / s
        cost += d
        if d < first_end:
            first_end = d
        if s < slowest:
            slowest = s
    if total > cap * (1.0 - 1e-9):
        return -1
    n_run = len(runs)
    if n_run and not first_end > 1e-6 * (n_run + 1) * (1.0 + cost + first_end) / min(1.0, slowest):
        return -1
    for lanes in _lane_tries(cap, top, lo, n_run):
        if lanes > n_run:
            return lanes
    return -1


def _rounded(width: float, step: float, top: float) -> float:
    """A lane of ``width`` as `Elastic.plan` starts it: whole ``step``s where it spans one, at
    most ``top``."""
    if width >= step:  # pragma: no mutate (>: at a step, floor(1 + 1e-9) steps: the same)
        width = math.floor(width / step + 1e-9) * step
    return width if width < top else top  # pragma: no mutate (<=: equal, the same value)


def _no_wider_later(cap: float, top: float, lo: float, n_run: int, step: float) -> bool:
    """Whether a head beside the ``n_run`` elastic runs that share ``cap`` (none: False) would
    start no wider at the first of their ends, one lane each (``cap / n_run``), than now, one
    lane more (``cap / (n_run + 1)``, at least its minimum ``lo``), both as `Elastic.plan`
    rounds them (`_rounded`, at most ``top``): then waiting buys it no width."""
    if n_run <= 0:
        return False  # pragma: no mutate (None: as False to both callers)
    now = _rounded(cap / (n_run + 1), step, top)
    return now >= lo - 1e-9 and _rounded(cap / n_run, step, top) <= now + 1e-9  # pragma: no mutate (> and <: the tolerances' edges)


def _first(job: tuple[float, Elasticity]) -> float:
    return job[0]


# `_lanes_all_at_max`'s test that the runs' maximums summed per class surely exceed the node's
# elastic capacity: more than the sum one by one is tested against (1 - 1e-9 of it), by a margin
# far above their rounding difference. (A margin: any factor above that one answers the same,
# -1; one below it would differ only in a band of 1e-9 at the capacity.)
_SURELY_MORE = (1.0 - 1e-9) * (1.0 + 1e-9)  # pragma: no mutate


def _kinds_of(runs: list[tuple[float, Elasticity]]) -> _Kinds:
    cls, tops, pfs = _classes(runs)
    count = [0] * len(tops)
    for c in cls:
        count[c] += 1
    widest = 0.0  # (per class: to rounding, what the runs' maximums add up to one by one)
    for c in range(len(tops)):
        widest += count[c] * tops[c]
    return [w for w, _ in runs], cls, tops, pfs, widest


def _class_index(tops: list[float], pfs: list[float], top: float, pf: float) -> int:
    """The class of maximum ``top`` and parallel fraction ``pf`` among ``tops``/``pfs``; -1:
    none of them."""
    for i in range(len(tops)):
        if tops[i] == top and pfs[i] == pf:
            return i
    return -1  # pragma: no mutate (the caller asks only whether it is below 0)


def _fluid_on(cap: float, limit: int, works: list[float], job_cls: list[int], tops: list[float],
              pfs: list[float], n_run: int) -> tuple[float, float]:
    """`_fluid` without a measured speedup, on jobs already classed (`_classes`)."""
    if len(tops) == 1:
        return _fluid_one(cap, limit, works, n_run, tops[0], pfs[0])
    return _fluid_k(cap, limit, works, job_cls, tops, pfs, n_run, None, 0.0)


def _fluid(cap: float, lanes: int, jobs: list[tuple[float, Elasticity]], n_run: int,
           measured: NodeSpec | None = None, base: float = 0.0) -> tuple[float, float]:
    """``(sum of completion times, when the first queued job starts)`` of ``jobs`` (work at
    speed 1, elasticity) on ``cap`` CPU, at most ``lanes`` at once (never fewer than the
    first ``n_run``, which run already); the others start in order as lanes free. Those
    running share the CPU equally, each up to its maximum, the rest to the others (water
    filling), and run at their speedup's speed: a fluid model, times from now. On a node
    with a ``measured`` parallel speedup (``base`` cores held there by others), each job's
    maximum is its useful width there (`_useful`) and every speed is scaled by what the
    node's busy cores deliver (`_efficiency`).

    O(jobs x (classes + log jobs)) (issue 40): jobs of one class (the same maximum and
    parallel fraction) get the same width at every step, so they run at one speed; each
    class keeps the work its jobs have done since time 0 (``done``) and its jobs' ends: the
    work left of each plus ``done`` when it started (a job's work left is its end less the
    class's ``done``), kept sorted, so a step looks at each class, not at each job, and the
    water filling goes over the classes by maximum (a prefix of them capped at their maximum,
    the rest sharing what is left equally). The ends are plain floats, negated in an
    ascending list (the least end last: read and taken off in O(1), a start inserted by
    bisection and one memmove, cheap at the hundreds of jobs of a crowded node), not a heap of
    tuples: jobs with equal ends end at one step in any order."""
    limit = lanes if lanes > n_run else n_run
    works = [w for w, _ in jobs]
    job_cls, tops, pfs = _classes(jobs, measured, base)
    if len(tops) == 1 and measured is None:
        return _fluid_one(cap, limit, works, n_run, tops[0], pfs[0])
    return _fluid_k(cap, limit, works, job_cls, tops, pfs, n_run, measured, base)


def _classes(jobs: list[tuple[float, Elasticity]], measured: NodeSpec | None = None,
             base: float = 0.0) -> tuple[list[int], list[float], list[float]]:
    """`_fluid`'s classes of ``jobs``: (each job's class, each class's maximum -- its useful
    width where ``measured`` -- and parallel fraction), the classes numbered as they first
    appear."""
    cls_of_el: dict[int, int] = {}  # id of an elasticity -> its class (one lookup per job)
    cls_of: dict[tuple[float, float], int] = {}
    tops: list[float] = []  # per class: its maximum (its useful width where measured)
    pfs: list[float] = []  # per class: its parallel fraction (`Speedup.factor`, inlined)
    job_cls: list[int] = []
    for _, e in jobs:
        c = cls_of_el.get(id(e))
        if c is None:
            top = e.max
            if measured is not None:
                top = _useful(e, measured, base, e.max)
            key = (top, e.speedup.parallel_fraction)
            c = cls_of.get(key)
            if c is None:
                c = cls_of[key] = len(tops)
                tops.append(top)
                pfs.append(key[1])
            cls_of_el[id(e)] = c
        job_cls.append(c)
    return job_cls, tops, pfs


class _Class:
    """One class of `_fluid_k`'s jobs (the same maximum and parallel fraction): its maximum
    ``top``, parallel fraction ``pf``, the work each of its jobs has done since time 0
    (``done``), its speed at the current step, and its jobs' ends, negated, ascending. An
    object per class rather than parallel lists: compiled, its floats are fields, not boxed
    list items re-made at every step of a crowded node's model (issue 40)."""

    def __init__(self, top: float, pf: float) -> None:
        self.top = top
        self.pf = pf
        self.done = 0.0
        self.speed = 0.0
        self.ends: list[float] = []


def _top_of(cl: _Class) -> float:
    return cl.top


def _fluid_k(cap: float, limit: int, works: list[float], job_cls: list[int], tops: list[float],
             pfs: list[float], n_run: int, measured: NodeSpec | None,
             base: float) -> tuple[float, float]:
    """`_fluid`'s steps on jobs of work ``works`` and classes ``job_cls`` (`_classes`), at
    most ``limit`` running at once."""
    n = len(works)
    classes = [_Class(tops[c], pfs[c]) for c in range(len(tops))]
    by_top = sorted(classes, key=_top_of)  # the water filling's order (stable: ties as numbered)
    running = 0
    nxt = 0
    while nxt < n and running < limit:
        classes[job_cls[nxt]].ends.append(-works[nxt])
        running += 1
        nxt += 1
    for cl in classes:  # (one sort of the first jobs: the runs come shortest first, so
        cl.ends.sort()  # inserting each by bisection would put each at the front)
    join = 0.0 if n_run < nxt else math.inf
    t = cost = 0.0
    while running:
        # water filling over the classes by maximum: equal shares, each capped at its maximum
        room = cap
        left_n = running
        for cl in by_top:
            k = len(cl.ends)
            if not k:
                continue
            share = room / left_n
            top = cl.top
            w = top if top < share else share
            if w <= 0:  # `Speedup.factor(w)`
                cl.speed = 0.0
            elif w <= 1.0:
                cl.speed = w
            else:
                p = cl.pf
                cl.speed = 1.0 / ((1.0 - p) + p / w)
            room -= w * k
            left_n -= k
        if measured is not None:
            eff = _efficiency(measured, base + cap - room)
            for cl in by_top:
                cl.speed *= eff
        dt = math.inf
        for cl in by_top:
            v = cl.speed
            h = cl.ends
            if h and v > 0.0:
                d = (-h[-1] - cl.done) / v
                if d < dt:
                    dt = d
        if dt == math.inf:
            return math.inf, join
        t += dt
        tol = 1e-9 * (1.0 + t)
        for cl in by_top:
            h = cl.ends
            if not h:
                continue
            dc = cl.done + dt * cl.speed
            cl.done = dc
            while h and -h[-1] - dc <= tol:  # pragma: no mutate (the tolerance's edge)
                h.pop()
                cost += t
                running -= 1
        while running < limit and nxt < n:
            if nxt == n_run:
                join = t
            cl = classes[job_cls[nxt]]
            _insort(cl.ends, -(works[nxt] + cl.done))
            running += 1
            nxt += 1
    return cost, join


def _fluid_one(cap: float, limit: int, works: list[float], n_run: int, top: float,
               p: float) -> tuple[float, float]:
    """`_fluid` where every job is of one class (maximum ``top``, parallel fraction ``p``) and
    no speedup was measured: what a crowded node's plan weighs (issue 40: one kind of elastic
    test runs there). The same steps on the same numbers, so the same sums to the last bit:
    every running job has one width (an equal share of ``cap``, at most ``top``) and so one
    speed, and one ``done``; the ends (work left at the start plus ``done`` then) are a heap,
    least first, and the jobs with the least end within the tolerance end together."""
    n = len(works)
    ends: list[float] = []
    nxt = 0
    while nxt < n and nxt < limit:
        heapq.heappush(ends, works[nxt])
        nxt += 1
    running = nxt
    join = 0.0 if n_run < nxt else math.inf
    t = cost = done = 0.0
    while running:
        w = cap / running  # (the water filling: one class shares all of ``cap``)
        w = top if top < w else w
        if w <= 0:  # `Speedup.factor(w)`
            return math.inf, join
        speed = w if w <= 1.0 else 1.0 / ((1.0 - p) + p / w)
        dt = (ends[0] - done) / speed
        t += dt
        tol = 1e-9 * (1.0 + t)
        done += dt * speed
        while ends and ends[0] - done <= tol:  # pragma: no mutate (the tolerance's edge)
            heapq.heappop(ends)
            cost += t
            running -= 1
        while running < limit and nxt < n:
            if nxt == n_run:
                join = t
            heapq.heappush(ends, works[nxt] + done)
            running += 1
            nxt += 1
    return cost, join


def _el_rank(rec: ActionRecord) -> int:
    return rec.el_rank


def _floor_of(rec: ActionRecord, floor: float) -> float:
    """How far a reclaim may shrink elastic ``rec``: ``floor`` within its range."""
    if floor <= rec.el_min:  # pragma: no mutate (<: at equality floor is el_min)
        return rec.el_min
    return floor if floor < rec.el_max else rec.el_max  # pragma: no mutate (<=: the same)


def _gain(rec: ActionRecord, step: float) -> float:
    """Weighted drop of expected remaining time from one more ``step`` of the elastic dim."""
    el = rec.spec.elasticity
    assert el is not None and rec.allotment is not None
    k = rec.width  # (its allotment in ``el.dim``)
    work = rec.est  # seconds at one unit of speed (the estimate is at speed 1)
    sp = el.speedup
    now_t = work / max(sp.factor(k), 1e-9)
    next_t = work / max(sp.factor(min(el.max, k + step)), 1e-9)
    return (now_t - next_t) * rec.spec.weight


def _efficiency(spec: NodeSpec, busy: float) -> float:
    """What each allotted core of a node delivers while ``busy`` cores are allotted there:
    its measured ``parallel_speedup`` over ``busy`` (`NodeSpec.parallel_cores`); 1.0 up to one
    busy core or where nothing was measured."""
    if busy <= 1.0 or not spec.parallel_speedup:
        return 1.0
    return spec.parallel_cores(busy) / busy


def _useful(el: Elasticity, spec: NodeSpec, base: float, top: float) -> float:
    """The widest allotment of ``el`` up to ``top`` worth its cores on ``spec`` (``base``
    cores held there by others): whole cores from its minimum while the action's speedup
    times the node's efficiency (`_efficiency`) still grows. Where a second busy core adds
    little (hyperthreads, a loaded machine), an elastic action is better off narrow."""
    best = el.min
    best_v = el.speedup.factor(best) * _efficiency(spec, base + best)
    w = math.floor(best) + 1.0
    while w <= top + 1e-9:
        v = el.speedup.factor(w) * _efficiency(spec, base + w)
        if v <= best_v * (1.0 + 1e-9):
            break
        best, best_v = w, v
        w += 1.0
    return best
