"""Assembling an engine from a `ServiceConfig` (used by `tangram serve`, the demo and the SDK)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ..core.cluster import ModelSpec
from .config import ServiceConfig
from .engine import Engine, EngineConfig
from .local import LocalExecutor

log = logging.getLogger(__name__)


def engine_config(cfg: ServiceConfig) -> EngineConfig:
    lim = cfg.limits
    return EngineConfig(
        core=cfg.core, models=cfg.models, tick_s=lim.tick_s,
        result_ttl_s=lim.result_ttl_s, max_results=lim.max_results,
        idempotency_ttl_s=lim.idempotency_ttl_s, max_pending=lim.max_pending,
    )


def with_retrievers(cfg: ServiceConfig) -> ServiceConfig:
    """``cfg`` with a retriever model for every index `tangram index build` left under the
    index root (``$TANGRAM_INDEX_DIR``, else ``~/.cache/tangram/indexes``; issue 37), unless a
    model of that name is configured already."""
    from ..managers.retrieval.index import indexes, retriever_spec_fields

    names = {m.name for m in cfg.models}
    extra: list[ModelSpec] = []
    for path in indexes():
        if path.name in names:
            log.warning("index %s: a model of that name is configured; the index is not served", path.name)
            continue
        try:
            fields = retriever_spec_fields(path)
        except (OSError, ValueError) as exc:
            log.warning("index %s: not served: %s", path.name, exc)
            continue
        if fields["path"] is None:
            log.warning("index %s: no encoder (its model directory is gone and the packaged "
                        "MiniLM is not installed); not served", path.name)
            continue
        extra.append(ModelSpec(**fields))
    return dataclasses.replace(cfg, models=cfg.models + tuple(extra)) if extra else cfg


def build_engine(cfg: ServiceConfig, *, gpu_factories: Any = None, **kw: Any) -> Engine:
    """An unstarted engine over this machine's managers (a LocalExecutor), with the configured
    providers' API manager and the local indexes' retrievers."""
    cfg = with_retrievers(cfg)
    engine = Engine(LocalExecutor.from_config(cfg, gpu_factories=gpu_factories), engine_config(cfg), **kw)
    if cfg.providers:
        from .providers import ProviderFront, attach_api

        api = attach_api(engine, cfg.providers)
        front = ProviderFront(engine, api)
        engine.api = front
        engine.extra_stats["providers"] = front.stats
    return engine
