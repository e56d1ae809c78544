"""The /run_code fast path answers exactly as the FastAPI route does (status, headers, bytes),
serves the valid requests itself and leaves every other request to FastAPI."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from fakes import FakeExecutor, core_factory

from arl_tangram.api import fastpath
from arl_tangram.api.app import create_app
from arl_tangram.core import commands as C
from arl_tangram.core import events as E
from arl_tangram.core.actions import Status
from arl_tangram.runtime.config import LimitsConfig, ServiceConfig
from arl_tangram.runtime.engine import Engine, EngineConfig


class SandboxLike(FakeExecutor):
    """Answers CODE actions in SandboxFusion's shape: stdout is the code; ``sleep`` sleeps."""

    async def _run(self, c: C.StartAction) -> None:
        assert self.emit is not None
        a = c.action
        self.emit(E.ActionStarted(time.monotonic(), a.id, c.node))
        code = str(a.payload.get("code"))
        if code == "sleep":
            await asyncio.sleep(5)
        status = Status.FAILED if code == "fail" else Status.SUCCEEDED
        run = {"status": "Finished", "execution_time": 0.001, "return_code": int(code == "fail"),
               "stdout": code, "stderr": "é\u2028"}
        out = {"status": "Success" if status == Status.SUCCEEDED else "Failed", "message": "",
               "compile_result": None, "run_result": run, "cpu_time": 0.002}
        self.emit(E.ActionFinished(time.monotonic(), a.id, status, out))


def _app(fast: bool, token: str | None = None, max_pending: int = 100) -> tuple[Engine, object]:
    cfg = ServiceConfig(token=token, limits=LimitsConfig(max_body_bytes=4096, max_pending=max_pending))
    eng = Engine(SandboxLike(cpu=4), EngineConfig(tick_s=0.05, max_pending=max_pending),
                 core_factory=core_factory)
    return eng, create_app(eng, cfg, fast_paths=fast)


JSON = {"content-type": "application/json"}
CASES: list[tuple[bytes, dict[str, str]]] = [
    (b'{"code": "print(1)", "language": "python"}', JSON),
    (b'{"code": "print(\\"\\u00e9\\")", "stdin": "x", "extra": [1, 2]}', JSON),
    (b'{"code": "fail", "run_timeout": 3, "memory_limit_MB": 64}', JSON),
    (b'{"code": "x"}', {"content-type": "application/json; charset=utf-8"}),
    (b'{"code": "x"}', {"content-type": "text/plain"}),
    (b'{"code": "x"}', {}),
    (b'{"code": "x"', JSON),
    (b"", JSON),
    (b"[1, 2]", JSON),
    (b"\xff\xfe", JSON),
    (b"{}", JSON),
    (b'{"code": 3}', JSON),
    (b'{"code": "x", "language": "cobol"}', JSON),
    (b'{"code": "x", "run_timeout": 0}', JSON),
    (b'{"code": "x", "files": {"a": 1}}', JSON),
    (b'{"code": "' + b"x" * 5000 + b'"}', JSON),
]


async def _answers(fast: bool, requests: list[tuple[bytes, dict[str, str]]], **kw: object) -> list:
    eng, app = _app(fast, **kw)  # type: ignore[arg-type]
    await eng.start()
    out = []
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
                                     base_url="http://t") as c:
            for body, headers in requests:
                r = await c.post("/run_code", content=body, headers=headers)
                out.append((r.status_code, r.headers.get("content-type"),
                            r.headers.get("content-length"), r.content))
    finally:
        await eng.aclose()
    return out


async def test_fast_path_answers_like_the_route(monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[bytes] = []
    real = fastpath.encode
    monkeypatch.setattr(fastpath, "encode", lambda b: served.append(real(b)) or served[-1])
    slow = await _answers(False, CASES)
    assert not served
    fast = await _answers(True, CASES)
    assert fast == slow
    assert len(served) == 4  # the four valid JSON requests; the rest went to FastAPI
    assert slow[0][0] == 200 and b'"stdout":"print(1)"' in slow[0][3]
    assert [s for s, *_ in slow[4:]] == [422] * 11 + [413]


async def test_fast_path_keeps_token_and_errors() -> None:
    ok = [(b'{"code": "x"}', JSON)]
    for fast in (False, True):
        (r,) = await _answers(fast, ok, token="s3cret")
        assert r[0] == 401
    # a chunked body (no content-length) past the limit: 413 on both paths, other errors as before
    async def chunks():  # type: ignore[no-untyped-def]
        yield b'{"code": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    for fast in (False, True):
        eng, app = _app(fast)
        await eng.start()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
                                     base_url="http://t") as c:
            r = await c.post("/run_code", content=chunks(), headers=JSON)
            assert r.status_code == 413 and "body" in r.json()["detail"]
            assert (await c.get("/run_code")).status_code == 405
            assert (await c.get("/nowhere")).json() == {"detail": "Not Found"}
        await eng.aclose()
    # an overloaded engine sheds /run_code with 504 on both paths
    for fast in (False, True):
        eng, app = _app(fast, max_pending=1)
        await eng.start()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
                                     base_url="http://t") as c:
            first = asyncio.create_task(c.post("/run_code", json={"code": "sleep"}))
            while not eng.stats()["running_total"]:
                await asyncio.sleep(0.01)
            r = await c.post("/run_code", json={"code": "x"})
            assert r.status_code == 504 and "max_pending" in r.json()["detail"]
            first.cancel()
        await eng.aclose()


async def test_fast_path_answers_a_bug_like_the_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug (an exception no handler maps) is a plain 500 on both paths, and is not swallowed:
    it goes on to the server, which logs it."""
    from arl_tangram.api.service import Service

    async def broken(self: Service, req: object, **kw: object) -> dict:
        raise RuntimeError("a bug")

    monkeypatch.setattr(Service, "run_code", broken)
    got = []
    for fast in (False, True):
        eng, app = _app(fast)
        await eng.start()
        try:
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)  # type: ignore[arg-type]
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                r = await c.post("/run_code", json={"code": "x"})
                got.append((r.status_code, r.headers.get("content-type"), r.content))
            with pytest.raises(RuntimeError, match="a bug"):
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
                                             base_url="http://t") as c:
                    await c.post("/run_code", json={"code": "x"})
        finally:
            await eng.aclose()
    assert got[0] == got[1] == (500, "text/plain; charset=utf-8", b"Internal Server Error")
