"""Best-fit arithmetic of placement, unrolled where it runs per candidate node.

Invariant: every function here answers exactly what `_fit_leftover` answers, node by node --
-1.0 when a demand does not fit the node's free capacity (`NodeState.fits`: no dimension short
by more than 1e-9), else the largest fraction of the node's capacity left free in any demanded
dimension -- and the scans keep the first node, in their given order, with the least leftover.
`tests/core/test_placement_fastpath.py` and `test_speedups.py` hold them to it.
"""

from __future__ import annotations

import math

from .records import NodeState


def _best_warm2(ws: dict[str, None], nodes: dict[str, NodeState], reserved: dict[str, str],
                shape: tuple[tuple[str, float], ...], enough: int, most: int) -> NodeState | None:
    """`_find_node`'s scan of warm nodes for a two-dimensional demand, unrolled: the first
    alive, unreserved node with the least `_fit_leftover` among the first ``enough`` that fit
    of the first ``most`` of ``ws`` (same arithmetic, same order)."""
    (k1, v1), (k2, v2) = shape
    # f >= v + 1e-9 implies not (v > f + 1e-9): the exact test of `fits` runs only below that
    n1, n2 = v1 + 1e-9, v2 + 1e-9
    best: NodeState | None = None
    best_left = math.inf
    found = seen = 0
    for name in ws:
        seen += 1
        if seen > most:
            break
        node = nodes[name]
        if not node.alive or (reserved and name in reserved):
            continue
        free = node.free
        f1 = free.get(k1, 0.0)
        if f1 < n1 and v1 > f1 + 1e-9:
            continue
        f2 = free.get(k2, 0.0)
        if f2 < n2 and v2 > f2 + 1e-9:
            continue
        cap = node.cap
        c1 = cap.get(k1, 0.0)
        c2 = cap.get(k2, 0.0)
        x1 = (f1 - v1) / c1 if c1 > 0 else 0.0
        x2 = (f2 - v2) / c2 if c2 > 0 else 0.0
        left = x1 if x1 > x2 else x2
        if left < 0.0:
            left = 0.0
        if left < best_left:
            best, best_left = node, left
        found += 1
        if found >= enough:
            return best
    return best


def _scan_index2(levels: list[int], buckets: dict[int, dict[str, None]],
                 nodes: dict[str, NodeState], reserved: dict[str, str],
                 shape: tuple[tuple[str, float], ...], enough: int) -> NodeState | None:
    """`_find_node`'s index scan for a two-dimensional demand when no candidate is warm: the
    first of the least `_fit_leftover` among the first ``enough`` nodes that fit (same order,
    same arithmetic as the loop it replaces)."""
    (k1, v1), (k2, v2) = shape
    best: NodeState | None = None
    best_left = math.inf
    found = 0
    for lv in levels:
        for name in buckets[lv]:
            if name in reserved:
                continue
            node = nodes[name]
            free = node.free
            f1 = free.get(k1, 0.0)
            if v1 > f1 + 1e-9:
                continue
            f2 = free.get(k2, 0.0)
            if v2 > f2 + 1e-9:
                continue
            cap = node.cap
            c1 = cap.get(k1, 0.0)
            c2 = cap.get(k2, 0.0)
            x1 = (f1 - v1) / c1 if c1 > 0 else 0.0
            x2 = (f2 - v2) / c2 if c2 > 0 else 0.0
            left = x1 if x1 > x2 else x2
            if left < 0.0:
                left = 0.0
            if left < best_left:
                best, best_left = node, left
            found += 1
            if found >= enough:
                return best
    return best


def _fit_leftover(node: NodeState, shape: tuple[tuple[str, float], ...]) -> float:
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


def _fits_besides_cpu(node: NodeState, shape: tuple[tuple[str, float], ...]) -> bool:
    """Whether ``node``'s free capacity fits ``shape`` in every dimension but CPU (an elastic
    action's CPU stretches: elastic.py decides it)."""
    free = node.free
    return all(k == "cpu" or v <= free.get(k, 0.0) + 1e-9 for k, v in shape)
