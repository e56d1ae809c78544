"""Reading a trace for a replay and checking it against the cluster before anything runs.

Invariant: every problem is a `SpecError` naming ``file:line: field`` (the CLI exits 2 on it):
the trace's own syntax (`sim.trace` parses it), an action that names a model the cluster spec
lacks, and an action (or session) whose demand no node of the cluster could ever hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..core.cluster import ClusterSpec
from ..core.errors import SpecError
from ..core.resources import Resources
from ..sim.simulator import group_by_step
from ..sim.trace import Trajectory, load_trace


def trace_lines(path: str | Path) -> list[int]:
    """Line numbers of the trajectories of a trace, in file order (as `sim.trace` skips lines)."""
    out = []
    with Path(path).open(encoding="utf-8") as fh:
        for lineno, text in enumerate(fh, start=1):
            text = text.strip()
            if text and not text.startswith("#"):
                out.append(lineno)
    return out


def _fits_somewhere(cluster: ClusterSpec, demand: Resources) -> bool:
    for n in cluster.nodes:
        if all(n.capacity.get(k) + 1e-9 >= v for k, v in demand.items()):
            return True
    return False


def check_against(cluster: ClusterSpec, trajectories: Sequence[Trajectory], file: str,
                  lines: Sequence[int] | None = None) -> None:
    """Raise `SpecError` for the first action the cluster can never run."""
    names = {m.name for m in cluster.models}
    for j, t in enumerate(trajectories):
        line = lines[j] if lines is not None and j < len(lines) else None
        for name, sdef in t.sessions.items():
            if not _fits_somewhere(cluster, sdef.demand):
                raise SpecError(file, line, f"sessions.{name}.demand",
                                f"{sdef.demand.as_dict()} fits no node of the cluster")
        for i, (_g, a) in enumerate(t.steps):
            where = f"steps[{i}][1]"
            if a.model is not None and a.model not in names:
                raise SpecError(file, line, f"{where}.model",
                                f"model {a.model!r} is not in the cluster spec "
                                f"(it has: {', '.join(sorted(names)) or 'none'})")
            if not _fits_somewhere(cluster, a.demand):
                raise SpecError(file, line, f"{where}.demand",
                                f"{a.demand.as_dict()} fits no node of the cluster")
            el = a.elasticity
            if el is not None and not any(n.capacity.get(el.dim) + 1e-9 >= el.min
                                          for n in cluster.nodes):
                raise SpecError(file, line, f"{where}.elasticity.min",
                                f"{el.min:g} {el.dim} exceeds every node")


def load_for_replay(trace: str, cluster: ClusterSpec, steps: int | None = None,
                    ) -> list[list[Trajectory]]:
    """The trace's RL steps, checked against ``cluster`` (raises `SpecError`)."""
    trajs = load_trace(trace)
    check_against(cluster, trajs, trace, trace_lines(trace))
    batches = group_by_step(trajs)
    return batches[:steps] if steps else batches
