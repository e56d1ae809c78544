"""Reading a trace for a replay and checking it against the cluster before anything runs.

Invariant: every problem is a `SpecError` naming ``file:line: field`` (the CLI exits 2 on it):
the trace's own syntax (`sim.trace` parses it), an action that names a model the cluster spec
lacks, an action (or session) whose demand no node of the cluster could ever hold, and a
session in an environment image that no ``images:`` entry of the cluster spec or ``--image
NAME=PATH`` gives a path for (when replaying embedded: the engine imports them at start).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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


def _image_entry(name: Any, path: Any, source: str, line: int | None, where: str,
                 ) -> tuple[str, str]:
    from ..core.images import valid_name

    if not valid_name(name):
        raise SpecError(source, line, f"{where}.name", f"must be an image name, got {name!r}")
    if not isinstance(path, str) or not os.path.isabs(path):
        raise SpecError(source, line, f"{where}.path", f"must be an absolute path, got {path!r}")
    return name, path


def read_images(path: str | Path) -> dict[str, str]:
    """The ``images:`` section of a cluster spec file ({} if it has none): a list of
    ``{name, path}`` (the path readable by every node); errors name ``file:line: images[i]...``."""
    from ..specfile import read_yaml

    data = read_yaml(path)
    raw = data.get("images") if isinstance(data, Mapping) else None
    if raw is None:
        return {}
    src = str(path)
    if not isinstance(raw, list):
        raise SpecError(src, data.get("__line__"), "images", "must be a list of {name, path}")
    out: dict[str, str] = {}
    for i, r in enumerate(raw):
        line = r.get("__line__") if isinstance(r, Mapping) else None
        if not isinstance(r, Mapping):
            raise SpecError(src, line, f"images[{i}]", "must be a mapping {name, path}")
        unknown = sorted(set(r) - {"name", "path", "__line__"})
        if unknown:
            raise SpecError(src, line, f"images[{i}].{unknown[0]}", "unknown field")
        name, p = _image_entry(r.get("name"), r.get("path"), src, line, f"images[{i}]")
        out[name] = p
    return out


def parse_image_args(args: Sequence[str]) -> dict[str, str]:
    """``--image NAME=PATH`` values; a malformed one is a `SpecError` on ``--image``."""
    out: dict[str, str] = {}
    for a in args:
        name, sep, path = a.partition("=")
        if not sep:
            raise SpecError("--image", None, "--image", f"must be NAME=PATH, got {a!r}")
        n, p = _image_entry(name, path, "--image", None, "--image")
        out[n] = p
    return out


def check_images(trajectories: Sequence[Trajectory], images: Mapping[str, str], file: str,
                 lines: Sequence[int] | None = None) -> None:
    """Raise `SpecError` for the first session whose image has no path in ``images``."""
    for j, t in enumerate(trajectories):
        for name, sdef in t.sessions.items():
            if sdef.image is not None and sdef.image not in images:
                line = lines[j] if lines is not None and j < len(lines) else None
                raise SpecError(file, line, f"sessions.{name}.image",
                                f"image {sdef.image!r} has no path: give --image "
                                f"{sdef.image}=PATH or an images: entry in the cluster spec")


def trace_images(steps: Sequence[Sequence[Trajectory]]) -> set[str]:
    """The images the trace's sessions run in."""
    return {s.image for b in steps for t in b for s in t.sessions.values() if s.image}


def load_for_replay(trace: str, cluster: ClusterSpec, steps: int | None = None,
                    images: Mapping[str, str] | None = None) -> list[list[Trajectory]]:
    """The trace's RL steps, checked against ``cluster`` (raises `SpecError`); with
    ``images``, every session's image must have a path there."""
    trajs = load_trace(trace)
    lines = trace_lines(trace)
    check_against(cluster, trajs, trace, lines)
    if images is not None:
        check_images(trajs, images, trace, lines)
    batches = group_by_step(trajs)
    return batches[:steps] if steps else batches
