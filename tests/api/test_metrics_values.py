"""`api/metrics.py`'s exposition, pinned whole (issue 43 item 2, helper-41): an `EngineCollector`
over a stub engine whose views are fixed, rendered by prometheus_client, compared line by line
with the Prometheus text format 0.0.4 we mean to serve (each family's HELP and TYPE, the counter
``_total`` names, label names and order, histogram buckets cumulative with ``le`` and ``+Inf``,
``_count`` and ``_sum``); families in the order collected, samples in the order added (kinds,
statuses and outcomes sorted; nodes as the cluster lists them). Scraping reads the views once
and changes nothing; registering reads nothing (``auto_describe=False``)."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from arl_tangram.api import metrics
from arl_tangram.runtime.stats import ACT_BUCKETS, KindStats
from arl_tangram.runtime.views import StatsView


class _Caps:
    def __init__(self, d: dict[str, float]) -> None:
        self._d = d

    def as_dict(self) -> dict[str, float]:
        return dict(self._d)


def _node(
    name: str,
    *,
    alive: bool,
    ready: bool,
    util: dict[str, float],
    cap: dict[str, float],
    report: dict[str, Any],
) -> SimpleNamespace:
    return SimpleNamespace(
        name=name, alive=alive, ready=ready, utilization=util, capacity=_Caps(cap), report=report
    )


def _stats(**kw: Any) -> StatsView:
    base: dict[str, Any] = dict(
        policy="tangram",
        uptime_s=1.0,
        act={},
        queued={},
        running={},
        submitted={},
        finished={},
        warm_hits=0,
        warm_misses=0,
        model_loads=0,
        model_swaps=0,
        model_load_failures=0,
        shed=0,
        session_evictions=0,
        results_kept=0,
        sessions=0,
        resizes={},
        estimator={},
    )
    base.update(kw)
    return StatsView(**base)


class _Engine:
    """What the collector reads: ``stats_view()``, ``cluster_view()``, ``stats_book.kinds``."""

    def __init__(
        self, st: StatsView, nodes: list[SimpleNamespace], kinds: dict[str, KindStats]
    ) -> None:
        self._st, self._nodes = st, nodes
        self.stats_book = SimpleNamespace(kinds=kinds)
        self.reads = 0

    def stats_view(self) -> StatsView:
        self.reads += 1
        return self._st

    def cluster_view(self) -> SimpleNamespace:
        return SimpleNamespace(nodes=self._nodes)


def _kind(*acts: float) -> KindStats:
    ks = KindStats(window=deque(maxlen=16))
    for a in acts:
        ks.add(a)
    return ks


def _engine() -> _Engine:
    st = _stats(
        queued={"search": 2, "code": 3},  # "search" queued, never submitted
        running={"code": 1, "judge": 4},
        submitted={"judge": 5, "code": 7},  # "judge" submitted, none queued now
        finished={"judge": {"succeeded": 1}, "code": {"timeout": 2, "failed": 1, "succeeded": 3}},
        warm_hits=11,
        warm_misses=13,
        model_loads=2,
        model_swaps=3,
        model_load_failures=1,
        shed=9,
        session_evictions=4,
        resizes={"dropped": 1, "applied": 6},
    )
    nodes = [
        _node(
            "n2",
            alive=True,
            ready=True,
            util={"cpu": 0.5, "memory_mb": 0.25},
            cap={"cpu": 8.0, "memory_mb": 1024.0},
            report={
                "gpu_health": {"model_worker_deaths": 3},
                "cpu_health": {"fork_server_deaths": 2, "fork_server_restarts": 1},
                "warm_pools": {"python": 2, ("bash", "img"): 1},
                "resident_models": ["rm", "judge"],
            },
        ),
        _node(
            "n1",
            alive=True,
            ready=False,
            util={},
            cap={"cpu": 2.0},
            report={
                "gpu_health": None,
                "cpu_health": None,
                "warm_pools": None,
                "resident_models": None,
            },
        ),
        _node("n0", alive=False, ready=True, util={"gpu": 1.0}, cap={"gpu": 1.0}, report={}),
    ]
    kinds = {"search": _kind(0.001, 0.003, 20.0, 1000.0), "code": _kind(0.5)}
    return _Engine(st, nodes, kinds)


def _buckets(kind: str, counts: dict[str, int], total: int, s: str) -> list[str]:
    les = [repr(b) for b in ACT_BUCKETS] + ["+Inf"]
    out, acc = [], 0
    for le in les:
        acc += counts.get(le, 0)
        out.append(f'tangram_act_seconds_bucket{{kind="{kind}",le="{le}"}} {float(acc)}')
    assert acc == total
    return [
        *out,
        f'tangram_act_seconds_count{{kind="{kind}"}} {float(total)}',
        f'tangram_act_seconds_sum{{kind="{kind}"}} {s}',
    ]


EXPECTED = [
    "# HELP tangram_actions_submitted_total Actions submitted",
    "# TYPE tangram_actions_submitted_total counter",
    'tangram_actions_submitted_total{kind="code"} 7.0',
    'tangram_actions_submitted_total{kind="judge"} 5.0',
    "# HELP tangram_actions_finished_total Actions finished",
    "# TYPE tangram_actions_finished_total counter",
    'tangram_actions_finished_total{kind="code",status="failed"} 1.0',
    'tangram_actions_finished_total{kind="code",status="succeeded"} 3.0',
    'tangram_actions_finished_total{kind="code",status="timeout"} 2.0',
    'tangram_actions_finished_total{kind="judge",status="succeeded"} 1.0',
    "# HELP tangram_act_seconds Action completion time (finish - submit)",
    "# TYPE tangram_act_seconds histogram",
    *_buckets("code", {"0.5": 1}, 1, "0.5"),
    *_buckets("search", {"0.001": 1, "0.005": 1, "30.0": 1, "+Inf": 1}, 4, "1020.004"),
    "# HELP tangram_queue_length Actions waiting to start",
    "# TYPE tangram_queue_length gauge",
    'tangram_queue_length{kind="code"} 3.0',
    'tangram_queue_length{kind="judge"} 0.0',
    'tangram_queue_length{kind="search"} 2.0',
    "# HELP tangram_running_actions Actions running",
    "# TYPE tangram_running_actions gauge",
    'tangram_running_actions{kind="code"} 1.0',
    'tangram_running_actions{kind="judge"} 4.0',
    'tangram_running_actions{kind="search"} 0.0',
    "# HELP tangram_utilization Share of capacity in use",
    "# TYPE tangram_utilization gauge",
    'tangram_utilization{node="n2",resource="cpu"} 0.5',
    'tangram_utilization{node="n2",resource="memory_mb"} 0.25',
    'tangram_utilization{node="n0",resource="gpu"} 1.0',
    "# HELP tangram_capacity Capacity",
    "# TYPE tangram_capacity gauge",
    'tangram_capacity{node="n2",resource="cpu"} 8.0',
    'tangram_capacity{node="n2",resource="memory_mb"} 1024.0',
    'tangram_capacity{node="n1",resource="cpu"} 2.0',
    'tangram_capacity{node="n0",resource="gpu"} 1.0',
    "# HELP tangram_warm_executors Warm executors ready",
    "# TYPE tangram_warm_executors gauge",
    'tangram_warm_executors{key="python",node="n2"} 2.0',
    "tangram_warm_executors{key=\"('bash', 'img')\",node=\"n2\"} 1.0",
    "# HELP tangram_resident_models Model instances on the node",
    "# TYPE tangram_resident_models gauge",
    'tangram_resident_models{node="n2"} 2.0',
    'tangram_resident_models{node="n1"} 0.0',
    'tangram_resident_models{node="n0"} 0.0',
    "# HELP tangram_node_ready 1 while the node can run actions now (readiness), else 0",
    "# TYPE tangram_node_ready gauge",
    'tangram_node_ready{node="n2"} 1.0',
    'tangram_node_ready{node="n1"} 0.0',
    'tangram_node_ready{node="n0"} 0.0',
    "# HELP tangram_fork_server_deaths_total Deaths of the node's sandbox fork server",
    "# TYPE tangram_fork_server_deaths_total counter",
    'tangram_fork_server_deaths_total{node="n2"} 2.0',
    'tangram_fork_server_deaths_total{node="n1"} 0.0',
    'tangram_fork_server_deaths_total{node="n0"} 0.0',
    "# HELP tangram_fork_server_restarts_total Restarts of the node's sandbox fork server",
    "# TYPE tangram_fork_server_restarts_total counter",
    'tangram_fork_server_restarts_total{node="n2"} 1.0',
    'tangram_fork_server_restarts_total{node="n1"} 0.0',
    'tangram_fork_server_restarts_total{node="n0"} 0.0',
    "# HELP tangram_model_worker_deaths_total Model instances on the node whose worker died "
    "mid-batch",
    "# TYPE tangram_model_worker_deaths_total counter",
    'tangram_model_worker_deaths_total{node="n2"} 3.0',
    'tangram_model_worker_deaths_total{node="n1"} 0.0',
    'tangram_model_worker_deaths_total{node="n0"} 0.0',
    "# HELP tangram_warm_pool_starts_total Action starts by warmth",
    "# TYPE tangram_warm_pool_starts_total counter",
    'tangram_warm_pool_starts_total{warm="true"} 11.0',
    'tangram_warm_pool_starts_total{warm="false"} 13.0',
    "# HELP tangram_model_loads_total Model instance loads",
    "# TYPE tangram_model_loads_total counter",
    'tangram_model_loads_total{how="cold"} 2.0',
    'tangram_model_loads_total{how="swap"} 3.0',
    'tangram_model_loads_total{how="failed"} 1.0',
    "# HELP tangram_resizes_total Elastic resizes on the nodes, by outcome",
    "# TYPE tangram_resizes_total counter",
    'tangram_resizes_total{outcome="applied"} 6.0',
    'tangram_resizes_total{outcome="dropped"} 1.0',
    "# HELP tangram_shed_total Submits refused for overload",
    "# TYPE tangram_shed_total counter",
    "tangram_shed_total 9.0",
    "# HELP tangram_session_evictions_total Sessions evicted: their node ran short of memory",
    "# TYPE tangram_session_evictions_total counter",
    "tangram_session_evictions_total 4.0",
]


def test_exposition_whole() -> None:
    eng = _engine()
    reg = metrics.make_registry(eng)  # type: ignore[arg-type]
    assert eng.reads == 0  # registering reads nothing
    text = metrics.render(reg).decode()
    assert eng.reads == 1
    assert text.splitlines() == EXPECTED
    assert text.endswith("\n")
    assert metrics.render(reg).decode() == text and eng.reads == 2  # reads, never changes


def test_exposition_parses_with_the_types_and_label_sets() -> None:
    text = metrics.render(metrics.make_registry(_engine())).decode()  # type: ignore[arg-type]
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    types = {n: f.type for n, f in fams.items()}
    assert types == {
        "tangram_actions_submitted": "counter",
        "tangram_actions_finished": "counter",
        "tangram_act_seconds": "histogram",
        "tangram_queue_length": "gauge",
        "tangram_running_actions": "gauge",
        "tangram_utilization": "gauge",
        "tangram_capacity": "gauge",
        "tangram_warm_executors": "gauge",
        "tangram_resident_models": "gauge",
        "tangram_node_ready": "gauge",
        "tangram_fork_server_deaths": "counter",
        "tangram_fork_server_restarts": "counter",
        "tangram_model_worker_deaths": "counter",
        "tangram_warm_pool_starts": "counter",
        "tangram_model_loads": "counter",
        "tangram_resizes": "counter",
        "tangram_shed": "counter",
        "tangram_session_evictions": "counter",
    }
    labels = {n: {tuple(sorted(s.labels)) for s in f.samples} for n, f in fams.items()}
    assert labels["tangram_act_seconds"] == {("kind", "le"), ("kind",)}
    assert labels["tangram_actions_finished"] == {("kind", "status")}
    assert labels["tangram_utilization"] == {("node", "resource")}
    assert labels["tangram_warm_executors"] == {("key", "node")}
    assert labels["tangram_shed"] == {()}


def test_empty_engine_still_names_every_family() -> None:
    eng = _Engine(_stats(), [], {})
    text = metrics.render(metrics.make_registry(eng)).decode()  # type: ignore[arg-type]
    assert [ln for ln in text.splitlines() if not ln.startswith("#")] == [
        'tangram_warm_pool_starts_total{warm="true"} 0.0',
        'tangram_warm_pool_starts_total{warm="false"} 0.0',
        'tangram_model_loads_total{how="cold"} 0.0',
        'tangram_model_loads_total{how="swap"} 0.0',
        'tangram_model_loads_total{how="failed"} 0.0',
        "tangram_shed_total 0.0",
        "tangram_session_evictions_total 0.0",
    ]
    assert sum(ln.startswith("# TYPE ") for ln in text.splitlines()) == 18


def test_content_type_is_the_text_format_0_0_4() -> None:
    assert metrics.CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
