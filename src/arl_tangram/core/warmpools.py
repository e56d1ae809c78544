"""Warm pools (tangram, fifo): how many warm executors each node keeps per warm key.

Invariant: `sent` is exactly the last target sent per (node, key) in a ResizeWarmPool; a
spread over the same CPU nodes (`cpu_names`, dropped with `spread_want` whenever a node comes or
goes: `nodes_changed`) sends only the targets that differ from the last spread's. Targets follow
arrival rates: at once up on a burst, slowly down (`targets`).
"""

from __future__ import annotations

import math
from collections import deque

from .commands import ResizeWarmPool
from .records import NodeState
from .resources import CPU
from .state import CoreState


class WarmPools:
    """Arrival rates per warm key, and the warm-pool targets sent for them."""

    def __init__(self, st: CoreState) -> None:
        self.st = st
        self.on = st.policy.warm_pools
        self.arrivals: dict[str, int] = {}  # per warm key, arrivals since the last Tick
        self.recent_arrivals: dict[str, deque[float]] = {}  # per key, within one cold start
        self.window_peaks: dict[str, float] = {}  # per key, the most of those seen (decaying)
        self.rates: dict[str, float] = {}  # per key, the smoothed arrival rate
        self.rate_peaks: dict[str, float] = {}  # per key, the highest tick rate, decaying
        self.last_rate_time: float | None = None  # the last Tick that sized warm pools
        self.sent: dict[tuple[str, str], int] = {}  # (node, key) -> target last sent
        self.cpu_names: list[str] | None = None  # CPU nodes pools spread over (None: recompute)
        self.spread_want: dict[str, int] = {}  # key -> executors last spread over `cpu_names`

    def nodes_changed(self) -> None:
        self.cpu_names = None
        self.spread_want.clear()

    def cpu_nodes(self) -> list[str]:
        """The alive nodes with CPU (cached until a node comes or goes)."""
        names = self.cpu_names
        if names is None:
            names = [n.name for n in self.st.nodes.values() if n.alive and n.cap.get(CPU, 0.0) > 0]
            self.cpu_names = names
        return names

    def arrived(self, key: str) -> None:
        """An action of warm key ``key`` arrived (outside sessions and models)."""
        arrivals = self.arrivals
        arrivals[key] = arrivals.get(key, 0) + 1
        self.note_burst(key)
        if key not in self.rates:  # a new key: its pools start filling now, not at a Tick
            rate = 1.0 / self.st.config.rate_window_s
            self.rates[key] = rate
            self.spread(key, rate)

    def note_burst(self, key: str) -> None:
        """Count an arrival of warm key ``key`` in the last cold-start time (`sandbox_cold_s`);
        keep the most seen (`window_peaks`): a burst faster than a pool refills."""
        st = self.st
        dq = self.recent_arrivals.get(key)
        if dq is None:
            dq = self.recent_arrivals[key] = deque()
        now = st.now
        cold = st.config.sandbox_cold_s
        dq.append(now)
        cut = now - cold
        while dq[0] < cut:
            dq.popleft()
        n = float(len(dq))
        if n > self.window_peaks.get(key, 0.0):
            self.window_peaks[key] = n
            # a burst beyond what the pools were sized for: refill toward it now, not at a Tick
            rate = n / max(cold, 1e-9)
            if self.spread_want.get(key, 0) < math.ceil(rate * cold * 2):
                known = self.rate_peaks.get(key, 0.0)
                self.spread(key, rate if rate > known else known)

    def targets(self) -> None:
        """Size warm pools from arrival rates (at a Tick): enough warm executors to absorb the
        arrivals of two cold-start times at the recent peak rate (the highest tick's rate, or
        the most arrivals seen within one cold-start time -- a burst shorter than a tick --
        both decaying over `peak_memory_s`, or the smoothed rate when higher: pools follow a
        burst at once and shrink slowly), and at least ``min_warm_per_node`` per node for every
        key still in use, spread over the CPU nodes."""
        cfg = self.st.config
        last, now = self.last_rate_time, self.st.now
        if last is None or now <= last:
            self.last_rate_time = now if last is None else last
            return
        dt = now - last
        self.last_rate_time = now
        a = min(1.0, dt / cfg.rate_window_s)
        b = min(1.0, dt / cfg.peak_memory_s)
        counts, self.arrivals = self.arrivals, {}
        peaks, rates, windows = self.rate_peaks, self.rates, self.window_peaks
        for key in sorted(set(counts) | set(rates)):
            burst = counts.get(key, 0) / dt
            rate = rates.get(key, 0.0) * (1 - a) + a * burst
            rates[key] = rate
            peak = peaks.get(key, 0.0) * (1 - b)  # the recent peak, forgotten over `peak_memory_s`
            if burst > peak:
                peak = burst
            peaks[key] = peak
            window = windows.get(key, 0.0)
            if window > 0.0:
                windows[key] = window * (1 - b)
                within = window / max(cfg.sandbox_cold_s, 1e-9)  # as a rate
                if within > peak:
                    peak = within
            self.spread(key, peak if peak > rate else rate)

    def boot(self) -> None:
        """At the first event: warm pools for the keys the operator named (`warm_keys`), as a
        static stack provisions its sandboxes before the first action."""
        if not self.on:
            return
        for key in self.st.config.warm_keys:
            self.rates.setdefault(key, 0.0)
            self.spread(key, 0.0)

    def spread(self, key: str, rate: float) -> None:
        """Send the warm-pool targets of ``key`` for an arrival ``rate`` (per second); a
        named key keeps at least its `warm_boot` count over the cluster."""
        names = self.cpu_nodes()
        if not names:
            return
        st = self.st
        cfg = st.config
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
        done = self.spread_want
        old = done.get(key)
        if old == want:
            return  # same targets on the same nodes as last time: all sent already
        done[key] = want
        sent = self.sent
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
            cap = fixed if fixed is not None else warm_cap(st.nodes[name])
            if t > cap:
                t = cap  # min(cap, want // n + (1 if i < want % n else 0))
            if sent.get((name, key), 0) != t:
                sent[(name, key)] = t
                st.out.append(ResizeWarmPool(name, key, t, cause=st.cause))


def warm_cap(node: NodeState) -> int:
    """Most warm executors per key on ``node`` (`CoreConfig.max_warm_per_node` None): eight
    per core, at least 16."""
    c = int(8 * node.cap.get(CPU, 0.0))
    return c if c > 16 else 16
