"""One real service for the e2e tests: real sandboxes, real models, uvicorn on a free port."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def model_specs(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    from arl_tangram.managers.gpu.testing import build_tiny_models, tiny_model_specs

    paths = build_tiny_models(tmp_path_factory.mktemp("models"))
    return tuple(s for s in tiny_model_specs(paths) if s.name in ("tiny-rm", "tiny-safety", "minilm"))


@pytest.fixture(scope="session")
def server(model_specs: tuple) -> Iterator[str]:
    import uvicorn

    from arl_tangram.api.app import create_app
    from arl_tangram.runtime.build import build_engine
    from arl_tangram.runtime.config import ServiceConfig

    cfg = ServiceConfig(models=model_specs, default_reward_model="tiny-rm", port=free_port())
    app = create_app(build_engine(cfg), cfg, manage_engine=True)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=cfg.port, log_level="warning",
                                        lifespan="on"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    deadline = time.monotonic() + 120
    while not srv.started:
        if not th.is_alive() or time.monotonic() > deadline:
            pytest.fail("the service did not start")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{cfg.port}"
    srv.should_exit = True
    th.join(timeout=30)
