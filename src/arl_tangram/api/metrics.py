"""Prometheus metrics: a collector that reads the engine's own bookkeeping at scrape time.

Invariant: one `CollectorRegistry` per app (never the global one), so several apps in one
process (tests) never collide; scraping reads state, it never changes it.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from ..runtime.engine import Engine
from ..runtime.stats import ACT_BUCKETS
from ..runtime.views import ClusterView, StatsView

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class EngineCollector:
    """Exports actions by kind and status, ACT histograms, queues, utilization, warm hits."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        e = self.engine
        st = e.stats_view()
        yield from self._actions(st)
        yield self._act_histogram()
        q = GaugeMetricFamily("tangram_queue_length", "Actions waiting to start", labels=["kind"])
        r = GaugeMetricFamily("tangram_running_actions", "Actions running", labels=["kind"])
        for kind in sorted(set(st.queued) | set(st.submitted)):
            q.add_metric([kind], st.queued.get(kind, 0))
            r.add_metric([kind], st.running.get(kind, 0))
        yield q
        yield r
        yield from self._utilization(e.cluster_view())
        hits = CounterMetricFamily("tangram_warm_pool_starts", "Action starts by warmth",
                                   labels=["warm"])
        hits.add_metric(["true"], st.warm_hits)
        hits.add_metric(["false"], st.warm_misses)
        yield hits
        loads = CounterMetricFamily("tangram_model_loads", "Model instance loads", labels=["how"])
        loads.add_metric(["cold"], st.model_loads)
        loads.add_metric(["swap"], st.model_swaps)
        loads.add_metric(["failed"], st.model_load_failures)
        yield loads
        resizes = CounterMetricFamily("tangram_resizes", "Elastic resizes on the nodes, by outcome",
                                      labels=["outcome"])
        for outcome, n in sorted(st.resizes.items()):
            resizes.add_metric([outcome], n)
        yield resizes
        shed = CounterMetricFamily("tangram_shed", "Submits refused for overload")
        shed.add_metric([], st.shed)
        yield shed
        evicted = CounterMetricFamily("tangram_session_evictions",
                                      "Sessions evicted: their node ran short of memory")
        evicted.add_metric([], st.session_evictions)
        yield evicted

    def _actions(self, st: StatsView) -> Iterator[Metric]:
        sub = CounterMetricFamily("tangram_actions_submitted", "Actions submitted", labels=["kind"])
        for kind, n in sorted(st.submitted.items()):
            sub.add_metric([kind], n)
        yield sub
        fin = CounterMetricFamily("tangram_actions_finished", "Actions finished",
                                  labels=["kind", "status"])
        for kind, by in sorted(st.finished.items()):
            for status, n in sorted(by.items()):
                fin.add_metric([kind, status], n)
        yield fin

    def _act_histogram(self) -> Metric:
        h = HistogramMetricFamily("tangram_act_seconds", "Action completion time (finish - submit)",
                                  labels=["kind"])
        for kind, ks in sorted(self.engine.stats_book.kinds.items()):
            acc, buckets = 0, []
            for ub, n in zip((*ACT_BUCKETS, float("inf")), ks.buckets, strict=True):
                acc += n
                buckets.append(("+Inf" if ub == float("inf") else repr(ub), acc))
            h.add_metric([kind], buckets, ks.act_sum)
        return h

    def _utilization(self, cluster: ClusterView) -> Iterator[Metric]:
        u = GaugeMetricFamily("tangram_utilization", "Share of capacity in use",
                              labels=["node", "resource"])
        c = GaugeMetricFamily("tangram_capacity", "Capacity", labels=["node", "resource"])
        w = GaugeMetricFamily("tangram_warm_executors", "Warm executors ready",
                              labels=["node", "key"])
        m = GaugeMetricFamily("tangram_resident_models", "Model instances on the node",
                              labels=["node"])
        ready = GaugeMetricFamily("tangram_node_ready",
                                  "1 while the node can run actions now (readiness), else 0",
                                  labels=["node"])
        deaths = CounterMetricFamily("tangram_fork_server_deaths",
                                     "Deaths of the node's sandbox fork server", labels=["node"])
        restarts = CounterMetricFamily("tangram_fork_server_restarts",
                                       "Restarts of the node's sandbox fork server",
                                       labels=["node"])
        mdeaths = CounterMetricFamily("tangram_model_worker_deaths",
                                      "Model instances on the node whose worker died mid-batch",
                                      labels=["node"])
        for node in cluster.nodes:
            name, rep = node.name, node.report  # (the node's own report: its managers' health)
            gh = rep.get("gpu_health") or {}
            mdeaths.add_metric([name], float(gh.get("model_worker_deaths", 0)))
            ready.add_metric([name], 1.0 if node.alive and node.ready else 0.0)
            h = rep.get("cpu_health") or {}
            deaths.add_metric([name], float(h.get("fork_server_deaths", 0)))
            restarts.add_metric([name], float(h.get("fork_server_restarts", 0)))
            for res, share in node.utilization.items():
                u.add_metric([name, res], share)
            for res, cap in node.capacity.as_dict().items():
                c.add_metric([name, res], cap)
            for key, n in (rep.get("warm_pools") or {}).items():
                w.add_metric([name, str(key)], float(n))
            m.add_metric([name], len(rep.get("resident_models") or []))
        yield u
        yield c
        yield w
        yield m
        yield ready
        yield deaths
        yield restarts
        yield mdeaths


def make_registry(engine: Engine) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(EngineCollector(engine))
    return reg


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
