"""Topology-aware choice of accelerator devices for a model instance (pure, no I/O).

Invariant: every device set this module returns lies inside ONE NVLink domain of ONE node, has
exactly the requested number of distinct free devices, and (when memory figures are given) every
device in it has at least the memory asked for. When no such set exists the answer is ``None``
(or, for `can_ever_place`, a reason in words) -- never a set that spans domains.

Both the core scheduler (deciding where a LoadModel goes) and the GPU manager (checking and
executing it) use these functions, so the two can never disagree about what is placeable.

Domain rules: ``domains`` lists the NVLink domains as sequences of device indices. A free device
that appears in no domain is a domain of its own (it is linked to nothing). An empty ``domains``
means "no topology known": all free devices form one domain (as `NodeSpec` assumes by default).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .cluster import ModelSpec, NodeSpec
from .resources import GPU_MEMORY_MB

_EPS = 1e-9


def _effective_domains(free: set[int], domains: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """The domains restricted to ``free`` devices, plus singleton domains for unlisted ones."""
    if not domains:
        return [tuple(sorted(free))] if free else []
    listed: set[int] = set()
    out: list[tuple[int, ...]] = []
    for dom in domains:
        listed.update(dom)
        out.append(tuple(sorted(d for d in set(dom) if d in free)))
    out.extend((d,) for d in sorted(free - listed))
    return out


def choose_devices(
    free: Iterable[int],
    domains: Sequence[Sequence[int]],
    count: int,
    *,
    memory_free: Mapping[int, float] | None = None,
    memory_needed: float = 0.0,
) -> tuple[int, ...] | None:
    """Pick ``count`` free devices inside one NVLink domain, best fit; ``None`` if impossible.

    Best fit: among the domains that have at least ``count`` usable devices, take the one with
    the fewest usable devices (ties: the domain listed first), so large domains stay whole for
    large instances. Inside the domain, devices with the least free memory that still suffices
    go first (ties: lowest index) -- again to keep roomy devices for big models.
    A device is usable when it is free and, if ``memory_free`` is given, has at least
    ``memory_needed`` free (a device missing from ``memory_free`` has none).
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    free_set = set(free)
    best: tuple[int, ...] | None = None
    for dom in _effective_domains(free_set, domains):
        usable = [d for d in dom if _has_memory(d, memory_free, memory_needed)]
        if len(usable) < count:
            continue
        if best is None or len(usable) < len(best):
            best = tuple(usable)
    if best is None:
        return None
    if memory_free is not None:
        ordered = sorted(best, key=lambda d: (memory_free.get(d, 0.0), d))
    else:
        ordered = sorted(best)
    return tuple(sorted(ordered[:count]))


def _has_memory(dev: int, memory_free: Mapping[int, float] | None, needed: float) -> bool:
    if memory_free is None:
        return True
    return memory_free.get(dev, 0.0) + _EPS >= needed


def can_ever_place(node: NodeSpec, model: ModelSpec) -> str | None:
    """``None`` if one instance of ``model`` fits on an empty ``node``, else the reason in words."""
    ngpu = node.gpu_count
    if ngpu < 1:
        return f"node {node.name} has no GPU devices; model {model.name} needs {model.devices}"
    if model.devices > ngpu:
        return (
            f"model {model.name} needs {model.devices} devices per instance; "
            f"node {node.name} has only {ngpu}"
        )
    largest = max((len(d) for d in node.gpu_domains), default=0)
    if model.devices > largest:
        return (
            f"model {model.name} needs {model.devices} devices inside one NVLink domain; "
            f"the largest domain of node {node.name} has {largest}"
        )
    if model.memory_mb > 0:
        per_dev = node.gpu_memory_per_device
        if node.capacity.get(GPU_MEMORY_MB) <= 0:
            return f"node {node.name} declares no {GPU_MEMORY_MB}; model {model.name} needs {model.memory_mb:g} MB per device"
        if model.memory_mb > per_dev + _EPS:
            return (
                f"model {model.name} needs {model.memory_mb:g} MB per device; "
                f"node {node.name} has {per_dev:g} MB per device"
            )
    return None


def place_on_nodes(nodes: Sequence[NodeSpec], model: ModelSpec) -> str | None:
    """``None`` if some node can ever host ``model``, else every node's reason joined."""
    reasons = []
    for node in nodes:
        why = can_ever_place(node, model)
        if why is None:
            return None
        reasons.append(why)
    return "; ".join(reasons) if reasons else f"model {model.name}: no nodes to place it on"
