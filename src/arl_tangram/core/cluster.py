"""The resource model: nodes, GPU topology, reward models, and the cluster spec file.

A `NodeSpec` is a machine: a capacity vector and, when it has GPUs, the NVLink domains that
group its device indices (a multi-GPU model instance must sit inside one domain). Two optional
measured figures describe how the machine really executes: ``parallel_speedup`` (how much faster
fully parallel work runs on k cores than on one, e.g. ``{2: 1.6}``; absent: ideal, k), which the
simulator's virtual executor applies and tangram's elastic widths weigh (`core.elastic`), and
``dispatch_s`` (the runtime's fixed cost of one action on the node, per action kind, not
stretched by the allotment) and ``parallel_start_s`` (the time an elastic action started on k
cores takes before its parallel part runs at that width: its workers start one after
another), both for the simulator only, and ``device_cores`` (the cores of the node's own
processor that a model batch takes per device where its devices are CPU-backed: the forwards
compete with the node's sandboxes; simulator only). A `ModelSpec`
describes a reward model or judge: what it needs per instance and its cost curve (load, swap,
batch latency ``alpha + beta * batch``), which the scheduler uses and measured events correct.

`parse_cluster` builds a spec from parsed YAML (mappings carrying ``__line__``) and reports errors
as ``file:line: field: message``; reading the file is `arl_tangram.specfile`'s job (no I/O here).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import SpecError
from .resources import GPU, GPU_MEMORY_MB, Resources


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One machine of a pool."""

    name: str  # unique node name (Ray node id on Ray)
    capacity: Resources  # what the node offers, per dimension
    pool: str = "default"  # which pool it belongs to ("cpu", "gpu", ...)
    gpu_domains: tuple[tuple[int, ...], ...] = ()  # NVLink domains as tuples of device indices
    labels: Mapping[str, str] = field(default_factory=dict)
    # measured (cores k > 1, speedup of fully parallel work on k cores vs one), ascending k;
    # () = ideal cores (speedup k). Simulator only: see `parallel_cores`.
    parallel_speedup: tuple[tuple[float, float], ...] = ()
    # measured fixed cost of one action on this node (dispatch, sandbox program start, reply),
    # per action kind ("default" for the others); simulator only, not scaled by the allotment
    dispatch_s: Mapping[str, float] = field(default_factory=dict)
    # measured (cores k > 1, seconds), ascending k: what an elastic action's parallel part
    # loses when it starts on k cores (its workers start one after another; measured beside
    # `parallel_speedup` on runs a fifth as long). Simulator only: see `parallel_start_for`.
    parallel_start_s: tuple[tuple[float, float], ...] = ()
    # cores of this node's processor a model batch uses per device of its instance, where the
    # devices are CPU-backed (the GPU manager's `cpu` devices: a forward runs on the node's own
    # cores, beside its sandboxes); 0 = devices of their own (GPUs). Simulator only, and only on
    # a node with `parallel_speedup` (a processor its runs share).
    device_cores: float = 0.0

    def __post_init__(self) -> None:
        pts = self.parallel_speedup
        for i, (k, s) in enumerate(pts):
            if not (k > 1.0 and 0.0 < s <= k) or math.isinf(k):
                raise ValueError(f"node {self.name}: parallel_speedup at {k:g} cores must be in "
                                 f"(0, {k:g}], got {s:g}")
            if i and k <= pts[i - 1][0]:
                raise ValueError(f"node {self.name}: parallel_speedup core counts must ascend")
        for i, (k, c) in enumerate(self.parallel_start_s):
            if not (k > 1.0 and c >= 0.0) or math.isinf(k) or math.isinf(c):
                raise ValueError(f"node {self.name}: parallel_start_s at {k:g} cores must be a "
                                 f"finite number of seconds >= 0, got {c:g}")
            if i and k <= self.parallel_start_s[i - 1][0]:
                raise ValueError(f"node {self.name}: parallel_start_s core counts must ascend")
        if not (self.device_cores >= 0.0) or math.isinf(self.device_cores):
            raise ValueError(f"node {self.name}: device_cores must be a finite number >= 0, got "
                             f"{self.device_cores!r}")
        for kind, d in self.dispatch_s.items():
            if not (d >= 0.0) or math.isinf(d):
                raise ValueError(f"node {self.name}: dispatch_s.{kind} must be >= 0, got {d!r}")
        ngpu = int(self.capacity.get(GPU))
        if not self.gpu_domains and ngpu:
            object.__setattr__(self, "gpu_domains", (tuple(range(ngpu)),))
        seen = [d for dom in self.gpu_domains for d in dom]
        if len(seen) != len(set(seen)):
            raise ValueError(f"node {self.name}: a GPU appears in two NVLink domains")
        if seen and (min(seen) < 0 or max(seen) >= ngpu):
            raise ValueError(f"node {self.name}: gpu_domains name devices outside 0..{ngpu - 1}")

    def parallel_cores(self, k: float) -> float:
        """Effective cores that fully parallel work gets from an allotment of ``k`` cores: ``k``
        up to one core (a quota), then the measured ``parallel_speedup`` interpolated linearly
        from (1, 1) through the measured points, and past the last point at its efficiency."""
        pts = self.parallel_speedup
        if not pts or k <= 1.0:
            return k
        lo_k, lo_s = 1.0, 1.0
        for hk, hs in pts:
            if k <= hk:
                return lo_s + (hs - lo_s) * (k - lo_k) / (hk - lo_k)
            lo_k, lo_s = hk, hs
        return lo_s * k / lo_k

    def parallel_start_for(self, k: float) -> float:
        """The measured start cost of an elastic action's parallel part on ``k`` cores: 0 up
        to one core (nothing runs in parallel), then linear from (1, 0) through the measured
        points, and past the last point in proportion to the workers beyond the first."""
        pts = self.parallel_start_s
        if not pts or k <= 1.0:  # pragma: no mutate (at k = 1 the line from (1, 0) gives 0 too)
            return 0.0
        lo_k, lo_c = 1.0, 0.0
        for hk, hc in pts:  # (the ratio first: a measured point gives its figure exactly)
            if k <= hk:  # pragma: no mutate (at a point itself the next piece gives it as well)
                return lo_c + (hc - lo_c) * ((k - lo_k) / (hk - lo_k))
            lo_k, lo_c = hk, hc
        return lo_c * ((k - 1.0) / (lo_k - 1.0))

    def dispatch_for(self, kind: str) -> float:
        """The measured fixed cost of one action of ``kind`` on this node (0 when unmeasured)."""
        d = self.dispatch_s
        if not d:
            return 0.0
        v = d.get(kind)
        return float(v) if v is not None else float(d.get("default", 0.0))

    @property
    def gpu_count(self) -> int:
        return int(self.capacity.get(GPU))

    @property
    def gpu_memory_per_device(self) -> float:
        n = self.gpu_count
        return self.capacity.get(GPU_MEMORY_MB) / n if n else 0.0


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A reward model or judge the GPU pool can serve."""

    name: str  # name actions refer to
    kind: str = "scalar"  # scalar (sequence classification) | similarity | judge
    path: str | None = None  # local Hugging Face directory; None: built by a factory
    devices: int = 1  # devices per instance (tensor-parallel degree)
    memory_mb: float = 1000.0  # device memory per device of one instance
    dtype: str = "float32"
    load_s: float = 10.0  # cold load time (disk -> device), corrected by measurements
    swap_s: float = 1.0  # swap-in time from host memory, corrected by measurements
    alpha: float = 0.02  # batch latency = alpha + beta * batch (seconds)
    beta: float = 0.002
    max_batch: int = 64  # largest batch the model accepts
    max_instances: int = 8  # scale-out limit
    host_memory_mb: float = 0.0  # host memory a parked (swapped-out) instance takes
    options: Mapping[str, Any] = field(default_factory=dict)  # manager-specific (pooling, ...)
    # Continuous batching (an inference engine, kind genjudge): sequences one instance runs at
    # once. 0: one batch in flight per instance; > 0: new batches join while others run, up to
    # this many actions in flight on the instance, each started as soon as it is queued.
    max_seqs: int = 0
    # Prefill (an inference engine): seconds one instance spends per prompt token not in its
    # prefix cache; while it prefills, its decoding sequences wait. 0: not modelled (the core's
    # routing then weighs no prefix-cache reuse, and the simulator charges no prefill).
    prefill_s: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("scalar", "similarity", "judge", "genjudge"):
            raise ValueError(f"model {self.name}: kind must be scalar|similarity|judge|genjudge")
        if self.max_seqs < 0:
            raise ValueError(f"model {self.name}: max_seqs must be >= 0, got {self.max_seqs}")
        if self.devices < 1:
            raise ValueError(f"model {self.name}: devices must be >= 1, got {self.devices}")
        if self.max_batch < 1:
            raise ValueError(f"model {self.name}: max_batch must be >= 1")
        if self.alpha < 0 or self.beta < 0:
            raise ValueError(f"model {self.name}: alpha and beta must be >= 0")
        if not 0.0 <= self.prefill_s < math.inf:
            raise ValueError(f"model {self.name}: prefill_s must be >= 0 and finite, got {self.prefill_s}")

    def batch_latency(self, n: int) -> float:
        return self.alpha + self.beta * n

    @property
    def knee_batch(self) -> int:
        """Batch size past which latency grows faster than the fixed cost it amortizes.

        With latency ``alpha + beta*b`` the throughput ``b / (alpha + beta*b)`` reaches 80% of
        its asymptote ``1/beta`` at ``b = 4*alpha/beta``; larger batches only add wait.
        """
        if self.beta <= 0:
            return self.max_batch
        return max(1, min(self.max_batch, round(4 * self.alpha / self.beta)))


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """Nodes and the models they may serve."""

    nodes: tuple[NodeSpec, ...]
    models: tuple[ModelSpec, ...] = ()

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        if len(names) != len(set(names)):
            raise ValueError("node names must be unique")
        mnames = [m.name for m in self.models]
        if len(mnames) != len(set(mnames)):
            raise ValueError("model names must be unique")

    def model(self, name: str) -> ModelSpec | None:
        for m in self.models:
            if m.name == name:
                return m
        return None

    def total_capacity(self) -> Resources:
        out = Resources()
        for n in self.nodes:
            out = out + n.capacity
        return out

    def scaled(self, factor: float) -> ClusterSpec:
        """The same cluster with ``factor`` times as many nodes of each pool (at least one)."""
        by_pool: dict[str, list[NodeSpec]] = {}
        for n in self.nodes:
            by_pool.setdefault(n.pool, []).append(n)
        nodes: list[NodeSpec] = []
        for pool_nodes in by_pool.values():
            keep = max(1, round(len(pool_nodes) * factor))
            nodes.extend(pool_nodes[:keep])
        return ClusterSpec(tuple(nodes), self.models)


# ---- YAML ---------------------------------------------------------------------------------------


def _strip_lines(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strip_lines(v) for k, v in obj.items() if k != "__line__"}
    if isinstance(obj, list):
        return [_strip_lines(v) for v in obj]
    return obj


def _resources(raw: Any, where: str) -> Resources:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be a mapping of dimension -> amount")
    try:
        return Resources({str(k): float(v) for k, v in raw.items() if k != "__line__"})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


_NODE_KEYS = {"name", "capacity", "pool", "gpu_domains", "labels", "count", "parallel_speedup",
              "dispatch_s", "parallel_start_s", "device_cores"}
_DISPATCH_KINDS = {"code", "test", "tool", "custom", "reward", "judge", "default"}


def _finite(raw: Any) -> float | None:
    """``raw`` as a finite float, or None (bools and strings are not numbers here)."""
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return None
    v = float(raw)
    return v if math.isfinite(v) else None


def _points(raw: Any, where: str, what: str,
            check: Callable[[float, float | None], str | None]) -> tuple[tuple[float, float], ...]:
    """``{cores: value}`` -> ascending (cores, value) pairs, each value checked by ``check(cores,
    value)`` (an error message, or None); errors as (field, message). ``what`` names the values
    and gives an example, for the message of a field that is not a mapping."""
    if not isinstance(raw, Mapping):
        raise _FieldError(where, f"must be a mapping of core count -> {what}")
    line = raw.get("__line__")
    out = []
    for k, v in raw.items():
        if k == "__line__":
            continue
        kc, fv = _finite(k), _finite(v)
        if kc is None or kc <= 1.0:
            raise _FieldError(f"{where}.{k}", "core count must be a number > 1", line)
        bad = check(kc, fv)
        if bad or fv is None:  # (every check refuses None)
            raise _FieldError(f"{where}.{k}", f"{bad}, got {v!r}", line)
        out.append((kc, fv))
    return tuple(sorted(out))


def _speedup_bad(k: float, s: float | None) -> str | None:
    return None if s is not None and 0.0 < s <= k else f"speedup must be a number in (0, {k:g}]"


def _start_bad(_k: float, c: float | None) -> str | None:
    return None if c is not None and c >= 0.0 else "must be a number of seconds >= 0"


def _dispatch(raw: Any, where: str) -> dict[str, float]:
    """A number (every kind) or ``{kind: seconds}``; errors as (field, message)."""
    if not isinstance(raw, Mapping):
        v = _finite(raw)
        if v is None or v < 0:
            raise _FieldError(where, f"must be seconds >= 0 or a mapping kind -> seconds, got {raw!r}")
        return {"default": v}
    line = raw.get("__line__")
    out = {}
    for k, d in raw.items():
        if k == "__line__":
            continue
        if k not in _DISPATCH_KINDS:
            raise _FieldError(f"{where}.{k}", f"unknown kind; one of {sorted(_DISPATCH_KINDS)}", line)
        v = _finite(d)
        if v is None or v < 0:
            raise _FieldError(f"{where}.{k}", f"must be seconds >= 0, got {d!r}", line)
        out[str(k)] = v
    return out


class _FieldError(ValueError):
    """A bad field of a node, with the line of the mapping it sits in when known."""

    def __init__(self, fieldname: str, msg: str, line: int | None = None) -> None:
        super().__init__(msg)
        self.fieldname, self.line = fieldname, line


_MODEL_KEYS = {f for f in ModelSpec.__dataclass_fields__}


def parse_cluster(data: Any, source: str = "<cluster>") -> ClusterSpec:
    """Build a `ClusterSpec` from parsed YAML; errors name ``source:line: field``."""
    if not isinstance(data, Mapping):
        raise SpecError(source, 1, "<root>",
                        "a cluster spec is a mapping with 'nodes' (and optional 'models')")
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise SpecError(source, data.get("__line__"), "nodes", "must be a non-empty list")
    try:
        nodes = [n for i, rn in enumerate(raw_nodes) for n in _parse_node(rn, f"nodes[{i}]")]
        models = [_parse_model(rm, f"models[{i}]") for i, rm in enumerate(data.get("models") or [])]
    except _FieldError as exc:
        raise SpecError(source, exc.line, exc.fieldname, str(exc)) from None
    try:
        return ClusterSpec(tuple(nodes), tuple(models))
    except ValueError as exc:
        raise SpecError(source, None, "nodes", str(exc)) from None


def _entry_line(raw: Any, where: str, keys: set[str]) -> int | None:
    """The checks a node and a model entry share (a mapping, known fields, a name); its line."""
    line = raw.get("__line__") if isinstance(raw, Mapping) else None
    if not isinstance(raw, Mapping):
        raise _FieldError(where, "must be a mapping", line)
    unknown = set(raw) - keys - {"__line__"}
    if unknown:
        raise _FieldError(f"{where}.{sorted(unknown)[0]}", "unknown field", line)
    if "name" not in raw:
        raise _FieldError(f"{where}.name", "is required", line)
    return line


def _parse_node(rn: Any, where: str) -> list[NodeSpec]:
    """One ``nodes:`` entry: ``count`` nodes (named ``NAME-i`` when more than one)."""
    line = _entry_line(rn, where, _NODE_KEYS)
    try:
        cap = _resources(rn.get("capacity"), "capacity")
        count = int(rn.get("count", 1))
        if count < 1:
            raise ValueError("count must be >= 1")
        domains = tuple(tuple(int(d) for d in dom) for dom in rn.get("gpu_domains") or ())
        labels = {str(k): str(v) for k, v in (rn.get("labels") or {}).items() if k != "__line__"}
        speedup = (_points(rn["parallel_speedup"], f"{where}.parallel_speedup",
                           "measured speedup, e.g. {2: 1.6}", _speedup_bad)
                   if rn.get("parallel_speedup") is not None else ())
        dispatch = (_dispatch(rn["dispatch_s"], f"{where}.dispatch_s")
                    if rn.get("dispatch_s") is not None else {})
        starts = (_points(rn["parallel_start_s"], f"{where}.parallel_start_s",
                          "seconds, e.g. {2: 0.003}", _start_bad)
                  if rn.get("parallel_start_s") is not None else ())
        device_cores = _finite(rn["device_cores"]) if rn.get("device_cores") is not None else 0.0
        if device_cores is None or device_cores < 0.0:
            raise _FieldError(f"{where}.device_cores", "must be a number of cores >= 0, got "
                              f"{rn.get('device_cores')!r}", line)
        pool = str(rn.get("pool", "default"))
        names = [str(rn["name"])] if count == 1 else [f"{rn['name']}-{c}" for c in range(count)]
        return [NodeSpec(name, cap, pool, domains, labels, speedup, dispatch, starts, device_cores)
                for name in names]
    except _FieldError as exc:
        raise _FieldError(exc.fieldname, str(exc), exc.line or line) from None
    except (TypeError, ValueError) as exc:
        raise _FieldError(where, str(exc), line) from None


def _parse_model(rm: Any, where: str) -> ModelSpec:
    """One ``models:`` entry."""
    line = _entry_line(rm, where, _MODEL_KEYS)
    try:
        return ModelSpec(**_strip_lines(dict(rm)))
    except (TypeError, ValueError) as exc:
        raise _FieldError(where, str(exc), line) from None
