"""Assembling an engine from a `ServiceConfig` (used by `tangram serve`, the demo and the SDK)."""

from __future__ import annotations

from typing import Any

from .config import ServiceConfig
from .engine import Engine, EngineConfig
from .local import LocalExecutor


def engine_config(cfg: ServiceConfig) -> EngineConfig:
    lim = cfg.limits
    return EngineConfig(
        policy=cfg.policy, models=cfg.models, scheduler=cfg.scheduler, tick_s=lim.tick_s, result_ttl_s=lim.result_ttl_s,
        max_results=lim.max_results, idempotency_ttl_s=lim.idempotency_ttl_s,
        max_pending=lim.max_pending,
    )


def build_engine(cfg: ServiceConfig, *, gpu_factories: Any = None, **kw: Any) -> Engine:
    """An unstarted engine over this machine's managers (a LocalExecutor)."""
    return Engine(LocalExecutor.from_config(cfg, gpu_factories=gpu_factories), engine_config(cfg), **kw)
