"""Session memory that follows use (issue 26): charges by measured use, eviction when short.

A session's sandbox holds memory between its actions, and that memory moves: an SWE session sits
at a few tens of MB and bursts to ~0.5 GB while pytest runs (AgentCgroup, arXiv 2602.09345: a
15.4x peak-to-average ratio). Charging every session its cap on its node wastes most of the
node; charging its use lets a node hold more sessions than their caps allow, with two bounds:

- charge: once its node reported it (`MemoryReport`), a session is charged
  ``max(recent peak x session_memory_headroom, session_memory_floor_mb)`` of memory, rounded up
  to `GRAIN_MB` and at most its demand (its cgroup's memory.max, which stays its demand, so it
  can still burst that far); before its first report, its demand. A charge that grows takes only
  what is free on the node (the core never allocates a node past its capacity; a node that runs
  short is what the watermark is for).
- admission: a new session opens only where its caps and those of the sessions there stay
  within ``session_memory_overcommit`` x the node's memory (`Sessions.caps_fit`), besides the
  usual room by charges.
- shortage: a node whose measured use now (its sessions' ``current_mb`` and ``other_mb``) is
  above ``memory_high_watermark`` x its memory evicts idle sessions (no action of theirs
  starting or running; those with no queued action first), largest use first, until the use left
  is under the watermark. A session with an action running is never evicted (its cgroup cap
  bounds it; the kernel's OOM killer inside that cap is the last resort). An evicted session is
  closed, its state lost; its queued actions fail and its next action is rejected, both with the
  reason ("session S was evicted: node N ran short of memory (used U of C MB)").

The simulator reports no memory, so nothing here runs in simulation and its decisions are those
of charging demands.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from .actions import Status
from .events import MemoryReport
from .records import NodeState, SessionRecord
from .resources import MEMORY_MB
from .sessions import Sessions
from .state import CoreState

GRAIN_MB = 16.0  # charges move in steps of this much (fewer changes of a node's free memory)
EVICTED_KEPT = 10_000  # evicted sessions remembered for their next action (oldest forgotten)
_BUSY = (Status.STARTING, Status.RUNNING)


class SessionMemory:
    """Recharges sessions by their measured memory and picks whom a short node evicts."""

    def __init__(self, st: CoreState, sessions: Sessions) -> None:
        self.st = st
        self.sessions = sessions
        cfg = st.config
        self.headroom = cfg.session_memory_headroom
        self.floor_mb = cfg.session_memory_floor_mb
        self.watermark = cfg.memory_high_watermark
        # session id -> why it was evicted, for its next action (at most `EVICTED_KEPT`)
        self.evicted: OrderedDict[str, str] = OrderedDict()
        self.evictions = 0
        self.reports = 0

    def report(self, e: MemoryReport) -> tuple[str | None, list[tuple[SessionRecord, str]]]:
        """Take a node's report: recharge its sessions. Returns what changed, for the core to
        act on: the node, when recharging freed capacity there (else None), and the idle
        sessions to evict, with why."""
        node = self.st.nodes.get(e.node)
        if node is None or not node.alive:
            return None, []
        self.reports += 1
        sessions = self.st.sessions
        changed = False
        for sid, peak in e.peak_mb.items():
            sess = sessions.get(sid)
            if sess is None or sess.node != node.name:
                continue
            sess.peak_mb = float(peak)
            changed |= self._recharge(node, sess)
        grew = None
        if changed and node.alive:
            self.st.index.update(node.name, node.free)
            grew = node.name
        return grew, self._short(node, e)

    def _recharge(self, node: NodeState, sess: SessionRecord) -> bool:
        cap = sess.demand.get(MEMORY_MB)
        if cap <= 0.0 or sess.peak_mb < 0.0:
            return False
        want = max(sess.peak_mb * self.headroom, self.floor_mb)
        want = min(cap, GRAIN_MB * math.ceil(want / GRAIN_MB - 1e-9))
        old = sess.charge.get(MEMORY_MB)
        if want > old:  # grows only into what is free
            want = min(want, old + max(0.0, node.free.get(MEMORY_MB, 0.0)))
        if abs(want - old) < 1e-9:
            return False
        new = sess.demand.with_amount(MEMORY_MB, want)
        held = self.sessions.held
        held[node.name] = held[node.name] - sess.charge + new
        node.give(sess.charge)
        node.take(new)
        sess.charge = new
        return True

    def _short(self, node: NodeState, e: MemoryReport) -> list[tuple[SessionRecord, str]]:
        """The idle sessions a node above its watermark evicts (see the module's doc)."""
        cap = node.cap.get(MEMORY_MB, 0.0)
        if cap <= 0.0:
            return []
        sessions, actions = self.st.sessions, self.st.actions
        cur = e.current_mb
        used = float(e.other_mb) + sum(float(cur.get(sid, 0.0)) for sid in node.sessions)
        limit = self.watermark * cap
        if used <= limit:
            return []
        idle: list[tuple[bool, float, str]] = []
        for sid in node.sessions:
            sess = sessions.get(sid)
            if sess is None:
                continue
            recs = [actions[a] for a in sess.actions if a in actions]
            if any(r.status in _BUSY for r in recs):
                continue
            idle.append((bool(recs), -float(cur.get(sid, 0.0)), sid))
        idle.sort()
        out: list[tuple[SessionRecord, str]] = []
        left = used
        for _, neg, sid in idle:
            if left <= limit:
                break
            reason = (f"session {sid} was evicted: node {node.name} ran short of memory "
                      f"(used {used:.0f} of {cap:.0f} MB)")
            out.append((sessions[sid], reason))
            left += neg
            self.evicted[sid] = reason
            self.evictions += 1
        while len(self.evicted) > EVICTED_KEPT:
            self.evicted.popitem(last=False)
        return out
