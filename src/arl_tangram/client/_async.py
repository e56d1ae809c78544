"""AsyncClient: the SDK over HTTP (httpx), or embedded in-process with no HTTP server.

Invariant: every submit carries an idempotency key (the caller's, or one made per call), so a
retry after a lost answer maps onto the first submit and never runs the action twice. Retries
happen only on transport errors and 502/503/504, with exponential backoff.
Embedded mode runs the same ASGI app in-process through httpx's ASGI transport (no socket), so
both modes share every code path past the transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tarfile
import tempfile
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import httpx

from ..core.errors import BrokenError, ClosedError, InvalidAction, TangramError

RETRY_STATUS = frozenset({502, 503, 504})


class ApiError(TangramError):
    """The service answered with an error status."""

    def __init__(self, status: int, detail: Any) -> None:
        self.status, self.detail = status, detail
        super().__init__(f"HTTP {status}: {detail}")


class AsyncClient:
    """Talks to an ARL-Tangram service (``base_url``) or to an embedded one."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8080",
        *,
        token: str | None = None,
        timeout: float = 300.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout,
                                       transport=transport)
        self.retries, self.backoff_s = retries, backoff_s
        self._engine: Any = None  # set in embedded mode
        self._closed = False

    # ---- construction ----------------------------------------------------------------------

    @classmethod
    async def embedded(cls, config: Any = None, *, policy: str | None = None,
                       gpu_factories: Any = None, **kw: Any) -> AsyncClient:
        """Start an orchestrator in this process (this machine's managers) and talk to it."""
        from ..api.app import create_app
        from ..runtime.build import build_engine
        from ..runtime.config import default_config

        cfg = config or default_config(policy=policy or "tangram")
        if policy is not None and cfg.policy != policy:
            import dataclasses

            cfg = dataclasses.replace(cfg, policy=policy)
        engine = build_engine(cfg, gpu_factories=gpu_factories)
        await engine.start()
        # (images: any path this process can read, as `tangram image import`; no listener)
        app = create_app(engine, cfg, any_image_path=True)
        client = cls("http://tangram.embedded", transport=httpx.ASGITransport(app=app), **kw)
        client._engine = engine
        return client

    @property
    def engine(self) -> Any:
        """The in-process engine (embedded mode), else None."""
        return self._engine

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._http.aclose()
        if self._engine is not None:
            await self._engine.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- transport -------------------------------------------------------------------------

    async def _request(self, method: str, path: str, **kw: Any) -> Any:
        if self._closed:
            raise ClosedError("the client is closed")
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                r = await self._http.request(method, path, **kw)
            except httpx.TransportError as exc:
                if attempt == self.retries:
                    raise BrokenError(f"{method} {path}: {exc!r}") from exc
            else:
                if r.status_code < 400:
                    return r.json() if r.content else None
                if r.status_code not in RETRY_STATUS or attempt == self.retries:
                    raise _error(r)
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    # ---- native ----------------------------------------------------------------------------

    async def submit(self, actions: Mapping[str, Any] | Sequence[Mapping[str, Any]], *,
                     idempotency_key: str | None = None, wait: bool = False,
                     wait_s: float = 300.0) -> dict[str, Any]:
        """Submit one action or a batch (dicts in the /v1/actions shape); returns ids[, results]."""
        batch = [dict(actions)] if isinstance(actions, Mapping) else [dict(a) for a in actions]
        key = idempotency_key or uuid.uuid4().hex
        body = {"actions": batch, "wait": wait, "wait_s": wait_s}
        return await self._request("POST", "/v1/actions", json=body,
                                   headers={"idempotency-key": key})

    async def result(self, action_id: str, wait: float | None = None) -> dict[str, Any]:
        """The action's state; waits until finished when ``wait`` is None."""
        while True:
            step = 30.0 if wait is None else wait
            out = await self._request("GET", f"/v1/actions/{action_id}", params={"wait": step})
            if out["finished"] or wait is not None:
                return out

    async def cancel(self, action_id: str) -> bool:
        out = await self._request("DELETE", f"/v1/actions/{action_id}")
        return bool(out["cancelled"])

    async def run(self, action: Mapping[str, Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Submit one action and wait for its result (the result dict)."""
        out = await self.submit(action, idempotency_key=idempotency_key, wait=True)
        res = out["results"][0]
        return res if res["finished"] else await self.result(out["ids"][0])

    async def run_code(self, code: str, language: str = "python", *, stdin: str = "",
                       files: Mapping[str, str] | None = None, fetch_files: Sequence[str] = (),
                       compile_timeout: float = 10, run_timeout: float = 10,
                       memory_limit_MB: int = -1, session: str | None = None,
                       idempotency_key: str | None = None,
                       image: str | None = None) -> dict[str, Any]:
        """Run a program; returns SandboxFusion's RunCodeResponse shape. With ``image``, in a
        fresh writable layer over that environment image (discarded after)."""
        payload: dict[str, Any] = {
            "code": code, "language": language, "stdin": stdin, "files": dict(files or {}),
            "fetch_files": list(fetch_files), "compile_timeout": compile_timeout,
            "run_timeout": run_timeout, "memory_limit_MB": memory_limit_MB}
        if image is not None:
            payload["image"] = image
        action: dict[str, Any] = {"kind": "code", "payload": payload, "tag": language,
                                  "timeout_s": compile_timeout + run_timeout + 5}
        if memory_limit_MB > 0:
            action["demand"] = {"cpu": 1, "memory_mb": memory_limit_MB}
        if session:
            action.update(kind="tool", session=session, payload={"code": code, "language": language})
        res = await self.run(action, idempotency_key=idempotency_key)
        return _output(res)

    async def run_jupyter(self, cells: Sequence[str], *, cell_timeout: float = 0,
                          total_timeout: float = 45, files: Mapping[str, str] | None = None,
                          fetch_files: Sequence[str] = (),
                          idempotency_key: str | None = None) -> dict[str, Any]:
        """Run notebook cells in one sandbox; returns SandboxFusion's RunJupyterResponse shape."""
        from ..api import jupyter as J

        req = J.RunJupyterRequest(cells=list(cells), cell_timeout=cell_timeout, kernel="python3",
                                  total_timeout=total_timeout, files=dict(files or {}),
                                  fetch_files=list(fetch_files))
        rc = J.to_run_code(req)
        out = await self.run_code(rc.code, files={k: v or "" for k, v in rc.files.items()},
                                  fetch_files=rc.fetch_files, run_timeout=rc.run_timeout,
                                  idempotency_key=idempotency_key)
        return J.from_run_code(out, len(req.cells))

    async def run_tests(self, code: str, cases: Sequence[Mapping[str, Any]], *,
                        language: str = "python", stop_on_first_failure: bool = False,
                        timeout_s: float = 60.0, cpus: tuple[float, float] = (1, 1),
                        idempotency_key: str | None = None) -> dict[str, Any]:
        """Run ``code`` against test cases ({stdin, expected_stdout} or {assert})."""
        action: dict[str, Any] = {
            "kind": "test", "tag": language, "timeout_s": timeout_s,
            "payload": {"code": code, "language": language, "cases": [dict(c) for c in cases],
                        "stop_on_first_failure": stop_on_first_failure},
            "hints": {"test_count": len(cases)},
        }
        if cpus[1] > cpus[0]:
            action["elasticity"] = {"min": cpus[0], "max": cpus[1], "parallel_fraction": 0.9}
        return _output(await self.run(action, idempotency_key=idempotency_key))

    async def reward(self, response: str, *, prompt: str | None = None,
                     reference: str | None = None, model: str | Sequence[str] | None = None,
                     idempotency_key: str | None = None) -> Any:
        """Score one response; a float, or model -> output when several models are named."""
        payload: dict[str, Any] = {"response": response, "query": response}
        if prompt is not None:
            payload.update(prompt=prompt, query=f"{prompt}\n{response}")
        if reference is not None:
            payload["reference"] = reference
        action: dict[str, Any] = {"kind": "reward", "payload": payload, "task": "rlhf"}
        if isinstance(model, str):
            action["model"] = model
        elif model is not None:
            action["models"] = list(model)
        out = _output(await self.run(action, idempotency_key=idempotency_key))
        if isinstance(out, Mapping) and "scores" in out:
            return {m: o.get("score") if isinstance(o, Mapping) else o for m, o in out["scores"].items()}
        return out["score"]

    @contextlib.asynccontextmanager
    async def session(self, *, ttl_s: float = 600.0, demand: Mapping[str, float] | None = None,
                      session_id: str | None = None, image: str | None = None,
                      layer_mb: int | None = None) -> AsyncIterator[AsyncSession]:
        """A multi-turn sandbox: tool calls in it share state (files, processes); with
        ``image``, it runs in that environment image (see `images`)."""
        body: dict[str, Any] = {"ttl_s": ttl_s}
        if image is not None:
            body["image"] = image
        if layer_mb is not None:
            body["layer_mb"] = layer_mb
        if demand is not None:
            body["demand"] = dict(demand)
        if session_id is not None:
            body["session_id"] = session_id
        out = await self._request("POST", "/v1/sessions", json=body)
        sess = AsyncSession(self, out["session_id"])
        try:
            yield sess
        finally:
            with contextlib.suppress(TangramError):
                await self._request("DELETE", f"/v1/sessions/{sess.id}")

    async def search(self, query: str, *, provider: str, options: Mapping[str, Any] | None = None,
                     timeout_s: float = 60.0, trajectory: str | None = None,
                     source: str | None = None, step: int | None = None) -> dict[str, Any]:
        """One web search through a configured provider (issue 37): its quota is scheduled by
        the service's core, identical queries in flight share one call, a cached answer costs
        nothing. Returns ``{"id", "status", "provider", "result", "cached", "reason",
        "act_s", "route", "route_reason", "local_score"}``; ``status`` is "succeeded", or
        "failed" / "timed_out" with the reason (a spent budget, a provider that is down), so a
        trainer can mask the call. ``source`` "auto" (default) asks the provider's
        ``local_first`` index first, "local" only it, "web" only the provider; ``step`` is the
        RL step whose ``budget_per_step`` the call is charged to."""
        body: dict[str, Any] = {"provider": provider, "query": query, "timeout_s": timeout_s}
        if options is not None:
            body["options"] = dict(options)
        if trajectory is not None:
            body["trajectory"] = trajectory
        if source is not None:
            body["source"] = source
        if step is not None:
            body["step"] = step
        out: dict[str, Any] = await self._request("POST", "/v1/search", json=body)
        return out

    async def fetch(self, url: str, *, provider: str, options: Mapping[str, Any] | None = None,
                    timeout_s: float = 60.0, trajectory: str | None = None,
                    step: int | None = None) -> dict[str, Any]:
        """One page fetch through a configured provider; the answer as `search`'s (less the
        route fields)."""
        body: dict[str, Any] = {"provider": provider, "url": url, "timeout_s": timeout_s}
        if options is not None:
            body["options"] = dict(options)
        if trajectory is not None:
            body["trajectory"] = trajectory
        if step is not None:
            body["step"] = step
        out: dict[str, Any] = await self._request("POST", "/v1/fetch", json=body)
        return out

    async def retrieve(self, queries: Sequence[str], *, topk: int = 3, return_scores: bool = True,
                       index: str | None = None) -> list[list[Any]]:
        """The local retriever (``POST /retrieve``, Search-R1's format): per query, its ``topk``
        documents (``{"document": {"id", "contents"}, "score"}`` with scores, else documents)."""
        body: dict[str, Any] = {"queries": list(queries), "topk": topk, "return_scores": return_scores}
        if index is not None:
            body["index"] = index
        out = await self._request("POST", "/retrieve", json=body)
        return list(out["result"])

    async def cluster(self) -> dict[str, Any]:
        return await self._request("GET", "/v1/cluster")

    async def import_image(self, path: str, name: str, node: str | None = None) -> dict[str, Any]:
        """Import an image file or directory that the service's nodes can read (issue 17)."""
        return await self._request("POST", "/v1/images",
                                   json={"path": path, "name": name, "node": node})

    async def upload_image(self, path: str, name: str, node: str | None = None,
                           chunk_bytes: int = 1 << 20) -> dict[str, Any]:
        """Send an image archive from this machine (`PUT /v1/images/{name}`): for a service
        whose nodes cannot read ``path``. A file is streamed as it is; a directory (a root file
        system or an OCI layout) is packed into a plain tar first. Not retried (a stream is
        not replayed); the service caps the size (``images.max_upload_mb``)."""
        if self._closed:
            raise ClosedError("the client is closed")
        with contextlib.ExitStack() as stack:
            if os.path.isdir(path):
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="tangram-pack-"))
                packed = os.path.join(tmp, "image.tar")
                await asyncio.to_thread(_pack_dir, path, packed)
                path = packed
            f = stack.enter_context(open(path, "rb"))  # (read in a thread below)

            async def body() -> AsyncIterator[bytes]:
                while chunk := await asyncio.to_thread(f.read, chunk_bytes):
                    yield chunk

            params = {"node": node} if node else None
            try:
                r = await self._http.put(f"/v1/images/{name}", content=body(), params=params,
                                         headers={"content-type": "application/octet-stream"})
            except httpx.TransportError as exc:
                raise BrokenError(f"PUT /v1/images/{name}: {exc!r}") from exc
        if r.status_code >= 400:
            raise _error(r)
        return dict(r.json())

    async def images(self) -> dict[str, Any]:
        return await self._request("GET", "/v1/images")

    async def remove_image(self, name: str) -> dict[str, Any]:
        return await self._request("DELETE", f"/v1/images/{name}")

    async def stats(self) -> dict[str, Any]:
        return await self._request("GET", "/v1/stats")

    async def ping(self) -> bool:
        return await self._request("GET", "/v1/ping") == "pong"


class AsyncSession:
    """An open session; ``run`` is a tool call inside it."""

    def __init__(self, client: AsyncClient, session_id: str) -> None:
        self.client, self.id = client, session_id

    async def run(self, code: str, language: str = "python", *, timeout_s: float = 30.0) -> dict[str, Any]:
        action = {"kind": "tool", "session": self.id, "tag": language, "timeout_s": timeout_s,
                  "payload": {"code": code, "language": language}}
        return _output(await self.client.run(action))


def _output(res: Mapping[str, Any]) -> Any:
    if res.get("output") is None and res.get("status") not in ("succeeded",):
        raise BrokenError(f"action {res.get('id')} {res.get('status')}: {res.get('reason')}")
    return res["output"]


def _error(r: httpx.Response) -> TangramError:
    try:
        body = r.json()
        detail = body.get("message") or body.get("detail") if isinstance(body, dict) else body
        field = body.get("field") if isinstance(body, dict) else None
    except ValueError:
        detail, field = r.text, None
    if r.status_code in (400, 422):
        return InvalidAction(str(field or "request"), str(detail))
    return ApiError(r.status_code, detail)


def _pack_dir(src: str, dst: str) -> None:
    """``src``'s tree as a plain tar at ``dst``, its entries relative to ``src`` (numeric
    owners kept: an image's files keep theirs)."""
    with tarfile.open(dst, "w", format=tarfile.PAX_FORMAT) as tf:
        for entry in sorted(os.listdir(src)):
            tf.add(os.path.join(src, entry), arcname=entry)
