"""The four scheduling policies, as data the one core consults (same code path for all).

Invariant: a policy decides only *order* (`priority`), *where an action may go*
(`partition_of` and the partitions `split` computes) and *which mechanisms are on* (elastic
expansion, dynamic model scaling, warm-pool sizing). Everything else -- capacity accounting,
batching, sessions, node loss, delivery -- is the core's, identical for every policy.

- ``tangram``: Smith's rule -- expected work x dominant resource share / weight, shortest first;
  elastic expansion; dynamic model instances; warm-pool targets from arrival rates.
- ``fifo``: one shared pool, arrival order (with backfill), minimum allotment, tangram's warm
  pools and dynamic model instances (an ablation of ordering and elasticity only).
- ``task-isolated``: each task owns a CPU pool sized by its measured demand; FIFO in it;
  resident (always warm) sandboxes; model instances are a static set loaded up front.
- ``trajectory-bound``: each trajectory owns an equal slice of CPU for its whole life, its
  sandbox and sessions live in the slice, and its one action at a time may use the whole slice
  (up to the action's own maximum); model instances are a static set loaded up front.
- ``static-pool``: one shared pool, FIFO, resident sandboxes, every elastic action at a fixed
  allotment ``CoreConfig.static_k`` of its elastic dimension (the strongest static shared pool:
  what an operator who sets ``pytest -n k`` once deploys); a static set of model instances.
Partitions slice the CPU dimension only; other dimensions are checked against the node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .actions import ActionSpec
from .resources import CPU


@dataclass(frozen=True, slots=True)
class Policy:
    name: str  # one of config.POLICIES
    ordered: bool  # order by expected work (else arrival order)
    elastic: bool  # hand spare capacity to elastic actions
    dynamic_models: bool  # load/scale instances on demand (else a static set up front)
    warm_pools: bool  # emit ResizeWarmPool targets from arrival rates
    partitioned: str | None  # None | "trajectory" | "task"
    one_at_a_time: bool  # a partition runs one action at a time (trajectory slices)
    whole_slice: bool  # an action may use its partition's whole piece (up to its max)
    resident: bool  # sandboxes stay resident: every start outside a session is warm
    fixed: bool  # elastic actions run at the fixed allotment `CoreConfig.static_k`
    by_use: bool  # short rigid actions are admitted by their measured CPU use (`short_action_s`)


POLICY_TABLE: dict[str, Policy] = {
    "tangram": Policy("tangram", True, True, True, True, None, False, False, False, False, True),
    "fifo": Policy("fifo", False, False, True, True, None, False, False, False, False, True),
    "task-isolated": Policy(
        "task-isolated", False, False, False, False, "task", False, False, True, False, False
    ),
    "trajectory-bound": Policy(
        "trajectory-bound", False, False, False, False, "trajectory", True, True, True, False, False
    ),
    "static-pool": Policy(
        "static-pool", False, False, False, False, None, False, False, True, True, False
    ),
}


def trajectory_of(spec: ActionSpec) -> str:
    return spec.trajectory or spec.session or spec.id


def split_cpu(
    nodes: Sequence[tuple[str, float]], weights: Mapping[str, float]
) -> dict[str, list[tuple[str, float]]]:
    """Lay the nodes' CPU on a line and cut it into intervals proportional to ``weights``.

    Returns, per partition, its pieces ``(node, cpu quota)``, largest first. Quotas may be
    fractional; the quotas of one node add up to that node's CPU.
    """
    total_cpu = sum(c for _, c in nodes)
    total_w = sum(weights.values())
    out: dict[str, list[tuple[str, float]]] = {p: [] for p in weights}
    if total_cpu <= 0 or total_w <= 0:
        return out
    bounds: list[tuple[str, float, float]] = []
    a = 0.0
    for p, w in weights.items():
        b = a + total_cpu * w / total_w
        bounds.append((p, a, b))
        a = b
    i = 0
    c0 = 0.0
    for name, cap in nodes:
        c1 = c0 + cap
        while i < len(bounds) and bounds[i][2] <= c0 + 1e-9:
            i += 1
        j = i
        while j < len(bounds) and bounds[j][1] < c1 - 1e-9:
            p, a, b = bounds[j]
            q = min(b, c1) - max(a, c0)
            if q > 1e-6:
                out[p].append((name, q))
            j += 1
        c0 = c1
    for pieces in out.values():
        pieces.sort(key=lambda nq: (-nq[1], nq[0]))
    return out


def cpu_nodes(nodes: Sequence[tuple[str, Mapping[str, float]]]) -> list[tuple[str, float]]:
    """(name, cpu) of the nodes that offer CPU, in a stable order."""
    return [(n, cap.get(CPU, 0.0)) for n, cap in nodes if cap.get(CPU, 0.0) > 0]
