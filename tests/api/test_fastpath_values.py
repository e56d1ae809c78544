"""`api/fastpath.py` driven as bare ASGI (issue 43 item 2, helper-41): `FastRunCode` around a
recording inner app, with a stub ``run_code`` and ``error_response``, and `until_disconnect` on
its own. Pinned: which requests it serves (``POST /run_code``, no root_path, not handed on
already, an accepted JSON content type, a body that validates) and which it hands on (the body
replayed byte for byte, then the client's own messages), the marker an outermost one sets, the
answer's exact messages (status, the two headers in order, the bytes starlette would render),
a body read across chunks, a client gone before its body or during the work (nothing sent, the
work cancelled, the caller's task not left cancelling), errors mapped or re-raised (the plain
500 only when outermost), and `encode`'s exact bytes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.responses import JSONResponse

from arl_tangram.api import fastpath as F
from arl_tangram.api.middleware import TENANT_KEY, BodyTooLarge
from arl_tangram.api.schemas import RunCodeRequest

JSON = (b"content-type", b"application/json")


def _scope(
    path: str = "/run_code", method: str = "POST", headers: Any = (JSON,), **kw: Any
) -> dict[str, Any]:
    return {
        "type": "http",
        "path": path,
        "method": method,
        "headers": list(headers),
        "root_path": "",
        **kw,
    }


class _Client:
    """The client's messages (then a disconnect after ``gone_after`` s, or never) and what it
    was sent."""

    def __init__(
        self,
        *bodies: bytes,
        gone_after: float | None = None,
        msgs: list[dict[str, Any]] | None = None,
    ) -> None:
        if msgs is None:
            msgs = [
                {"type": "http.request", "body": b, "more_body": i < len(bodies) - 1}
                for i, b in enumerate(bodies)
            ]
        self.msgs, self.gone_after = msgs, gone_after
        self.sent: list[dict[str, Any]] = []
        self.received = 0

    async def receive(self) -> dict[str, Any]:
        self.received += 1
        if self.msgs:
            return self.msgs.pop(0)
        if self.gone_after is None:
            await asyncio.sleep(3600)
        await asyncio.sleep(self.gone_after or 0)
        return {"type": "http.disconnect"}

    async def send(self, m: dict[str, Any]) -> None:
        self.sent.append(m)


class _Inner:
    """The FastAPI app stand-in: records the scope and the whole body it read."""

    def __init__(self, then_receive: bool = False) -> None:
        self.calls: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
        self.then_receive = then_receive  # read once more after the body (the disconnect)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        got: list[dict[str, Any]] = []
        if scope["type"] == "http":
            while True:
                m = await receive()
                got.append(m)
                if m["type"] != "http.request" or not m.get("more_body"):
                    break
            if self.then_receive:
                got.append(await receive())
        self.calls.append((dict(scope), got))
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"inner"})


class _Run:
    def __init__(self, answer: Any = None, delay: float = 0.0) -> None:
        self.calls: list[tuple[RunCodeRequest, Any]] = []
        self.answer, self.delay, self.cancelled = answer, delay, False

    async def __call__(self, req: RunCodeRequest, tenant: Any) -> Any:
        self.calls.append((req, tenant))
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def _errors(mapped: dict[type, int]) -> Any:
    seen: list[BaseException] = []

    def error_response(exc: BaseException) -> Any:
        seen.append(exc)
        for t, status in mapped.items():
            if isinstance(exc, t):
                return JSONResponse({"detail": str(exc)}, status_code=status)
        return None

    error_response.seen = seen  # type: ignore[attr-defined]
    return error_response


def _mw(
    run: _Run, inner: _Inner | None = None, errors: Any = None, outermost: bool = False
) -> F.FastRunCode:
    return F.FastRunCode(
        inner or _Inner(), run_code=run, error_response=errors or _errors({}), outermost=outermost
    )


# -- encode --------------------------------------------------------------------------------


def test_encode_is_starlettes_json() -> None:
    body = {"é": "\u2028", "n": [1, 2.5, None, True], "s": 'a"b'}
    assert F.encode(body) == JSONResponse(body).body
    assert F.encode(body) == b'{"\xc3\xa9":"\xe2\x80\xa8","n":[1,2.5,null,true],"s":"a\\"b"}'
    with pytest.raises(ValueError):
        F.encode({"x": float("nan")})


# -- served --------------------------------------------------------------------------------


async def test_serves_a_valid_request_exactly() -> None:
    run, inner = _Run({"status": "Success", "é": 1}), _Inner()
    c = _Client(b'{"code": "pr', b'int(1)", "language": "python"}')
    await _mw(run, inner)(_scope(**{TENANT_KEY: "t1"}), c.receive, c.send)
    data = b'{"status":"Success","\xc3\xa9":1}'
    assert c.sent == [
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-length", str(len(data)).encode()),
                (b"content-type", b"application/json"),
            ],
        },
        {"type": "http.response.body", "body": data},
    ]
    ((req, tenant),) = run.calls
    assert (req.code, req.language, tenant) == ("print(1)", "python", "t1")
    assert inner.calls == []


@pytest.mark.parametrize(
    "ctype",
    [
        b"application/json",
        b"application/json; charset=utf-8",
        b"application/json;charset=utf-8",
        b"Application/JSON",
        b"APPLICATION/JSON; CHARSET=UTF-8",
    ],
)
async def test_json_content_types_served(ctype: bytes) -> None:
    run = _Run({})
    c = _Client(b'{"code": "x"}')
    await _mw(run)(_scope(headers=[(b"x-a", b"1"), (b"content-type", ctype)]), c.receive, c.send)
    assert len(run.calls) == 1 and run.calls[0][1] is None and c.sent[0]["status"] == 200


# -- handed on -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "scope",
    [
        _scope(path="/run_code/"),
        _scope(path="/v1/run_code"),
        _scope(method="GET"),
        _scope(method="PUT"),
        _scope(root_path="/mnt"),
        _scope(**{F._HANDED_ON: True}),
    ],
)
@pytest.mark.parametrize("outermost", [False, True])
async def test_other_requests_handed_on_unread(scope: dict[str, Any], outermost: bool) -> None:
    run, inner = _Run({}), _Inner()
    c = _Client(b'{"code": "x"}')
    await _mw(run, inner, outermost=outermost)(dict(scope), c.receive, c.send)
    assert run.calls == [] and c.sent[-1] == {"type": "http.response.body", "body": b"inner"}
    ((got_scope, got),) = inner.calls
    assert got == [{"type": "http.request", "body": b'{"code": "x"}', "more_body": False}]
    assert got_scope.get(F._HANDED_ON, False) is (outermost or F._HANDED_ON in scope)


async def test_non_http_scopes_handed_on() -> None:
    inner = _Inner()
    for outermost in (False, True):
        scope = {"type": "lifespan"}
        await _mw(_Run(), inner, outermost=outermost)(scope, _Client().receive, _Client().send)
        assert (F._HANDED_ON in scope) is outermost
    assert [s["type"] for s, _ in inner.calls] == ["lifespan", "lifespan"]


@pytest.mark.parametrize(
    "headers,body",
    [
        ([(b"content-type", b"text/plain")], b'{"code": "x"}'),
        ([], b'{"code": "x"}'),
        ([JSON, JSON], b'{"code": "x"}'),  # repeated: FastAPI decides
        ([(b"content-type", b"application/json; charset=latin-1")], b'{"code": "x"}'),
        ([(b"content-type", b"application/jsonx")], b'{"code": "x"}'),
        ([JSON], b""),
        ([JSON], b'{"code": "x"'),
        ([JSON], b"[1, 2]"),
        ([JSON], b'"code"'),
        ([JSON], b"\xff\xfe"),
        ([JSON], b"{}"),
        ([JSON], b'{"code": "x", "language": "cobol"}'),
        ([JSON], b"[" * 100000 + b"]" * 100000),  # json's RecursionError
    ],
)
async def test_not_served_body_replayed(headers: list[Any], body: bytes) -> None:
    run, inner = _Run({}), _Inner(then_receive=True)
    half = len(body) // 2
    c = _Client(body[:half], body[half:], gone_after=0)
    await _mw(run, inner)(_scope(headers=headers), c.receive, c.send)
    assert run.calls == []
    ((scope, got),) = inner.calls
    assert got == [
        {"type": "http.request", "body": body, "more_body": False},
        {"type": "http.disconnect"},
    ]  # (then the client's own messages)
    assert F._HANDED_ON not in scope


async def test_not_outermost_by_default() -> None:
    inner = _Inner()
    mw = F.FastRunCode(inner, run_code=_Run({}), error_response=_errors({}))
    assert mw.outermost is False
    c = _Client(b"x")
    await mw(_scope(path="/elsewhere"), c.receive, c.send)
    ((scope, _),) = inner.calls
    assert F._HANDED_ON not in scope
    c = _Client(b'{"code": "x"}')
    with pytest.raises(RuntimeError):
        await F.FastRunCode(inner, run_code=_Run(RuntimeError("bug")), error_response=_errors({}))(
            _scope(), c.receive, c.send
        )
    assert c.sent == []  # no plain 500 of its own: the server's middleware gives it


async def test_replay_then_the_clients_messages() -> None:
    c = _Client(msgs=[{"type": "x.other"}])
    again = F._replay(b"raw", c.receive)
    assert await again() == {"type": "http.request", "body": b"raw", "more_body": False}
    assert c.received == 0
    assert await again() == {"type": "x.other"}
    assert c.received == 1


async def test_read_body() -> None:
    c = _Client(
        msgs=[
            {"type": "http.request", "body": b"a", "more_body": True},
            {"type": "http.request", "more_body": True},
            {"type": "http.request", "body": b"b"},
        ]
    )
    assert await F._read_body(c.receive) == (b"ab", False)
    c = _Client(
        msgs=[
            {"type": "http.request", "body": b"a", "more_body": True},
            {"type": "http.disconnect"},
        ]
    )
    assert await F._read_body(c.receive) == (b"", None)


# -- errors and clients gone ---------------------------------------------------------------


async def test_body_too_large_answered_by_error_response() -> None:
    errors = _errors({BodyTooLarge: 413})

    async def receive() -> dict[str, Any]:
        raise BodyTooLarge(10)

    c = _Client()
    run = _Run({})
    await _mw(run, errors=errors)(_scope(), receive, c.send)
    assert run.calls == [] and c.sent[0]["status"] == 413
    assert c.sent[1]["body"] == b'{"detail":"body: larger than 10 bytes"}'


async def test_client_gone_before_its_body() -> None:
    run, inner = _Run({}), _Inner()
    c = _Client(msgs=[{"type": "http.disconnect"}])
    await _mw(run, inner, outermost=True)(_scope(), c.receive, c.send)
    assert (run.calls, inner.calls, c.sent) == ([], [], [])


async def test_client_gone_during_the_work() -> None:
    run = _Run({"late": 1}, delay=30)
    c = _Client(b'{"code": "x"}', gone_after=0.05)
    await asyncio.wait_for(_mw(run)(_scope(), c.receive, c.send), 5)
    assert run.cancelled and c.sent == []
    run = _Run(None)  # (a None result: nobody to answer either)
    c = _Client(b'{"code": "x"}')
    await asyncio.wait_for(_mw(run)(_scope(), c.receive, c.send), 5)
    assert c.sent == []


@pytest.mark.parametrize("outermost", [False, True])
async def test_errors_mapped_or_raised(outermost: bool) -> None:
    errors = _errors({KeyError: 409})
    c = _Client(b'{"code": "x"}')
    await _mw(_Run(KeyError("k")), errors=errors, outermost=outermost)(_scope(), c.receive, c.send)
    assert c.sent[0]["status"] == 409 and c.sent[1]["body"] == b'{"detail":"\'k\'"}'
    c = _Client(b'{"code": "x"}')
    with pytest.raises(RuntimeError, match="a bug"):
        await _mw(_Run(RuntimeError("a bug")), errors=errors, outermost=outermost)(
            _scope(), c.receive, c.send
        )
    assert [type(e) for e in errors.seen] == [KeyError, RuntimeError]
    if outermost:
        assert c.sent[0]["status"] == 500
        assert (b"content-type", b"text/plain; charset=utf-8") in c.sent[0]["headers"]
        assert c.sent[1]["body"] == b"Internal Server Error"
    else:
        assert c.sent == []
    c = _Client(b'{"code": "x"}')  # an answer that does not encode: a bug too
    with pytest.raises(ValueError):
        await _mw(_Run({"x": float("nan")}), errors=errors, outermost=outermost)(
            _scope(), c.receive, c.send
        )
    assert [m.get("status") for m in c.sent][:1] == ([500] if outermost else [])
    assert len(errors.seen) == 2  # (not mapped: raised as is)


# -- until_disconnect ----------------------------------------------------------------------


async def test_until_disconnect_result_and_no_late_receive() -> None:
    c = _Client(msgs=[{"type": "http.request", "body": b""}], gone_after=None)

    async def work() -> int:
        await asyncio.sleep(0.02)
        return 7

    assert await F.until_disconnect(c.receive, work()) == 7
    await asyncio.sleep(0.01)
    me = asyncio.current_task()
    assert me is not None and me.cancelling() == 0


async def test_until_disconnect_other_messages_are_not_a_disconnect() -> None:
    c = _Client(msgs=[{"type": "http.request"}, {"type": "x"}], gone_after=0.05)
    run = _Run("never", delay=30)
    assert await F.until_disconnect(c.receive, run(None, None)) is None  # type: ignore[arg-type]
    assert run.cancelled and c.received == 3
    me = asyncio.current_task()
    assert me is not None and me.cancelling() == 0  # our own cancel, spent
    await asyncio.sleep(0)  # the task goes on, not cancelled


async def test_until_disconnect_outer_cancel_propagates() -> None:
    c = _Client()  # never disconnects
    started = asyncio.Event()

    async def work() -> int:
        started.set()
        await asyncio.sleep(30)
        return 1

    task = asyncio.create_task(F.until_disconnect(c.receive, work()))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_until_disconnect_work_errors_pass_through() -> None:
    async def work() -> int:
        raise LookupError("x")

    with pytest.raises(LookupError):
        await F.until_disconnect(_Client().receive, work())


def test_constants() -> None:
    assert {
        b"application/json",
        b"application/json; charset=utf-8",
        b"application/json;charset=utf-8",
    } == F._JSON_TYPES
    assert F._HEADERS_TAIL == (b"content-type", b"application/json")
    assert F._HANDED_ON == "tangram.fastpath.handed_on"
    assert json.loads(F.encode([])) == []
