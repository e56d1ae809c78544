"""Client: the blocking twin of `AsyncClient` (same methods; ``close`` for ``aclose``).

Invariant: a Client owns one private event loop on one daemon thread and runs its AsyncClient
there; every method blocks the caller until that coroutine finishes. So both twins share all
behaviour (retries, idempotency keys, embedded mode).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from ._async import AsyncClient, AsyncSession

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="tangram-client",
                                       daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


class Client:
    """Blocking client of an ARL-Tangram service (or an embedded one)."""

    def __init__(self, base_url: str = "http://127.0.0.1:8080", **kw: Any) -> None:
        self._lt = _LoopThread()

        async def make() -> AsyncClient:
            return AsyncClient(base_url, **kw)

        self._ac = self._lt.run(make())

    @classmethod
    def embedded(cls, config: Any = None, **kw: Any) -> Client:
        """Start an orchestrator in this process and talk to it without HTTP."""
        self = cls.__new__(cls)
        self._lt = _LoopThread()
        self._ac = self._lt.run(AsyncClient.embedded(config, **kw))
        return self

    @property
    def engine(self) -> Any:
        return self._ac.engine

    def close(self) -> None:
        if self._lt.loop.is_closed():
            return
        self._lt.run(self._ac.aclose())
        self._lt.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, actions: Mapping[str, Any] | Sequence[Mapping[str, Any]], **kw: Any) -> dict[str, Any]:
        return self._lt.run(self._ac.submit(actions, **kw))

    def result(self, action_id: str, wait: float | None = None) -> dict[str, Any]:
        return self._lt.run(self._ac.result(action_id, wait))

    def cancel(self, action_id: str) -> bool:
        return self._lt.run(self._ac.cancel(action_id))

    def run(self, action: Mapping[str, Any], **kw: Any) -> dict[str, Any]:
        return self._lt.run(self._ac.run(action, **kw))

    def run_code(self, code: str, language: str = "python", **kw: Any) -> dict[str, Any]:
        return self._lt.run(self._ac.run_code(code, language, **kw))

    def run_jupyter(self, cells: Sequence[str], **kw: Any) -> dict[str, Any]:
        return self._lt.run(self._ac.run_jupyter(cells, **kw))

    def run_tests(self, code: str, cases: Sequence[Mapping[str, Any]], **kw: Any) -> dict[str, Any]:
        return self._lt.run(self._ac.run_tests(code, cases, **kw))

    def reward(self, response: str, **kw: Any) -> Any:
        return self._lt.run(self._ac.reward(response, **kw))

    @contextlib.contextmanager
    def session(self, **kw: Any) -> Iterator[Session]:
        cm = self._ac.session(**kw)
        sess = self._lt.run(cm.__aenter__())
        try:
            yield Session(self, sess)
        finally:
            self._lt.run(cm.__aexit__(None, None, None))

    def search(self, query: str, **kw: Any) -> dict[str, Any]:
        return self._lt.run(self._ac.search(query, **kw))

    def fetch(self, url: str, **kw: Any) -> dict[str, Any]:
        return self._lt.run(self._ac.fetch(url, **kw))

    def retrieve(self, queries: Sequence[str], **kw: Any) -> list[list[Any]]:
        return self._lt.run(self._ac.retrieve(queries, **kw))

    def cluster(self) -> dict[str, Any]:
        return self._lt.run(self._ac.cluster())

    def import_image(self, path: str, name: str, node: str | None = None) -> dict[str, Any]:
        return self._lt.run(self._ac.import_image(path, name, node))

    def upload_image(self, path: str, name: str, node: str | None = None) -> dict[str, Any]:
        return self._lt.run(self._ac.upload_image(path, name, node))

    def images(self) -> dict[str, Any]:
        return self._lt.run(self._ac.images())

    def remove_image(self, name: str) -> dict[str, Any]:
        return self._lt.run(self._ac.remove_image(name))

    def stats(self) -> dict[str, Any]:
        return self._lt.run(self._ac.stats())

    def ping(self) -> bool:
        return self._lt.run(self._ac.ping())


class Session:
    """Blocking twin of `AsyncSession`."""

    def __init__(self, client: Client, inner: AsyncSession) -> None:
        self._client, self._inner = client, inner
        self.id = inner.id

    def run(self, code: str, language: str = "python", **kw: Any) -> dict[str, Any]:
        return self._client._lt.run(self._inner.run(code, language, **kw))
