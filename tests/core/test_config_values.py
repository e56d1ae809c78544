"""core/config.py's values (issue 43 item 2: the survivors of `make mutation` on it): every
field's default (module-level declarations, pinned by hand), and for every rule of
`CoreConfig.__post_init__` the value just inside its range accepted and the values just outside
refused with the whole message, word for word (`CoreConfig.<field>: <rule>, got <value!r>`,
ranges written `(lo, hi]` / `[lo, hi)` with `:g` bounds): each policy and routing, trajectories,
the task and tenant shares (0, 0.5, a bool, a string, inf, NaN, an empty mapping, a key that is
not a name), each range (its bound, both sides of it, a string, NaN), the integer counts (0, 1, a
float), the warm pool's keys and counts, the providers (a list, a duplicate name), the semaphore,
the bools and the two demands."""

from __future__ import annotations

import dataclasses
import math

import pytest

from arl_tangram.core.config import ENGINE_ROUTINGS, POLICIES, CoreConfig
from arl_tangram.core.providers import ProviderLimits
from arl_tangram.core.resources import Resources

DEFAULTS = {
    "policy": "tangram",
    "trajectories": None,
    "task_shares": None,
    "static_k": None,
    "aging_s": 30.0,
    "aging_relative": 50.0,
    "aging_min_s": 0.5,
    "reserve_fraction": 0.0,
    "estimate_quantile": 0.5,
    "sandbox_cold_s": 0.5,
    "model_idle_s": math.inf,
    "model_prewarm": True,
    "scale_out_batches": 0.0,
    "model_min_instances": 1,
    "max_batch_wait_s": 0.0,
    "stagger_batches": True,
    "max_load_failures": 3,
    "model_worker_retries": 1,
    "engine_routing": "cost",
    "session_demand": Resources(memory_mb=256),
    "session_action_demand": Resources(cpu=1, memory_mb=1024),
    "session_ttl_s": 600.0,
    "session_memory_headroom": 1.5,
    "session_memory_floor_mb": 64.0,
    "session_memory_overcommit": 3.0,
    "memory_high_watermark": 0.9,
    "rate_window_s": 60.0,
    "peak_memory_s": 600.0,
    "max_warm_per_node": None,
    "warm_keys": (),
    "warm_boot": None,
    "min_warm_per_node": 2,
    "elastic_step": 1.0,
    "short_action_s": 0.0,
    "history": 100_000,
    "fit_candidates": 4,
    "providers": (),
    "provider_policy": "tangram",
    "provider_semaphore": None,
    "provider_coalesce": True,
    "tenant_shares": None,
    "lend_floor": 0.5,
    "lend_anticipation_s": 0.02,
}


def test_every_default_by_hand() -> None:
    cfg = CoreConfig()
    assert [f.name for f in dataclasses.fields(CoreConfig)] == list(DEFAULTS)
    for name, want in DEFAULTS.items():
        assert getattr(cfg, name) == want, name
    assert POLICIES == ("tangram", "trajectory-bound", "task-isolated", "fifo", "static-pool")
    assert ENGINE_ROUTINGS == ("cost", "sticky", "least-loaded", "round-robin")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.policy = "fifo"  # type: ignore[misc]
    with pytest.raises(TypeError):
        CoreConfig("fifo")  # type: ignore[misc]  # keyword-only


def _refused(message: str, **kw: object) -> None:
    with pytest.raises(ValueError) as got:
        CoreConfig(**kw)  # type: ignore[arg-type]
    assert str(got.value) == message


# ---- accepted at the edge ---------------------------------------------------------------------

ACCEPTED = [
    *({"policy": p} for p in POLICIES),
    *({"engine_routing": r} for r in ENGINE_ROUTINGS),
    {"trajectories": 1},
    {"trajectories": None},
    {"task_shares": {"a": 0.5}},
    {"task_shares": {"a": 1, "b": 2.5}},
    {"tenant_shares": {"t": 0.5}},
    {"tenant_shares": {"t": 1, "u": 3.0}},
    {"static_k": 1e-9},
    {"static_k": 0.5},
    {"static_k": math.inf},
    {"aging_s": 0.5},
    {"aging_s": 1.0, "aging_min_s": 1.0},
    {"aging_s": 1e-9, "aging_min_s": 0.0},
    {"aging_relative": 1e-9},
    {"aging_relative": 0.5},
    {"aging_min_s": 0.0},
    {"reserve_fraction": 0.0},
    {"reserve_fraction": 0.999},
    {"estimate_quantile": 0.0},
    {"estimate_quantile": 1.0},
    {"estimate_quantile": 1},
    {"sandbox_cold_s": 0.0},
    {"model_idle_s": 0.0},
    {"model_idle_s": math.inf},
    {"max_batch_wait_s": 0},
    {"scale_out_batches": 0.0},
    {"short_action_s": 0.0},
    {"session_memory_headroom": 1.0},
    {"session_memory_floor_mb": 0.0},
    {"session_memory_floor_mb": 0.5},
    {"session_memory_overcommit": 1.0},
    {"memory_high_watermark": 1.0},
    {"memory_high_watermark": 1e-9},
    {"lend_floor": 1.0},
    {"lend_floor": 1e-9},
    {"lend_anticipation_s": 0.0},
    {"lend_anticipation_s": 60.0},
    {"session_ttl_s": 1e-9},
    {"rate_window_s": 0.5},
    {"peak_memory_s": 1e-9},
    {"elastic_step": 0.5},
    {"max_load_failures": 1},
    {"history": 1},
    {"fit_candidates": 1},
    {"model_prewarm": False},
    {"model_worker_retries": 0},
    {"model_min_instances": 0},
    {"warm_boot": {"py": 0}},
    {"warm_boot": {"py": 1}},
    {"warm_keys": ("py", "sh")},
    {"max_warm_per_node": 0},
    {"max_warm_per_node": None},
    {"min_warm_per_node": 0},
    {"providers": (ProviderLimits(name="s", rate=1.0), ProviderLimits(name="f", rate=2.0))},
    *({"provider_policy": p} for p in ("tangram", "semaphore", "static-split")),
    {"provider_semaphore": 1},
    {"provider_semaphore": None},
    {"provider_coalesce": False},
    {"session_demand": Resources()},
    {"session_action_demand": Resources(cpu=2)},
]


@pytest.mark.parametrize("kw", ACCEPTED, ids=repr)
def test_accepted_at_the_edge(kw: dict) -> None:
    cfg = CoreConfig(**kw)
    for name, value in kw.items():
        assert getattr(cfg, name) == value


# ---- refused, word for word -------------------------------------------------------------------

NUM = "must be a finite number > 0"
REFUSED = [
    (
        {"policy": "nope"},
        "CoreConfig.policy: must be one of tangram, trajectory-bound, "
        "task-isolated, fifo, static-pool, got 'nope'",
    ),
    ({"trajectories": 0}, "CoreConfig.trajectories: must be a positive integer or None, got 0"),
    ({"trajectories": 2.0}, "CoreConfig.trajectories: must be a positive integer or None, got 2.0"),
    ({"task_shares": {}}, "CoreConfig.task_shares: must name at least one task, got {}"),
    ({"task_shares": {"a": 0}}, f"CoreConfig.task_shares['a']: {NUM}, got 0"),
    ({"task_shares": {"a": 1, "b": -1.5}}, f"CoreConfig.task_shares['b']: {NUM}, got -1.5"),
    ({"task_shares": {"a": math.inf}}, f"CoreConfig.task_shares['a']: {NUM}, got inf"),
    ({"task_shares": {"a": math.nan}}, f"CoreConfig.task_shares['a']: {NUM}, got nan"),
    ({"task_shares": {"a": "1"}}, f"CoreConfig.task_shares['a']: {NUM}, got '1'"),
    ({"tenant_shares": {}}, "CoreConfig.tenant_shares: must name at least one tenant, got {}"),
    (
        {"tenant_shares": {1: 1.0}},
        "CoreConfig.tenant_shares: keys must be tenant names (str), got 1",
    ),
    ({"tenant_shares": {"t": 0}}, f"CoreConfig.tenant_shares['t']: {NUM}, got 0"),
    ({"tenant_shares": {"t": -0.5}}, f"CoreConfig.tenant_shares['t']: {NUM}, got -0.5"),
    ({"tenant_shares": {"t": True}}, f"CoreConfig.tenant_shares['t']: {NUM}, got True"),
    ({"tenant_shares": {"t": "1"}}, f"CoreConfig.tenant_shares['t']: {NUM}, got '1'"),
    ({"tenant_shares": {"t": math.inf}}, f"CoreConfig.tenant_shares['t']: {NUM}, got inf"),
    ({"tenant_shares": {"t": math.nan}}, f"CoreConfig.tenant_shares['t']: {NUM}, got nan"),
    ({"static_k": 0.0}, "CoreConfig.static_k: must be in (0, inf], got 0.0"),
    ({"static_k": "2"}, "CoreConfig.static_k: must be in (0, inf], got '2'"),
    ({"static_k": math.nan}, "CoreConfig.static_k: must be in (0, inf], got nan"),
    ({"aging_s": 0.0, "aging_min_s": 0.0}, "CoreConfig.aging_s: must be in (0, inf], got 0.0"),
    ({"aging_relative": 0.0}, "CoreConfig.aging_relative: must be in (0, inf], got 0.0"),
    ({"aging_min_s": -0.5}, "CoreConfig.aging_min_s: must be in [0, inf], got -0.5"),
    (
        {"aging_s": 1.0, "aging_min_s": 1.5},
        "CoreConfig.aging_min_s: must be <= aging_s (1.0), got 1.5",
    ),
    ({"reserve_fraction": 1.0}, "CoreConfig.reserve_fraction: must be in [0, 1), got 1.0"),
    ({"reserve_fraction": -0.1}, "CoreConfig.reserve_fraction: must be in [0, 1), got -0.1"),
    ({"estimate_quantile": 1.5}, "CoreConfig.estimate_quantile: must be in [0, 1], got 1.5"),
    ({"estimate_quantile": -0.01}, "CoreConfig.estimate_quantile: must be in [0, 1], got -0.01"),
    *(
        ({n: -0.5}, f"CoreConfig.{n}: must be in [0, inf], got -0.5")
        for n in (
            "sandbox_cold_s",
            "model_idle_s",
            "max_batch_wait_s",
            "scale_out_batches",
            "short_action_s",
        )
    ),
    (
        {"session_memory_headroom": 0.99},
        "CoreConfig.session_memory_headroom: must be in [1, inf], got 0.99",
    ),
    (
        {"session_memory_floor_mb": -1.0},
        "CoreConfig.session_memory_floor_mb: must be in [0, inf], got -1.0",
    ),
    (
        {"session_memory_overcommit": 0.5},
        "CoreConfig.session_memory_overcommit: must be in [1, inf], got 0.5",
    ),
    (
        {"memory_high_watermark": 0.0},
        "CoreConfig.memory_high_watermark: must be in (0, 1], got 0.0",
    ),
    (
        {"memory_high_watermark": 1.01},
        "CoreConfig.memory_high_watermark: must be in (0, 1], got 1.01",
    ),
    ({"lend_floor": 0.0}, "CoreConfig.lend_floor: must be in (0, 1], got 0.0"),
    ({"lend_floor": 1.5}, "CoreConfig.lend_floor: must be in (0, 1], got 1.5"),
    ({"lend_anticipation_s": -0.001}, "CoreConfig.lend_anticipation_s: must be in [0, 60], got -0.001"),
    ({"lend_anticipation_s": 61}, "CoreConfig.lend_anticipation_s: must be in [0, 60], got 61"),
    *(
        ({n: 0.0}, f"CoreConfig.{n}: must be in (0, inf], got 0.0")
        for n in ("session_ttl_s", "rate_window_s", "peak_memory_s", "elastic_step")
    ),
    *(
        ({n: 0}, f"CoreConfig.{n}: must be an integer >= 1, got 0")
        for n in ("max_load_failures", "history", "fit_candidates")
    ),
    *(
        ({n: 2.0}, f"CoreConfig.{n}: must be an integer >= 1, got 2.0")
        for n in ("max_load_failures", "history", "fit_candidates")
    ),
    ({"model_prewarm": 1}, "CoreConfig.model_prewarm: must be a bool, got 1"),
    (
        {"engine_routing": "x"},
        "CoreConfig.engine_routing: must be one of cost, sticky, least-loaded, round-robin, got 'x'",
    ),
    (
        {"model_worker_retries": -1},
        "CoreConfig.model_worker_retries: must be an integer >= 0, got -1",
    ),
    (
        {"model_worker_retries": 1.0},
        "CoreConfig.model_worker_retries: must be an integer >= 0, got 1.0",
    ),
    (
        {"model_min_instances": -1},
        "CoreConfig.model_min_instances: must be an integer >= 0, got -1",
    ),
    (
        {"model_min_instances": 1.0},
        "CoreConfig.model_min_instances: must be an integer >= 0, got 1.0",
    ),
    (
        {"warm_boot": {"py": -1}},
        "CoreConfig.warm_boot['py']: must be a count >= 0 of a non-empty key, got -1",
    ),
    (
        {"warm_boot": {"py": 1.0}},
        "CoreConfig.warm_boot['py']: must be a count >= 0 of a non-empty key, got 1.0",
    ),
    (
        {"warm_boot": {"": 1}},
        "CoreConfig.warm_boot['']: must be a count >= 0 of a non-empty key, got 1",
    ),
    (
        {"warm_boot": {3: 1}},
        "CoreConfig.warm_boot[3]: must be a count >= 0 of a non-empty key, got 1",
    ),
    (
        {"warm_keys": ["py"]},
        "CoreConfig.warm_keys: must be a tuple of non-empty strings, got ['py']",
    ),
    (
        {"warm_keys": ("py", "")},
        "CoreConfig.warm_keys: must be a tuple of non-empty strings, got ('py', '')",
    ),
    ({"warm_keys": (1,)}, "CoreConfig.warm_keys: must be a tuple of non-empty strings, got (1,)"),
    (
        {"max_warm_per_node": -1},
        "CoreConfig.max_warm_per_node: must be an integer >= 0 or None, got -1",
    ),
    (
        {"max_warm_per_node": 1.5},
        "CoreConfig.max_warm_per_node: must be an integer >= 0 or None, got 1.5",
    ),
    ({"min_warm_per_node": -1}, "CoreConfig.min_warm_per_node: must be an integer >= 0, got -1"),
    (
        {"min_warm_per_node": None},
        "CoreConfig.min_warm_per_node: must be an integer >= 0, got None",
    ),
    ({"min_warm_per_node": 1.5}, "CoreConfig.min_warm_per_node: must be an integer >= 0, got 1.5"),
    ({"providers": []}, "CoreConfig.providers: must be a tuple of ProviderLimits, got []"),
    ({"providers": ("s",)}, "CoreConfig.providers: must be a tuple of ProviderLimits, got ('s',)"),
    (
        {"provider_policy": "x"},
        "CoreConfig.provider_policy: must be one of tangram, semaphore, static-split, got 'x'",
    ),
    (
        {"provider_semaphore": 0},
        "CoreConfig.provider_semaphore: must be an integer >= 1 or None, got 0",
    ),
    (
        {"provider_semaphore": 2.0},
        "CoreConfig.provider_semaphore: must be an integer >= 1 or None, got 2.0",
    ),
    ({"provider_coalesce": 0}, "CoreConfig.provider_coalesce: must be a bool, got 0"),
    (
        {"providers": (ProviderLimits(name="s", rate=1.0), ProviderLimits(name="s", rate=2.0))},
        "CoreConfig.providers: must name each provider once, got ['s', 's']",
    ),
    (
        {"session_demand": {"cpu": 1}},
        "CoreConfig.session_demand: must be a Resources, got {'cpu': 1}",
    ),
    (
        {"session_action_demand": None},
        "CoreConfig.session_action_demand: must be a Resources, got None",
    ),
]


@pytest.mark.parametrize("kw, message", REFUSED, ids=repr)
def test_refused_word_for_word(kw: dict, message: str) -> None:
    _refused(message, **kw)
