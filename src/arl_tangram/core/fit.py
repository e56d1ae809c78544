"""Best fit: does a demand fit a node, how much is left, and which candidate fits best.

Invariant: `leftover` is the one statement of the fit rule -- -1.0 when a demand does not fit
the node's free capacity (`NodeState.fits`: no dimension short by more than 1e-9), else the
largest fraction of the node's capacity left free in any demanded dimension -- and `best_fit`
the one scan: among candidates in their given order, the first with the least ``(not warm,
leftover)``. Placement (`placement.Placer`) calls them for warm nodes, the free index's
buckets and a few freed nodes alike. `tests/core/test_placement_fastpath.py` holds them to the
plain definition.
"""

from __future__ import annotations

import math

from .records import NodeState

# A scan with no bound on how many candidates it looks at.
UNBOUNDED = 1 << 62


def leftover(node: NodeState, shape: tuple[tuple[str, float], ...]) -> float:
    """-1.0 when ``shape`` does not fit the node's free capacity (`NodeState.fits`), else its
    leftover: the largest fraction of capacity left free in any demanded dimension (>= 0)."""
    worst = 0.0
    free, cap = node.free, node.cap
    for k, v in shape:
        f = free.get(k, 0.0)
        if v > f + 1e-9:
            return -1.0
        c = cap.get(k, 0.0)
        if c > 0:
            x = (f - v) / c
            if x > worst:
                worst = x
    return worst


def best_fit(groups: list[dict[str, None]], nodes: dict[str, NodeState], reserved: dict[str, str],
             shape: tuple[tuple[str, float], ...], enough: int, most: int,
             warm_key: str) -> NodeState | None:
    """The best fit among the candidates ``groups`` names (in order, each group an
    insertion-ordered set of node names): of the first ``enough`` alive, unreserved nodes that
    fit, among the first ``most`` names, the first with the least ``(not warm for warm_key,
    leftover)``; with ``warm_key`` empty, the least leftover. None when none fits."""
    best: NodeState | None = None
    best_w, best_left = 2, math.inf
    found = seen = 0
    for group in groups:
        for name in group:
            seen += 1
            if seen > most:
                return best
            if name in reserved:
                continue
            node = nodes[name]
            if not node.alive:
                continue
            left = leftover(node, shape)
            if left < 0.0:
                continue
            w = 0 if warm_key and node.warm.get(warm_key) else 1
            if w < best_w or (w == best_w and left < best_left):
                best, best_w, best_left = node, w, left
            found += 1
            if found >= enough:
                return best
    return best


def fits_besides_cpu(node: NodeState, shape: tuple[tuple[str, float], ...]) -> bool:
    """Whether ``node``'s free capacity fits ``shape`` in every dimension but CPU (an elastic
    action's CPU stretches: elastic.py decides it)."""
    free = node.free
    return all(k == "cpu" or v <= free.get(k, 0.0) + 1e-9 for k, v in shape)
