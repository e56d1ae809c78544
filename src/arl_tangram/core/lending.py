"""Lent CPU taken back at once (issue 41 item 3; docs/core.md, "Tenants' fair share").

With tenants' shares (`CoreConfig.tenant_shares`) the pass is work-conserving: a tenant's idle
share is lent to the others. Without this module a tenant whose work arrives waits for a lent
core to come back, i.e. for one of the borrower's running actions to end (Parekh and
Gallager's one-largest-job term of a non-preemptive server): a `print(1)` behind one-second
loops waited the rest of a loop. Here the share comes back at once, by time-slicing, not by
preemption: the borrower's running CPU actions on a node are *squeezed* -- their CPU quota
(the cgroup's ``cpu.max``, through a `ResizeAction`) lowered, never below
`CoreConfig.lend_floor` of their demand -- until the newcomer fits, and it starts at its full
demand. The kernel's CFS bandwidth control then runs both: the squeezed actions go on, slower
(processor sharing, as generalized processor sharing prescribes), nothing is killed, frozen
or re-run, and the node's quotas never sum past its cores (no overcommit: the node's account
stays exact). As capacity frees on a node, its squeezed actions grow back first (the least
expected work left first: SRPT), before the pass starts anything new there.

Who may take back, and from whom (GPS's guarantee among the tenants holding CPU, with DRF's
dominant share): with ``W`` the weights of the tenants holding CPU now plus the one asking,
tenant ``t`` is entitled to ``w_t / W`` of the cluster. A queue head of ``t`` that does not
fit is *owed* when ``t``'s dominant share with it (its largest fraction of the alive capacity
in any dimension) stays within that; it may then take CPU from tenants holding more than
``w / W`` of the CPUs, at most that excess, and only from their running, rigid, whole-demand CPU
actions (an elastic action lends by its own rule, `elastic.reclaim`; an action admitted by its
measured use holds a charge, not its quota; partitioned and model work is not squeezed). Its
own actions are never squeezed for it. Memory does not stretch: the node must fit the rest of
its demand as it is.

Anticipation (Iyer and Druschel, SOSP 2001: after a synchronous client's request completes, the
disk waits a few milliseconds for its next one before serving another): a tenant sending one
action after the other's answer (a trajectory's tool calls) would otherwise pay a regrowth at
each end and a squeeze at each start. With `CoreConfig.lend_anticipation_s` > 0, the CPU an
action started on taken-back CPU frees at its end is *held* for its tenant on that node (while
the node has squeezed actions) for that long: her next owed action there starts on it with
nothing squeezed; when the hold runs out (a `WakeAt`), the squeezed actions grow back into it.
A hold costs the borrowers at most that long of the held cores per hold.
"""

from __future__ import annotations

from .commands import ResizeAction, WakeAt
from .fit import fits_besides_cpu
from .placement import Placer
from .records import ActionRecord, NodeState
from .resources import CPU
from .state import CoreState

_EPS = 1e-9


class Lending:
    """The squeezed actions of each node, what they were last sent, and the two moves: take a
    tenant's share back for a queue head (`take_back`), grow squeezed actions back as
    capacity frees (`regrow`)."""

    def __init__(self, st: CoreState, placer: Placer) -> None:
        self.st = st
        self.placer = placer
        self.floor = st.config.lend_floor
        # node -> action id -> record, for actions running below their demand's CPU
        self.squeezed: dict[str, dict[str, ActionRecord]] = {}
        # action id -> its CPU quota before it was first squeezed (what it grows back to), and
        # the quota last sent for it (its StartAction's, then its ResizeActions')
        self.full: dict[str, float] = {}
        self.sent: dict[str, float] = {}
        # actions whose allotment changed in this event (their ResizeActions go out at flush)
        self.changed: dict[str, ActionRecord] = {}
        # where in this event's commands the first action started on squeezed CPU is: the
        # lowered quotas go out before it (-1: none this event)
        self.at = -1
        self.taken_back = 0  # heads started on squeezed CPU (stats)
        # anticipation: the actions started on taken-back CPU (their end may hold it), and each
        # node's hold: (the node, the tenant it is held for, cores, until)
        self.window = st.config.lend_anticipation_s
        self.started: set[str] = set()
        self.holds: dict[str, tuple[NodeState, str, float, float]] = {}
        self.wake: set[str] = set()  # nodes held in this event: their WakeAt goes out at flush

    # ---- entitlements ---------------------------------------------------------------------------
    def _weights(self, tenant: str) -> float:
        """``W``: the weights of the tenants holding CPU now, and of ``tenant``."""
        st = self.st
        w = st.tenant_weight(tenant)
        for t, use in st.tenant_use.items():
            if t != tenant and use.get(CPU, 0.0) > _EPS:
                w += st.tenant_weight(t)
        return w

    def owed(self, rec: ActionRecord) -> bool:
        """Whether queued ``rec`` may take its tenant's share back: a rigid CPU action whose
        tenant's dominant share with it (DRF: its largest fraction of the alive capacity in
        any dimension) stays within its entitlement ``w_t / W``."""
        if not self.floor < 1.0 or rec.spec.elasticity is not None or rec.is_model or rec.cpu <= _EPS:
            return False
        st = self.st
        total = st.total()
        use = st.tenant_use.get(rec.tenant)
        top = 0.0
        for k, v in rec.shape:
            c = total.get(k, 0.0)
            if c > 0.0:
                f = ((use.get(k, 0.0) if use else 0.0) + v) / c
                if f > top:
                    top = f
        if use:
            for k, v in use.items():
                c = total.get(k, 0.0)
                if c > 0.0 and v / c > top:
                    top = v / c
        return top <= st.tenant_weight(rec.tenant) / self._weights(rec.tenant) + _EPS

    def _budgets(self, tenant: str) -> dict[str, float]:
        """Tenant -> the CPU it holds above its entitlement (only those above), as ``tenant``
        asks."""
        st = self.st
        total = st.total().get(CPU, 0.0)
        w = self._weights(tenant)
        out: dict[str, float] = {}
        for t, use in st.tenant_use.items():
            if t == tenant:
                continue
            excess = use.get(CPU, 0.0) - total * st.tenant_weight(t) / w
            if excess > _EPS:
                out[t] = excess
        return out

    def _lendable(self, node: NodeState, budgets: dict[str, float]) -> list[tuple[float, int, ActionRecord, float]]:
        """The running actions of ``node`` that may be squeezed, as (-work left, seq, record,
        CPU it can give): the most expected work left first (the shortest keep their cores)."""
        st = self.st
        now = st.now
        floor = self.floor
        got: list[tuple[float, int, ActionRecord, float]] = []
        for aid in node.running:
            rec = st.actions.get(aid)
            if (rec is None or rec.tenant not in budgets or rec.spec.elasticity is not None
                    or rec.charge is not None or rec.partition is not None or rec.batch is not None
                    or rec.allotment is None):
                continue
            k = rec.allotment.get(CPU)
            give = k - floor * self.full.get(aid, k)
            if give > _EPS:
                left = rec.est - (now - (rec.start_time if rec.start_time is not None else now))
                got.append((-left, rec.seq, rec, give))
        got.sort(key=_order)
        return got

    # ---- taking back ------------------------------------------------------------------------------
    def take_back(self, rec: ActionRecord, nodes: list[NodeState], warm: bool) -> bool:
        """Start owed ``rec`` on one of ``nodes`` by squeezing lenders' actions there: the node
        where it fits with the least taken (most CPU free), ties to the first; False, nothing
        changed, when none can make room. ``warm``: a shared-pool action (a warm executor if
        one is there), else a session's (its sandbox is there)."""
        budgets = self._budgets(rec.tenant)
        if not budgets and not any(h[1] == rec.tenant for h in self.holds.values()):
            return False
        best: NodeState | None = None
        best_free = -1.0
        best_lend: list[tuple[float, int, ActionRecord, float]] = []
        reserved = self.st.reserved
        need = rec.cpu
        for node in nodes:
            if not node.alive or node.name in reserved or not fits_besides_cpu(node, rec.shape):
                continue
            free = node.free.get(CPU, 0.0)
            hold = self.holds.get(node.name) if self.holds else None
            if hold is not None and hold[1] == rec.tenant:
                free += hold[2]
            if free <= best_free:
                continue
            lend = self._lendable(node, budgets)
            room = free
            left = dict(budgets)
            for _, _, r, give in lend:
                g = min(give, left[r.tenant])
                if g > _EPS:
                    room += g
                    left[r.tenant] -= g
            if room + _EPS >= need:
                best, best_free, best_lend = node, free, lend
        if best is None:
            return False
        mine = self.holds.get(best.name) if self.holds else None
        unheld = mine is not None and mine[1] == rec.tenant
        if unheld:  # (held for this tenant: counted above; another's hold stays its)
            self._unhold(best.name)
        short = need - best_free
        left = budgets
        st = self.st
        for _, _, r, give in best_lend:
            if short <= _EPS:
                break
            d = min(give, left[r.tenant], short)
            if d <= _EPS:
                continue
            left[r.tenant] -= d
            short -= d
            self._set(r, best, r.allotment.get(CPU) - d if r.allotment is not None else 0.0)
        st.index.update(best.name, best.free)
        if self.at < 0:
            self.at = len(st.out)
        if warm:
            self.placer.start_warm(rec, best)
        else:
            self.placer.start(rec, best, rec.spec.demand, True)
        rec.note(st.now, "started on CPU its tenant's share took back", st.cause)
        self.taken_back += 1
        if self.window > 0.0:
            self.started.add(rec.spec.id)
        if unheld:
            self.regrow({best.name})  # (what of the hold it did not need: squeezed ones first)
        return True

    def _set(self, rec: ActionRecord, node: NodeState, cpu: float) -> None:
        """Give ``rec`` (running on ``node``) ``cpu`` cores, its node and tenant accounts with
        it."""
        st = self.st
        assert rec.allotment is not None
        k = rec.allotment.get(CPU)
        aid = rec.spec.id
        full = self.full.get(aid)
        if full is None:  # (first squeezed: its quota was what its StartAction carried)
            full = self.full[aid] = self.sent[aid] = k
        delta = cpu - k
        if delta > 0.0:
            node.take({CPU: delta})
        else:
            node.give({CPU: -delta})
        if st.fair:
            st.tenant_take(rec.tenant, {CPU: abs(delta)}, 1.0 if delta > 0.0 else -1.0)
        rec.allot(rec.allotment.with_amount(CPU, cpu))
        sq = self.squeezed.get(node.name)
        if cpu < full - _EPS:
            if sq is None:
                sq = self.squeezed[node.name] = {}
            sq[aid] = rec
        elif sq is not None:
            sq.pop(aid, None)
            if not sq:
                del self.squeezed[node.name]
        self.changed[aid] = rec
        rec.note(st.now, f"cpu quota -> {cpu:.6g} (lent CPU taken back)" if delta < 0.0
                 else f"cpu quota -> {cpu:.6g} (grown back)", st.cause)

    # ---- growing back -----------------------------------------------------------------------------
    def regrow(self, names: set[str]) -> None:
        """Nodes ``names`` freed capacity: their squeezed actions take it back first, the least
        expected work left first (SRPT), each up to its demand."""
        st = self.st
        now = st.now
        for name in sorted(names & self.squeezed.keys()) if len(names) > 1 else names & self.squeezed.keys():
            node = st.nodes[name]  # (alive: a lost node's actions were released, and forgotten)
            free = node.free.get(CPU, 0.0)
            if free <= _EPS:
                continue
            recs = sorted(self.squeezed[name].values(),
                          key=lambda r: (r.est - (now - (r.start_time if r.start_time is not None else now)), r.seq))
            for r in recs:
                if free <= _EPS:
                    break
                assert r.allotment is not None
                k = r.allotment.get(CPU)
                d = min(self.full[r.spec.id] - k, free)
                free -= d
                self._set(r, node, k + d)
            st.index.update(name, node.free)

    def released(self, rec: ActionRecord) -> bool:
        """``rec`` ended (or left its node): forget it. Whether it had started on taken-back CPU
        (with anticipation: what it frees may be held, `hold`)."""
        aid = rec.spec.id
        sq = self.squeezed.get(rec.node or "")
        if sq is not None and sq.pop(aid, None) is not None and not sq:
            del self.squeezed[rec.node or ""]
        self.full.pop(aid, None)
        self.sent.pop(aid, None)
        self.changed.pop(aid, None)
        was = aid in self.started
        self.started.discard(aid)
        return was

    # ---- anticipation ---------------------------------------------------------------------------
    def hold(self, rec: ActionRecord, node: NodeState) -> None:
        """``rec``, started on taken-back CPU, gave its allotment back to ``node``: while
        ``node`` has squeezed actions, its CPU stays held for its tenant for the window (taken
        from the node's free CPU, so that neither the regrowth nor the pass uses it). A hold
        of another tenant's there is given back first."""
        st = self.st
        name = node.name
        if not node.alive or name not in self.squeezed or rec.allotment is None:
            return
        cpu = rec.allotment.get(CPU)  # (just given back: free; owed, so above zero)
        held = 0.0
        old = self.holds.get(name)
        if old is not None:
            if old[1] == rec.tenant:
                held = old[2]
            else:
                self._unhold(name)
        node.take({CPU: cpu})
        until = st.now + self.window
        self.holds[name] = (node, rec.tenant, held + cpu, until)
        rec.note(st.now, f"{cpu:.6g} cpu held for its tenant until {until:.6g} (anticipation)",
                 st.cause)
        self.wake.add(name)

    def _unhold(self, name: str) -> None:
        """Give ``name``'s hold back to its node (alive: a lost node's hold went with it)."""
        node, _, cpu, _ = self.holds.pop(name)
        st = self.st
        node.give({CPU: cpu})
        st.index.update(name, node.free)
        st.dirty.add(name)

    def expire(self, now: float) -> None:
        """Holds whose window ran out go back to their nodes (the squeezed actions there grow
        back in the pass that follows)."""
        for name in [n for n, h in self.holds.items() if h[3] <= now]:
            self._unhold(name)

    def emit(self) -> None:
        """The ResizeActions of this event: one per action whose quota now differs from the one
        it was last sent (a squeeze and a regrowth in one event cancel out); lowered quotas
        before the first action started on them (the lender slows before the newcomer runs),
        raised ones at the end; then a WakeAt for each hold made in this event and still held."""
        st = self.st
        lowered: list[ResizeAction] = []
        for aid, rec in self.changed.items():  # (each running: an ended one left `changed`)
            assert rec.allotment is not None and rec.node is not None
            cpu = rec.allotment.get(CPU)
            last = self.sent[aid]
            if abs(cpu - self.full[aid]) <= _EPS and (rec.node not in self.squeezed
                                                      or aid not in self.squeezed[rec.node]):
                del self.full[aid], self.sent[aid]  # (whole again: forgotten once sent)
            else:
                self.sent[aid] = cpu
            if abs(cpu - last) <= _EPS:
                continue
            cmd = ResizeAction(aid, rec.node, rec.allotment, cause=st.cause)
            if cpu < last and self.at >= 0:
                lowered.append(cmd)
            else:
                st.out.append(cmd)
        if lowered:
            st.out[self.at:self.at] = lowered
        self.changed.clear()
        self.at = -1
        if self.wake:  # (a hold her next action took in the same event needs no wake)
            for name in sorted(self.wake):
                hold = self.holds.get(name)
                if hold is not None:
                    st.out.append(WakeAt(hold[3], st.cause))
            self.wake.clear()


def _order(e: tuple[float, int, ActionRecord, float]) -> tuple[float, int]:
    return (e[0], e[1])
