"""A direct ASGI path for the hot route, ``POST /run_code``, below FastAPI's routing layers.

Invariant: the fast path answers a request only when its JSON body validates as a
`RunCodeRequest` exactly as FastAPI would validate it (``json.loads`` then the model in Python
mode); the answer is byte-for-byte the one the FastAPI route gives (same JSON encoding, same
headers, same error mapping via `error_response`). Anything else (another route, a non-JSON
content type, a body that does not parse or validate, a mounted app) is handed, with its body
replayed unchanged, to the FastAPI app, whose answers (422 naming the field, ...) therefore stay
the only ones for bad input. It runs inside `GuardMiddleware`, so token and body limit apply first
(and the request's tenant, from the scope, goes with it to `Service.run_code`).

With ``outermost`` it stands in front of FastAPI altogether (`app.TangramApp`): then it also
does what Starlette's ServerErrorMiddleware would do for it, a plain-text 500 for an exception
no handler maps (a bug), and the exception goes on to the server, which logs it; a request it
hands on is marked, so that the instance inside FastAPI's stack passes it straight through.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from pydantic import ValidationError
from starlette.responses import PlainTextResponse

from .middleware import TENANT_KEY, BodyTooLarge
from .schemas import RunCodeRequest

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
RunCode = Callable[[RunCodeRequest, "str | None"], Awaitable[dict[str, Any]]]  # (req, tenant)
ErrorResponse = Callable[[BaseException], Any]  # an exception -> a starlette Response, or None

_JSON_TYPES = frozenset({b"application/json", b"application/json; charset=utf-8",
                         b"application/json;charset=utf-8"})
_HEADERS_TAIL = (b"content-type", b"application/json")
_HANDED_ON = "tangram.fastpath.handed_on"  # scope key: an outer fast path passed this on


def encode(body: Any) -> bytes:
    """Exactly starlette's `JSONResponse.render`."""
    return json.dumps(body, ensure_ascii=False, allow_nan=False, indent=None,
                      separators=(",", ":")).encode("utf-8")


class FastRunCode:
    """ASGI middleware: serves valid ``POST /run_code`` itself, passes everything else on."""

    def __init__(self, app: Any, *, run_code: RunCode, error_response: ErrorResponse,
                 outermost: bool = False) -> None:
        self.app, self.run_code, self.error_response = app, run_code, error_response
        self.outermost = outermost

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["path"] != "/run_code" or scope["method"] != "POST"
                or scope.get("root_path") or _HANDED_ON in scope):
            await self._hand_on(scope, receive, send)
            return
        try:
            raw, more = await _read_body(receive)
        except BodyTooLarge as exc:
            await self.error_response(exc)(scope, receive, send)
            return
        if more is None:
            return  # the client went away before sending its body
        req = _parse(scope, raw)
        if req is None:
            await self._hand_on(scope, _replay(raw, receive), send)
            return
        try:
            out = await until_disconnect(receive, self.run_code(req, scope.get(TENANT_KEY)))
            if out is None:
                return  # the client went away: its action was cancelled; nobody to answer
        except Exception as exc:
            resp = self.error_response(exc)
            if resp is None:
                await self._server_error(scope, receive, send)
                raise
            await resp(scope, receive, send)
            return
        try:
            data = encode(out)
        except Exception:
            await self._server_error(scope, receive, send)
            raise
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(data)).encode()), _HEADERS_TAIL]})
        await send({"type": "http.response.body", "body": data})

    async def _hand_on(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.outermost:
            scope[_HANDED_ON] = True
        await self.app(scope, receive, send)

    async def _server_error(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ServerErrorMiddleware's answer to a bug (nothing has been sent yet), when it is not
        in front of us to give it."""
        if self.outermost:
            resp: Any = PlainTextResponse("Internal Server Error", status_code=500)
            await resp(scope, receive, send)


T = TypeVar("T")


async def until_disconnect(receive: Callable[[], Awaitable[Mapping[str, Any]]],
                           work: Awaitable[T]) -> T | None:
    """``work``'s result, or None when the client disconnects first (issue 41, L1): ``work``
    is then cancelled (`Service.run_code` cancels its action on that). The request's body must
    have been read: the next ``receive`` waits for the disconnect (ASGI ``http.disconnect``,
    which the server also sends once the response is complete).

    ``work`` runs in the caller's task; one watcher task waits for the disconnect and cancels
    the caller (a task and an ``asyncio.wait`` more cost ~23 us a request, this ~8 us)."""
    me = asyncio.current_task()
    assert me is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        me.cancel()

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise
        me.uncancel()  # (our own cancel, spent: the caller's task goes on)
        return None
    finally:
        watcher.cancel()  # (before it runs again: a result in flight is never cancelled late)


async def _read_body(receive: Receive) -> tuple[bytes, bool | None]:
    """The whole body; ``None`` as the second item when the client disconnected."""
    chunks: list[bytes] = []
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return b"", None
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body", False):
            return b"".join(chunks), False


def _parse(scope: Scope, raw: bytes) -> RunCodeRequest | None:
    """The request when FastAPI would accept it as is; None for the FastAPI route to answer."""
    ctype = None
    for k, v in scope.get("headers", ()):
        if k == b"content-type":
            if ctype is not None:
                return None  # repeated header: let FastAPI decide
            ctype = v
    if ctype is None or ctype.lower() not in _JSON_TYPES or not raw:
        return None
    try:
        obj = json.loads(raw)
        return RunCodeRequest.model_validate(obj) if isinstance(obj, dict) else None
    except (ValueError, ValidationError, RecursionError):
        return None


def _replay(raw: bytes, receive: Receive) -> Receive:
    sent = False

    async def again() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()

    return again
