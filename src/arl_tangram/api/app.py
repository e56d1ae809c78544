"""The FastAPI application: SandboxFusion, native, reward-compat routes, metrics and dashboard.

Invariant: every route delegates to `Service`; every error maps to one status here (bad input
4xx naming the field, unknown id 404, overload 503/504, backend failure 502), so no request can
produce a 500 except a bug, which is logged with its traceback.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

from fastapi import FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import ValidationError

from ..core.errors import BrokenError, ClosedError, InvalidAction
from ..runtime.config import ServiceConfig
from ..runtime.engine import Engine, Overloaded, UnknownAction
from . import jupyter, metrics
from .middleware import BodyTooLarge, GuardMiddleware
from .schemas import (
    ActionIn,
    ActionsIn,
    ClassifyIn,
    GetRewardIn,
    RunCodeRequest,
    RunCodeResponse,
    SessionIn,
)
from .service import Service, Shed

log = logging.getLogger(__name__)


def _loc(err: dict[str, Any]) -> str:
    parts = [str(p) for p in err.get("loc", ()) if p != "body"]
    return ".".join(parts) or "body"


def _validation_body(errors: list[dict[str, Any]]) -> dict[str, Any]:
    detail = [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")),
               "type": str(e.get("type", ""))} for e in errors]
    message = "; ".join(f"{_loc(e)}: {e.get('msg', '')}" for e in errors[:5])
    return {"detail": detail, "message": message}


def _install_errors(app: FastAPI) -> None:
    def err(status: int, msg: str, **extra: Any) -> JSONResponse:
        return JSONResponse({"detail": msg, **extra}, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _val(_r: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(_validation_body(list(exc.errors())), status_code=422)

    @app.exception_handler(ValidationError)
    async def _val2(_r: Request, exc: ValidationError) -> JSONResponse:
        return JSONResponse(_validation_body(list(exc.errors())), status_code=422)

    @app.exception_handler(InvalidAction)
    async def _inv(_r: Request, exc: InvalidAction) -> JSONResponse:
        return err(400, str(exc), field=exc.field)

    @app.exception_handler(UnknownAction)
    async def _unk(_r: Request, exc: UnknownAction) -> JSONResponse:
        return err(404, f"id: unknown action {exc.args[0]!r}")

    @app.exception_handler(Overloaded)
    async def _over(_r: Request, exc: Overloaded) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503, headers={"retry-after": "1"})

    @app.exception_handler(Shed)
    async def _shed(_r: Request, exc: Shed) -> JSONResponse:
        return err(504, str(exc))

    @app.exception_handler(ClosedError)
    async def _closed(_r: Request, exc: ClosedError) -> JSONResponse:
        return err(503, str(exc))

    @app.exception_handler(BrokenError)
    async def _broken(_r: Request, exc: BrokenError) -> JSONResponse:
        return err(502, str(exc))

    @app.exception_handler(BodyTooLarge)
    async def _big(_r: Request, exc: BodyTooLarge) -> JSONResponse:
        return err(413, str(exc))


def _dashboard_html() -> str:
    return resources.files("arl_tangram.api").joinpath("static/index.html").read_text()


async def _json_body(request: Request) -> Any:
    import json

    raw = await request.body()
    try:
        return json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidAction("body", f"not valid JSON: {exc}") from None


def create_app(engine: Engine, config: ServiceConfig, *, manage_engine: bool = False) -> FastAPI:
    """The ASGI app over ``engine``. With ``manage_engine`` its lifespan starts and closes it."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if manage_engine:
            await engine.start()
        try:
            yield
        finally:
            if manage_engine:
                await engine.aclose(grace_s=2.0)

    app = FastAPI(title="ARL-Tangram", version="0.1.0", lifespan=lifespan,
                  description="Action-level external-resource orchestration for agentic RL.")
    svc = Service(engine, config)
    app.state.service = svc
    app.state.registry = metrics.make_registry(engine)
    _install_errors(app)
    _routes(app, svc, config)
    jupyter.add_routes(app, svc)
    app.add_middleware(GuardMiddleware, token=config.token,
                       max_body_bytes=config.limits.max_body_bytes)
    return app


def _routes(app: FastAPI, svc: Service, config: ServiceConfig) -> None:
    html = _dashboard_html()

    @app.get("/v1/ping", tags=["sandbox"])
    async def ping() -> str:
        return "pong"

    @app.post("/run_code", response_model=RunCodeResponse, tags=["sandbox"],
              responses={504: {"description": "shed: no answer within the deadline"}})
    async def run_code(req: RunCodeRequest) -> Response:
        try:
            body = await svc.run_code(req)
        except Overloaded as exc:
            raise Shed(str(exc)) from None
        return JSONResponse(body)

    @app.post("/v1/actions", tags=["native"])
    async def submit(request: Request,
                     idempotency_key: str | None = Header(None, max_length=200)) -> Response:
        raw = await _json_body(request)
        if not isinstance(raw, dict):
            raise InvalidAction("body", "must be a JSON object (an action, or {'actions': [...]})")
        if "actions" in raw:
            body = ActionsIn.model_validate(raw)
        else:
            opts = {k: raw.pop(k) for k in ("wait", "wait_s", "idempotency_key") if k in raw}
            body = ActionsIn.model_validate({"actions": [ActionIn.model_validate(raw)], **opts})
        return JSONResponse(await svc.submit(body, idempotency_key=idempotency_key))

    @app.get("/v1/actions/{action_id}", tags=["native"])
    async def get_action(action_id: str, wait: float = Query(0.0, ge=0)) -> Response:
        return JSONResponse(await svc.get(action_id, wait))

    @app.delete("/v1/actions/{action_id}", tags=["native"])
    async def cancel(action_id: str) -> Response:
        return JSONResponse({"id": action_id, "cancelled": await svc.cancel(action_id)})

    @app.post("/v1/sessions", tags=["native"], status_code=201)
    async def open_session(body: SessionIn | None = None) -> Response:
        out = await svc.open_session(body or SessionIn())
        return JSONResponse(out, status_code=201)

    @app.delete("/v1/sessions/{session_id}", tags=["native"])
    async def close_session(session_id: str) -> Response:
        if not await svc.close_session(session_id):
            return JSONResponse({"detail": f"session_id: no open session {session_id!r}"}, 404)
        return JSONResponse({"session_id": session_id, "closed": True})

    @app.get("/v1/cluster", tags=["native"])
    async def cluster() -> Response:
        return JSONResponse(svc.engine.cluster())

    @app.get("/v1/stats", tags=["native"])
    async def stats() -> Response:
        return JSONResponse(svc.engine.stats())

    @app.post("/get_reward", tags=["reward"])
    async def get_reward(body: GetRewardIn) -> Response:
        return JSONResponse(await svc.get_reward(body))

    @app.post("/classify", tags=["reward"])
    async def classify(body: ClassifyIn) -> Response:
        return JSONResponse(await svc.classify(body))

    @app.get("/metrics", tags=["ops"])
    async def prometheus() -> Response:
        return Response(metrics.render(app.state.registry), media_type=metrics.CONTENT_TYPE)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse(html)
