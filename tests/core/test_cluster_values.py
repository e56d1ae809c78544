"""core/cluster.py's values (issue 43 item 2: the survivors of `make mutation` on it): a node's
checks word for word at each boundary (a speedup at k cores in (0, k], core counts ascending, a
dispatch cost >= 0 and finite, GPUs in one NVLink domain each and within 0..n-1, the default
domain of all GPUs), `parallel_cores`' interpolation and extrapolation, `dispatch_for`'s
fallbacks, a model's defaults and refusals at each boundary, `knee_batch`' rounding and clamps,
a cluster's uniqueness, `total_capacity` and `scaled`, and `parse_cluster`'s errors as
``file:line: field: message`` (the line of the mapping a bad field sits in, else its node's)."""

from __future__ import annotations

import math

import pytest

from arl_tangram.core.cluster import (
    ClusterSpec,
    ModelSpec,
    NodeSpec,
    _finite,
    _strip_lines,
    parse_cluster,
)
from arl_tangram.core.errors import SpecError
from arl_tangram.core.resources import Resources


def _refused(fn, msg: str) -> None:
    with pytest.raises(ValueError) as info:
        fn()
    assert str(info.value) == msg


def _node(**kw) -> NodeSpec:
    return NodeSpec("n", kw.pop("capacity", Resources(cpu=4)), **kw)


# ---- NodeSpec ------------------------------------------------------------------------------------


def test_a_speedup_is_in_zero_to_k_at_k_cores_above_one() -> None:
    assert _node(parallel_speedup=((2.0, 2.0),)).parallel_speedup == ((2.0, 2.0),)  # s == k
    assert _node(parallel_speedup=((1.5, 0.01),)).parallel_speedup == ((1.5, 0.01),)
    _refused(
        lambda: _node(parallel_speedup=((1.0, 1.0),)),
        "node n: parallel_speedup at 1 cores must be in (0, 1], got 1",
    )
    _refused(
        lambda: _node(parallel_speedup=((2.0, 0.0),)),
        "node n: parallel_speedup at 2 cores must be in (0, 2], got 0",
    )
    _refused(
        lambda: _node(parallel_speedup=((2.0, 2.5),)),
        "node n: parallel_speedup at 2 cores must be in (0, 2], got 2.5",
    )
    _refused(
        lambda: _node(parallel_speedup=((math.inf, 3.0),)),
        "node n: parallel_speedup at inf cores must be in (0, inf], got 3",
    )


def test_speedup_core_counts_ascend_strictly() -> None:
    pts = ((2.0, 1.6), (4.0, 2.8))
    assert _node(parallel_speedup=pts).parallel_speedup == pts
    _refused(
        lambda: _node(parallel_speedup=((4.0, 2.8), (2.0, 1.6))),
        "node n: parallel_speedup core counts must ascend",
    )
    _refused(
        lambda: _node(parallel_speedup=((2.0, 1.6), (2.0, 1.7))),
        "node n: parallel_speedup core counts must ascend",
    )


def test_a_dispatch_cost_is_at_least_zero_and_finite() -> None:
    assert dict(_node(dispatch_s={"code": 0.0}).dispatch_s) == {"code": 0.0}
    _refused(
        lambda: _node(dispatch_s={"code": -0.5}), "node n: dispatch_s.code must be >= 0, got -0.5"
    )
    _refused(
        lambda: _node(dispatch_s={"test": math.nan}),
        "node n: dispatch_s.test must be >= 0, got nan",
    )
    _refused(
        lambda: _node(dispatch_s={"tool": math.inf}),
        "node n: dispatch_s.tool must be >= 0, got inf",
    )


def test_a_parallel_start_is_finite_seconds_at_more_than_one_core_ascending() -> None:
    assert _node(parallel_start_s=((2.0, 0.0),)).parallel_start_s == ((2.0, 0.0),)
    _refused(
        lambda: _node(parallel_start_s=((1.0, 0.1),)),
        "node n: parallel_start_s at 1 cores must be a finite number of seconds >= 0, got 0.1",
    )
    _refused(
        lambda: _node(parallel_start_s=((2.0, -0.001),)),
        "node n: parallel_start_s at 2 cores must be a finite number of seconds >= 0, got -0.001",
    )
    _refused(
        lambda: _node(parallel_start_s=((2.0, math.inf),)),
        "node n: parallel_start_s at 2 cores must be a finite number of seconds >= 0, got inf",
    )
    _refused(
        lambda: _node(parallel_start_s=((math.inf, 0.1),)),
        "node n: parallel_start_s at inf cores must be a finite number of seconds >= 0, got 0.1",
    )
    _refused(
        lambda: _node(parallel_start_s=((2.0, math.nan),)),
        "node n: parallel_start_s at 2 cores must be a finite number of seconds >= 0, got nan",
    )
    _refused(
        lambda: _node(parallel_start_s=((4.0, 0.2), (2.0, 0.1))),
        "node n: parallel_start_s core counts must ascend",
    )
    _refused(
        lambda: _node(parallel_start_s=((2.0, 0.1), (2.0, 0.2))),
        "node n: parallel_start_s core counts must ascend",
    )


def test_parallel_start_for_interpolates_then_grows_per_worker() -> None:
    n = _node(parallel_start_s=((2.0, 0.004), (4.0, 0.01)))
    assert n.parallel_start_for(0.5) == 0.0 and n.parallel_start_for(1.0) == 0.0
    assert n.parallel_start_for(1.5) == pytest.approx(0.002, abs=1e-15)
    assert n.parallel_start_for(3.0) == pytest.approx(0.007, abs=1e-15)
    assert n.parallel_start_for(4.0) == pytest.approx(0.01, abs=1e-15)
    assert n.parallel_start_for(7.0) == pytest.approx(0.02, abs=1e-15)  # 0.01 x 6 / 3
    assert _node().parallel_start_for(4.0) == 0.0
    assert type(_node(parallel_start_s=((2.0, 1),)).parallel_start_for(2.0)) is float


def test_a_measured_start_is_met_exactly() -> None:
    # (the ratio taken first: c * (k - 1) / (k - 1) would round, 0.10000000000000002)
    assert _node(parallel_start_s=((4.0, 0.1),)).parallel_start_for(4.0) == 0.1
    assert _node(parallel_start_s=((2.0, 0.05), (4.0, 0.1))).parallel_start_for(4.0) == 0.1
    assert _node(parallel_start_s=((4.0, 0.1),)).parallel_start_for(7.0) == pytest.approx(0.2)


def test_a_parsed_parallel_start_and_its_errors() -> None:
    def node(**kw):
        return {
            "nodes": [{"name": "a", "capacity": {"cpu": 1}}, {"__line__": 6, "name": "b", **kw}]
        }

    got = parse_cluster(node(capacity={}, parallel_start_s={4: 0.01, 2: 0.004}))
    assert got.nodes[1].parallel_start_s == ((2.0, 0.004), (4.0, 0.01))
    assert got.nodes[0].parallel_start_s == ()
    assert all(type(x) is float for pt in got.nodes[1].parallel_start_s for x in pt)
    _spec_error(
        node(capacity={}, parallel_start_s=0.003),
        "<cluster>:6: nodes[1].parallel_start_s: must be a mapping of core count -> seconds, "
        "e.g. {2: 0.003}",
    )
    _spec_error(
        node(capacity={}, parallel_start_s={"__line__": 9, 1: 0.001}),
        "<cluster>:9: nodes[1].parallel_start_s.1: core count must be a number > 1",
    )
    _spec_error(
        node(capacity={}, parallel_start_s={"x": 0.001}),
        "<cluster>:6: nodes[1].parallel_start_s.x: core count must be a number > 1",
    )
    _spec_error(
        node(capacity={}, parallel_start_s={2: -0.001}),
        "<cluster>:6: nodes[1].parallel_start_s.2: must be a number of seconds >= 0, got -0.001",
    )
    _spec_error(
        node(capacity={}, parallel_start_s={2: "fast"}),
        "<cluster>:6: nodes[1].parallel_start_s.2: must be a number of seconds >= 0, got 'fast'",
    )
    assert parse_cluster(node(capacity={}, parallel_start_s={2: 0})).nodes[1].parallel_start_s == (
        (2.0, 0.0),
    )


def test_gpus_default_to_one_domain_and_none_without_gpus() -> None:
    assert _node(capacity=Resources(gpu=3)).gpu_domains == ((0, 1, 2),)
    assert _node(capacity=Resources(cpu=4)).gpu_domains == ()
    assert _node(capacity=Resources(gpu=4), gpu_domains=((0, 1), (2, 3))).gpu_domains == (
        (0, 1),
        (2, 3),
    )


def test_gpu_domains_are_disjoint_and_within_the_devices() -> None:
    assert _node(capacity=Resources(gpu=4), gpu_domains=((0,), (3,))).gpu_domains == ((0,), (3,))
    _refused(
        lambda: _node(capacity=Resources(gpu=4), gpu_domains=((0, 1), (1, 2))),
        "node n: a GPU appears in two NVLink domains",
    )
    _refused(
        lambda: _node(capacity=Resources(gpu=4), gpu_domains=((0, 4),)),
        "node n: gpu_domains name devices outside 0..3",
    )
    _refused(
        lambda: _node(capacity=Resources(gpu=4), gpu_domains=((-1, 0),)),
        "node n: gpu_domains name devices outside 0..3",
    )
    _refused(
        lambda: _node(capacity=Resources(cpu=1), gpu_domains=((0,),)),
        "node n: gpu_domains name devices outside 0..-1",
    )


def test_parallel_cores_interpolates_then_keeps_the_last_efficiency() -> None:
    n = _node(parallel_speedup=((2.0, 1.6), (4.0, 2.8)))
    assert n.parallel_cores(0.5) == 0.5
    assert n.parallel_cores(1.0) == 1.0
    assert n.parallel_cores(1.5) == pytest.approx(1.3, abs=1e-12)
    assert n.parallel_cores(2.0) == pytest.approx(1.6, abs=1e-12)
    assert n.parallel_cores(3.0) == pytest.approx(2.2, abs=1e-12)
    assert n.parallel_cores(4.0) == pytest.approx(2.8, abs=1e-12)
    assert n.parallel_cores(8.0) == pytest.approx(5.6, abs=1e-12)
    assert _node().parallel_cores(3.0) == 3.0  # ideal


def test_dispatch_for_falls_back_to_default_then_zero() -> None:
    assert _node().dispatch_for("code") == 0.0
    n = _node(dispatch_s={"code": 0.0, "default": 0.25})
    assert n.dispatch_for("code") == 0.0
    assert n.dispatch_for("test") == 0.25
    only = _node(dispatch_s={"code": 2})
    assert only.dispatch_for("test") == 0.0
    assert type(only.dispatch_for("code")) is float and only.dispatch_for("code") == 2.0


def test_gpu_count_and_memory_per_device() -> None:
    n = _node(capacity=Resources(gpu=4, gpu_memory_mb=64000))
    assert n.gpu_count == 4 and n.gpu_memory_per_device == 16000.0
    assert _node(capacity=Resources(gpu_memory_mb=100)).gpu_memory_per_device == 0.0
    d = _node()
    assert (
        d.pool == "default"
        and dict(d.labels) == {}
        and d.parallel_speedup == ()
        and dict(d.dispatch_s) == {}
    )


# ---- ModelSpec -----------------------------------------------------------------------------------


def test_model_defaults() -> None:
    m = ModelSpec("m")
    assert (
        m.kind,
        m.path,
        m.devices,
        m.memory_mb,
        m.dtype,
        m.load_s,
        m.swap_s,
        m.alpha,
        m.beta,
        m.max_batch,
        m.max_instances,
        m.host_memory_mb,
        dict(m.options),
        m.max_seqs,
        m.prefill_s,
    ) == ("scalar", None, 1, 1000.0, "float32", 10.0, 1.0, 0.02, 0.002, 64, 8, 0.0, {}, 0, 0.0)


def test_model_refusals_at_each_boundary() -> None:
    for kind in ("scalar", "similarity", "judge", "genjudge"):
        assert ModelSpec("m", kind=kind).kind == kind
    _refused(
        lambda: ModelSpec("m", kind="llm"), "model m: kind must be scalar|similarity|judge|genjudge"
    )
    assert (
        ModelSpec(
            "m", max_seqs=0, devices=1, max_batch=1, alpha=0.0, beta=0.0, prefill_s=0.0
        ).max_batch
        == 1
    )
    _refused(lambda: ModelSpec("m", max_seqs=-1), "model m: max_seqs must be >= 0, got -1")
    _refused(lambda: ModelSpec("m", devices=0), "model m: devices must be >= 1, got 0")
    _refused(lambda: ModelSpec("m", max_batch=0), "model m: max_batch must be >= 1")
    _refused(lambda: ModelSpec("m", alpha=-0.001), "model m: alpha and beta must be >= 0")
    _refused(lambda: ModelSpec("m", beta=-0.001), "model m: alpha and beta must be >= 0")
    _refused(
        lambda: ModelSpec("m", prefill_s=-1.0),
        "model m: prefill_s must be >= 0 and finite, got -1.0",
    )
    _refused(
        lambda: ModelSpec("m", prefill_s=math.inf),
        "model m: prefill_s must be >= 0 and finite, got inf",
    )


def test_batch_latency_and_knee() -> None:
    m = ModelSpec("m", alpha=0.5, beta=0.25, max_batch=64)
    assert m.batch_latency(4) == 1.5
    assert m.knee_batch == 8
    assert ModelSpec("m", alpha=0.033, beta=0.02).knee_batch == 7  # 6.6 rounds up
    assert ModelSpec("m", alpha=0.031, beta=0.02).knee_batch == 6  # 6.2 rounds down
    assert ModelSpec("m", alpha=1.0, beta=0.01, max_batch=32).knee_batch == 32
    assert ModelSpec("m", alpha=0.0, beta=0.01).knee_batch == 1
    assert ModelSpec("m", alpha=1.0, beta=0.0, max_batch=12).knee_batch == 12


# ---- ClusterSpec ---------------------------------------------------------------------------------


def test_cluster_names_are_unique() -> None:
    a, b = NodeSpec("a", Resources(cpu=1)), NodeSpec("b", Resources(cpu=2))
    _refused(lambda: ClusterSpec((a, a)), "node names must be unique")
    _refused(
        lambda: ClusterSpec((a, b), (ModelSpec("m"), ModelSpec("m"))), "model names must be unique"
    )
    spec = ClusterSpec((a, b), (ModelSpec("m"), ModelSpec("j", kind="judge")))
    assert spec.model("j") is spec.models[1] and spec.model("x") is None
    assert ClusterSpec((a,)).models == ()


def test_total_capacity_sums_every_node() -> None:
    spec = ClusterSpec(
        (NodeSpec("a", Resources(cpu=1, memory_mb=10)), NodeSpec("b", Resources(cpu=2, gpu=1)))
    )
    assert dict(spec.total_capacity()) == {"cpu": 3.0, "memory_mb": 10.0, "gpu": 1.0}


def test_scaled_keeps_a_rounded_share_of_each_pool_and_at_least_one() -> None:
    cpu = tuple(NodeSpec(f"c{i}", Resources(cpu=1), pool="cpu") for i in range(3))
    gpu = (NodeSpec("g0", Resources(gpu=1), pool="gpu"),)
    spec = ClusterSpec(cpu + gpu, (ModelSpec("m"),))
    half = spec.scaled(0.5)
    assert [n.name for n in half.nodes] == ["c0", "c1", "g0"]  # round(1.5) = 2; at least one
    assert half.models == spec.models
    assert [n.name for n in spec.scaled(0.4).nodes] == ["c0", "g0"]  # round(1.2) = 1
    assert [n.name for n in spec.scaled(2.0).nodes] == ["c0", "c1", "c2", "g0"]


def test_device_cores_are_finite_and_at_least_zero_parsed_with_their_line() -> None:
    assert _node().device_cores == 0.0  # devices of their own (GPUs) unless measured
    assert _node(device_cores=0.5).device_cores == 0.5
    for bad, shown in ((-0.25, "-0.25"), (math.inf, "inf"), (math.nan, "nan")):
        _refused(
            lambda bad=bad: _node(device_cores=bad),
            f"node n: device_cores must be a finite number >= 0, got {shown}",
        )

    def node(**kw):
        return {
            "nodes": [{"name": "a", "capacity": {"cpu": 1}}, {"__line__": 6, "name": "b", **kw}]
        }

    got = parse_cluster(node(capacity={}, device_cores=2))
    assert got.nodes[1].device_cores == 2.0 and type(got.nodes[1].device_cores) is float
    assert got.nodes[0].device_cores == 0.0
    assert parse_cluster(node(capacity={}, device_cores=0)).nodes[1].device_cores == 0.0
    assert parse_cluster(node(capacity={}, device_cores=None)).nodes[1].device_cores == 0.0
    for bad in (-1, "two", True, math.inf):
        _spec_error(
            node(capacity={}, device_cores=bad),
            f"<cluster>:6: nodes[1].device_cores: must be a number of cores >= 0, got {bad!r}",
        )


# ---- parse_cluster -------------------------------------------------------------------------------


def _spec_error(data, msg: str, source: str | None = None) -> None:
    with pytest.raises(SpecError) as info:
        parse_cluster(data) if source is None else parse_cluster(data, source)
    assert str(info.value) == msg


def test_strip_lines_and_finite() -> None:
    assert _strip_lines({"__line__": 1, "a": [{"__line__": 2, "b": 1}, 3]}) == {"a": [{"b": 1}, 3]}
    assert _finite(True) is None and _finite("1") is None and _finite(math.inf) is None
    assert _finite(math.nan) is None
    assert _finite(2) == 2.0 and type(_finite(2)) is float


def test_a_full_spec_parses() -> None:
    data = {
        "__line__": 1,
        "nodes": [
            {
                "__line__": 2,
                "name": "c",
                "count": 2,
                "pool": "cpu",
                "capacity": {"__line__": 3, "cpu": 4, "memory_mb": "8"},
                "labels": {"__line__": 4, "zone": 1},
                "parallel_speedup": {"__line__": 5, 4: 3.0, 2: 1.5},
                "dispatch_s": {"__line__": 6, "code": 0, "default": 0.5},
            },
            {
                "__line__": 7,
                "name": "g",
                "capacity": {"gpu": 2},
                "gpu_domains": [[0], ["1"]],
                "dispatch_s": 0.0,
            },
        ],
        "models": [
            {"__line__": 9, "name": "m", "kind": "judge", "options": {"__line__": 10, "x": 1}}
        ],
    }
    spec = parse_cluster(data)
    c0, c1, g = spec.nodes
    assert (c0.name, c1.name, g.name) == ("c-0", "c-1", "g")
    assert c0.pool == "cpu" and g.pool == "default"
    assert dict(c0.capacity) == {"cpu": 4.0, "memory_mb": 8.0}
    assert dict(c0.labels) == {"zone": "1"}
    assert c0.parallel_speedup == ((2.0, 1.5), (4.0, 3.0))
    assert dict(c0.dispatch_s) == {"code": 0.0, "default": 0.5}
    assert g.gpu_domains == ((0,), (1,)) and dict(g.dispatch_s) == {"default": 0.0}
    assert g.parallel_speedup == () and dict(g.labels) == {}
    (m,) = spec.models
    assert (m.name, m.kind, dict(m.options)) == ("m", "judge", {"x": 1})
    assert parse_cluster({"nodes": [{"name": "x", "capacity": {}}], "models": None}).models == ()


def test_the_root_and_the_node_list() -> None:
    _spec_error(
        [1], "<cluster>:1: <root>: a cluster spec is a mapping with 'nodes' (and optional 'models')"
    )
    _spec_error({"__line__": 3}, "f.yaml:3: nodes: must be a non-empty list", "f.yaml")
    _spec_error({"__line__": 3, "nodes": []}, "f.yaml:3: nodes: must be a non-empty list", "f.yaml")
    _spec_error({"nodes": {"name": "a"}}, "<cluster>: nodes: must be a non-empty list")
    two = [{"name": "a", "capacity": {}}, {"name": "a", "capacity": {}}]
    _spec_error({"nodes": two}, "<cluster>: nodes: node names must be unique")


def test_an_entry_is_a_mapping_of_known_fields_with_a_name() -> None:
    _spec_error({"nodes": [5]}, "<cluster>: nodes[0]: must be a mapping")
    _spec_error(
        {"nodes": [{"__line__": 4, "name": "a", "zz": 1, "yy": 2, "capacity": {}}]},
        "<cluster>:4: nodes[0].yy: unknown field",
    )
    _spec_error(
        {"nodes": [{"__line__": 4, "capacity": {}}]}, "<cluster>:4: nodes[0].name: is required"
    )
    _spec_error(
        {
            "nodes": [{"name": "a", "capacity": {}}],
            "models": [{"__line__": 8, "name": "m", "bad": 1}],
        },
        "<cluster>:8: models[0].bad: unknown field",
    )
    _spec_error(
        {
            "nodes": [{"name": "a", "capacity": {}}],
            "models": [{"__line__": 8, "name": "m", "devices": 0}],
        },
        "<cluster>:8: models[0]: model m: devices must be >= 1, got 0",
    )
    _spec_error(
        {
            "nodes": [{"name": "a", "capacity": {}}],
            "models": [{"__line__": 8, "name": "m"}, {"name": "m"}],
        },
        "<cluster>: nodes: model names must be unique",
    )


def test_a_node_s_fields_refused_with_its_line() -> None:
    def node(**kw):
        return {
            "nodes": [{"name": "a", "capacity": {"cpu": 1}}, {"__line__": 6, "name": "b", **kw}]
        }

    _spec_error(
        node(capacity=[1]),
        "<cluster>:6: nodes[1]: capacity must be a mapping of dimension -> amount",
    )
    _spec_error(
        node(capacity={"cpu": "x"}),
        "<cluster>:6: nodes[1]: capacity: could not convert string to float: 'x'",
    )
    _spec_error(
        node(capacity={"cpu": None}),
        "<cluster>:6: nodes[1]: capacity: float() argument must be a string or a real number, not 'NoneType'",
    )
    _spec_error(node(capacity={}, count=0), "<cluster>:6: nodes[1]: count must be >= 1")
    assert [n.name for n in parse_cluster(node(capacity={}, count=1)).nodes] == ["a", "b"]
    _spec_error(
        node(capacity={}, gpu_domains=[[0]]),
        "<cluster>:6: nodes[1]: node b: gpu_domains name devices outside 0..-1",
    )
    _spec_error(
        node(capacity={}, parallel_speedup=[2]),
        "<cluster>:6: nodes[1].parallel_speedup: must be a "
        "mapping of core count -> measured speedup, e.g. {2: 1.6}",
    )
    _spec_error(
        node(capacity={}, parallel_speedup={1: 1.0}),
        "<cluster>:6: nodes[1].parallel_speedup.1: core count must be a number > 1",
    )
    _spec_error(
        node(capacity={}, parallel_speedup={"__line__": 7, 2: 2.5}),
        "<cluster>:7: nodes[1].parallel_speedup.2: speedup must be a number in (0, 2], got 2.5",
    )
    _spec_error(
        node(capacity={}, parallel_speedup={2: 0}),
        "<cluster>:6: nodes[1].parallel_speedup.2: speedup must be a number in (0, 2], got 0",
    )
    _spec_error(
        node(capacity={}, parallel_speedup={"two": 1.5}),
        "<cluster>:6: nodes[1].parallel_speedup.two: core count must be a number > 1",
    )
    _spec_error(
        node(capacity={}, dispatch_s=-1),
        "<cluster>:6: nodes[1].dispatch_s: must be seconds >= 0 or "
        "a mapping kind -> seconds, got -1",
    )
    _spec_error(
        node(capacity={}, dispatch_s="1"),
        "<cluster>:6: nodes[1].dispatch_s: must be seconds >= 0 or "
        "a mapping kind -> seconds, got '1'",
    )
    _spec_error(
        node(capacity={}, dispatch_s={"__line__": 9, "gpu": 1}),
        "<cluster>:9: nodes[1].dispatch_s.gpu: unknown kind; one of ['code', 'custom', 'default', "
        "'judge', 'reward', 'test', 'tool']",
    )
    _spec_error(
        node(capacity={}, dispatch_s={"__line__": 9, "reward": -0.5}),
        "<cluster>:9: nodes[1].dispatch_s.reward: must be seconds >= 0, got -0.5",
    )
    _spec_error(
        node(capacity={}, dispatch_s={"judge": "x"}),
        "<cluster>:6: nodes[1].dispatch_s.judge: must be seconds >= 0, got 'x'",
    )
    ok = parse_cluster(
        node(
            capacity={},
            dispatch_s={
                k: 0 for k in ("code", "test", "tool", "custom", "reward", "judge", "default")
            },
        )
    )
    assert dict(ok.nodes[1].dispatch_s) == dict.fromkeys(
        ("code", "test", "tool", "custom", "reward", "judge", "default"), 0.0
    )


def test_a_measured_point_is_met_exactly() -> None:
    """At a measured core count the interpolation gives the measured speedup exactly (past the
    last point, ``s * k / k`` would round: 3.6399999999999997)."""
    assert _node(parallel_speedup=((5.0, 3.64),)).parallel_cores(5.0) == 3.64
    assert _node(parallel_speedup=((2.0, 1.5), (7.0, 4.84))).parallel_cores(7.0) == 4.84


def test_a_parsed_speedup_may_be_below_one_core_or_ideal() -> None:
    def spec(pts):
        return parse_cluster({"nodes": [{"name": "a", "capacity": {}, "parallel_speedup": pts}]})

    assert spec({2: 0.5}).nodes[0].parallel_speedup == ((2.0, 0.5),)
    assert spec({2: 2, 4: 3.5}).nodes[0].parallel_speedup == ((2.0, 2.0), (4.0, 3.5))
