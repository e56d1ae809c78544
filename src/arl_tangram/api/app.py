"""The FastAPI application: SandboxFusion, native, reward-compat routes, metrics and dashboard.

Invariant: every route delegates to `Service`; every error maps to one status here (bad input
4xx naming the field, unknown id 404, overload 503/504, backend failure 502), so no request can
produce a 500 except a bug, which is logged with its traceback.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import Any

from fastapi import FastAPI, Header, Query, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ..core.errors import BrokenError, ClosedError, InvalidAction
from ..runtime.config import ServiceConfig
from ..runtime.engine import Engine, Overloaded, UnknownAction
from . import jupyter, metrics, openai_compat, search
from .fastpath import FastRunCode, until_disconnect
from .middleware import TENANT_KEY, BodyTooLarge, GuardMiddleware
from .schemas import (
    MAX_WAIT_S,
    ActionIn,
    ActionsIn,
    ClassifyIn,
    GetRewardIn,
    RunCodeRequest,
    RunCodeResponse,
    SessionIn,
    check_session_id,
)
from .service import KeyReused, Service, SessionExpired, SessionNotOpened, Shed, TooManySessions
from .tenancy import QuotaExceeded

log = logging.getLogger(__name__)


def _loc(err: dict[str, Any]) -> str:
    parts = [str(p) for p in err.get("loc", ()) if p != "body"]
    return ".".join(parts) or "body"


def _validation_body(errors: list[dict[str, Any]]) -> dict[str, Any]:
    detail = [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")),
               "type": str(e.get("type", ""))} for e in errors]
    message = "; ".join(f"{_loc(e)}: {e.get('msg', '')}" for e in errors[:5])
    return {"detail": detail, "message": message}


def _err(status: int, msg: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"detail": msg, **extra}, status_code=status)


def _overloaded(exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=503, headers={"retry-after": "1"})


# Exception class -> its response; looked up along the exception's MRO, as starlette does.
_ERRORS: dict[type[Exception], Callable[[Any], JSONResponse]] = {
    RequestValidationError: lambda e: JSONResponse(_validation_body(list(e.errors())), 422),
    ValidationError: lambda e: JSONResponse(_validation_body(list(e.errors())), 422),
    InvalidAction: lambda e: _err(400, str(e), field=e.field),
    UnknownAction: lambda e: _err(404, f"id: unknown action {e.args[0]!r}"),
    Overloaded: _overloaded,
    Shed: lambda e: _err(504, str(e)),
    KeyReused: lambda e: _err(422, str(e), field="idempotency_key"),
    SessionNotOpened: lambda e: _err(503, str(e)),
    SessionExpired: lambda e: _err(410, str(e), field="ttl_s"),
    TooManySessions: lambda e: JSONResponse({"detail": str(e)}, status_code=429,
                                            headers={"retry-after": "1"}),
    QuotaExceeded: lambda e: JSONResponse({"detail": str(e)}, status_code=429,
                                          headers={"retry-after": "1"}),
    ClosedError: lambda e: _err(503, str(e)),
    BrokenError: lambda e: _err(502, str(e)),
    BodyTooLarge: lambda e: _err(413, str(e)),
    # the client went away mid-body (or its stalled body was dropped: limits.body_timeout_s);
    # nobody reads the answer, and it is no bug to log
    ClientDisconnect: lambda e: _err(400, "body: the connection closed before the whole body"),
}


def error_response(exc: BaseException) -> JSONResponse | None:
    """The response an exception maps to (see the module invariant); None: not ours (a 500)."""
    for cls in type(exc).__mro__:
        make = _ERRORS.get(cls)
        if make is not None:
            return make(exc)
    return None


def _install_errors(app: FastAPI) -> None:
    async def handler(_r: Request, exc: Exception) -> JSONResponse:
        resp = error_response(exc)
        assert resp is not None
        return resp

    for cls in _ERRORS:
        app.add_exception_handler(cls, handler)

    async def http_error(r: Request, exc: Exception) -> Response:
        # FastAPI turns a body read that failed into "400: error parsing the body"; when the
        # guard stopped a chunked body at the size limit, the answer is our 413.
        if isinstance(exc.__cause__, BodyTooLarge):
            return _ERRORS[BodyTooLarge](exc.__cause__)
        return await http_exception_handler(r, exc)  # type: ignore[arg-type]

    app.add_exception_handler(StarletteHTTPException, http_error)


def tenant_of(request: Request) -> str | None:
    """The request's tenant (`GuardMiddleware`); None when no token is configured."""
    t = request.scope.get(TENANT_KEY)
    return t if isinstance(t, str) else None


async def _run_code_wire(svc: Service, req: RunCodeRequest,
                         tenant: str | None = None) -> dict[str, Any]:
    """/run_code's body; an overloaded engine answers 504 (shed) on this route."""
    try:
        return await svc.run_code(req, tenant=tenant)
    except Overloaded as exc:
        raise Shed(str(exc)) from None


def _dashboard_html() -> str:
    return resources.files("arl_tangram.api").joinpath("static/index.html").read_text()


async def _json_body(request: Request) -> Any:
    import json

    raw = await request.body()
    try:
        return json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidAction("body", f"not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidAction("body", "JSON nested too deeply") from None


class TangramApp(FastAPI):
    """FastAPI whose ``POST /run_code`` requests go first to ``fast`` (when set): the `/run_code`
    fast path inside its own `GuardMiddleware`, in front of FastAPI's and Starlette's layers.

    For such a request those layers only pass it on, unless FastAPI's own telemetry is on or a
    root path is set (then the request takes the full stack, where the same fast path sits
    inside the guard middleware); the one answer of theirs the fast path could need,
    ServerErrorMiddleware's plain 500 for a bug, it gives itself. What it does not serve it
    hands, body replayed, to the full stack, whose guard checks it again (same verdict).
    """

    fast: Any = None
    _telemetry_until = -1.0  # FastAPI's telemetry was seen off; asked again after this time

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        fast = self.fast
        if (fast is not None and scope.get("path") == "/run_code" and scope["type"] == "http"
                and scope.get("method") == "POST" and not self.root_path
                and not self._telemetry_on()):
            await fast(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    def _telemetry_on(self) -> bool:
        """FastAPI's own telemetry is on (a global OpenTelemetry provider is set). Asking costs
        more than the rest of the fast path's dispatch, so an "off" holds for up to a second
        (providers are set once, at start-up); an "on" is asked again every time."""
        now = time.monotonic()
        if now < self._telemetry_until:
            return False
        tel = getattr(self, "_native_telemetry", None)  # (FastAPI >= 0.16x)
        if tel is not None and tel.enabled():
            return True
        self._telemetry_until = now + 1.0
        return False


def create_app(engine: Engine, config: ServiceConfig, *, manage_engine: bool = False,
               fast_paths: bool = True, any_image_path: bool = False) -> FastAPI:
    """The ASGI app over ``engine``. With ``manage_engine`` its lifespan starts and closes it.

    ``any_image_path``: `POST /v1/images` imports any path the process can read, not only
    those under ``config.image_import_dirs`` (the embedded client: its caller is this process,
    as with `tangram image import`; never for a listening server).

    ``fast_paths`` serves valid ``POST /run_code`` requests in front of FastAPI's stack (same
    answers, less CPU; see `TangramApp` and `fastpath`); False leaves every request to the
    FastAPI routes.
    """

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if manage_engine:
            await engine.start()
        try:
            yield
        finally:
            if manage_engine:
                await engine.aclose(grace_s=2.0)

    app = TangramApp(title="ARL-Tangram", version="0.1.0", lifespan=lifespan,
                     description="Action-level external-resource orchestration for agentic RL.",
                     responses=_COMMON_RESPONSES)
    svc = Service(engine, config)
    app.state.service = svc
    app.state.registry = metrics.make_registry(engine)
    _install_errors(app)
    _routes(app, svc, config, any_image_path)
    jupyter.add_routes(app, svc)
    search.add_routes(app, svc)  # /retrieve, /v1/search, /v1/fetch (issue 37)
    openai_compat.add_routes(app, svc)  # /v1/chat/completions, /v1/completions (issue 38)

    async def run_code(req: RunCodeRequest, tenant: str | None) -> dict[str, Any]:
        return await _run_code_wire(svc, req, tenant)

    if fast_paths:  # inside the guard: token and body limit are checked first
        app.add_middleware(FastRunCode, run_code=run_code, error_response=error_response)
    tenants = {t.token: t.name for t in config.all_tenants()}
    uploads = [("PUT", "/v1/images/", config.image_max_upload_bytes)]  # archives in the body
    app.add_middleware(GuardMiddleware, tenants=tenants,
                       max_body_bytes=config.limits.max_body_bytes, uploads=uploads)
    if fast_paths:  # the same again, in front of FastAPI's layers (see TangramApp)

        async def full_stack(scope: Any, receive: Any, send: Any) -> None:
            await FastAPI.__call__(app, scope, receive, send)

        app.fast = GuardMiddleware(
            FastRunCode(full_stack, run_code=run_code, error_response=error_response,
                        outermost=True),
            tenants=tenants, max_body_bytes=config.limits.max_body_bytes, uploads=uploads)
    return app


def _doc(text: str) -> dict[str, Any]:
    return {"description": text}


# Statuses any route may answer (documented in the OpenAPI schema: docs/api.md's table)
_COMMON_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _doc("bad input: the detail names the field"),
    401: _doc("missing or bad bearer token (when a token is configured)"),
    413: _doc("body larger than limits.max_body_bytes"),
}
_BUSY: dict[int | str, dict[str, Any]] = {429: _doc("a quota reached (limits.max_sessions, or the tenant's)"),
         503: _doc("overloaded (limits.max_pending), or the engine is closed")}
_UNKNOWN: dict[int | str, dict[str, Any]] = {404: _doc("unknown id (or another tenant's)")}


def _health(engine: Engine) -> JSONResponse:
    """Ready while there is a node and every node not lost can run actions now. A lost node
    (Ray: its machine or agent died; the scheduler places nothing there, and a replacement
    agent joins under a new name) is listed, not ready, but does not hold the service down."""
    nodes = {}
    for n in engine.cluster_view().nodes:
        ready = n.alive and n.ready
        entry: dict[str, Any] = {"ready": ready}
        if not n.alive:
            entry["lost"] = True
        if not ready:
            entry["reason"] = (n.reason if n.alive else "the node is lost") or "not ready"
        nodes[n.name] = entry
    live = {k: v for k, v in nodes.items() if not v.get("lost")}
    ready = bool(live) and all(v["ready"] for v in live.values())
    body: dict[str, Any] = {"ready": ready, "nodes": nodes}
    if not ready:
        body["reason"] = "; ".join(f"{k}: {v['reason']}" for k, v in live.items()
                                   if not v["ready"]) or "no node"
    return JSONResponse(body, status_code=200 if ready else 503,
                        headers=None if ready else {"retry-after": "1"})


def _routes(app: FastAPI, svc: Service, config: ServiceConfig,
            any_image_path: bool = False) -> None:
    html = _dashboard_html()

    @app.get("/v1/ping", tags=["sandbox"])
    async def ping() -> str:
        return "pong"

    @app.get("/v1/health", tags=["ops"],
             responses={503: {"description": "a node is not ready (the reason per node)"}})
    async def health() -> Response:
        """Readiness, apart from liveness (`/v1/ping`): 200 when every node can run actions now,
        503 with each node's reason while one cannot (its fork server restarting, marked down)."""
        return _health(svc.engine)

    @app.post("/run_code", response_model=RunCodeResponse, tags=["sandbox"],
              responses={**_BUSY, 504: {"description": "shed: no answer within the deadline"}})
    async def run_code(req: RunCodeRequest, request: Request) -> Response:
        out = await until_disconnect(request.receive,
                                     _run_code_wire(svc, req, tenant_of(request)))
        if out is None:  # the client went away: its action was cancelled (issue 41, L1)
            return Response(status_code=499)
        return JSONResponse(out)

    @app.post("/v1/actions", tags=["native"], responses=_BUSY)
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
        return JSONResponse(await svc.submit(body, idempotency_key=idempotency_key,
                                             tenant=tenant_of(request)))

    @app.get("/v1/actions/{action_id}", tags=["native"], responses=_UNKNOWN)
    async def get_action(request: Request, action_id: str,
                         wait: float = Query(0.0, ge=0, le=MAX_WAIT_S,
                                             allow_inf_nan=False)) -> Response:
        return JSONResponse(await svc.get(action_id, wait, tenant=tenant_of(request)))

    @app.delete("/v1/actions/{action_id}", tags=["native"], responses={**_UNKNOWN, **_BUSY})
    async def cancel(request: Request, action_id: str) -> Response:
        return JSONResponse({"id": action_id,
                             "cancelled": await svc.cancel(action_id, tenant=tenant_of(request))})

    @app.post("/v1/sessions", tags=["native"], status_code=201, responses={
        **_BUSY, 202: _doc("not open yet after limits.session_open_wait_s: waiting for room on "
                           "a node (state 'opening')"),
        410: _doc("its own ttl_s passed before its node opened it (field ttl_s)"),
        503: _doc("the node could not open it (the node's reason), or overloaded")})
    async def open_session(request: Request, body: SessionIn | None = None) -> Response:
        out = await svc.open_session(body or SessionIn.model_validate({}),
                                     tenant=tenant_of(request))
        return JSONResponse(out, status_code=201 if out["state"] == "open" else 202)

    @app.delete("/v1/sessions/{session_id}", tags=["native"], responses={**_UNKNOWN, **_BUSY})
    async def close_session(request: Request, session_id: str) -> Response:
        check_session_id(session_id)  # (400 naming session_id: NUL, '/', '..', controls)
        if not await svc.close_session(session_id, tenant=tenant_of(request)):
            return JSONResponse({"detail": f"session_id: no open session {session_id!r}"}, 404)
        return JSONResponse({"session_id": session_id, "closed": True})

    from . import images as image_routes  # POST/GET/DELETE /v1/images (issue 17)

    image_routes.install(app, svc.engine, config.image_import_dirs, any_path=any_image_path,
                         tenancy=svc.tenancy, upload_dir=config.image_upload_dir,
                         body_timeout_s=config.limits.body_timeout_s)

    @app.get("/v1/cluster", tags=["native"])
    async def cluster(request: Request) -> Response:
        """Nodes, their use and warm state; a tenant sees its own and the shared images, of
        others' only how many (`Tenancy.cluster_view`)."""
        return JSONResponse(svc.tenancy.cluster_view(tenant_of(request),
                                                     svc.engine.cluster_view()).to_dict())

    @app.get("/v1/stats", tags=["native"])
    async def stats() -> Response:
        return JSONResponse(svc.engine.stats_view().to_dict())

    @app.post("/get_reward", tags=["reward"],
              responses={**_BUSY, 502: _doc("the model failed to score")})
    async def get_reward(body: GetRewardIn, request: Request) -> Response:
        return JSONResponse(await svc.get_reward(body, tenant=tenant_of(request)))

    @app.post("/classify", tags=["reward"],
              responses={**_BUSY, 502: _doc("the model failed to score")})
    async def classify(body: ClassifyIn, request: Request) -> Response:
        return JSONResponse(await svc.classify(body, tenant=tenant_of(request)))

    @app.get("/metrics", tags=["ops"], response_class=Response, responses={
        200: {"description": "Prometheus text format",
              "content": {metrics.CONTENT_TYPE: {"schema": {"type": "string"}}}}})
    async def prometheus() -> Response:
        return Response(metrics.render(app.state.registry), media_type=metrics.CONTENT_TYPE)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse(html)
