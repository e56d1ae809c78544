"""The API manager: executes the core's provider calls over HTTP, and keeps the answer cache.

The core decides *when* a call leaves (a token and a slot of its provider: core/providers.py);
this manager only sends it (`call`, one `CallProvider`) and reports back exactly once:

- a 2xx with a JSON body -> `ActionFinished(SUCCEEDED, output=kinds.ProviderResult)`, the
  answer cached under the call's key for ``cache_ttl_s``;
- a 429 -> `ProviderThrottled` (``Retry-After`` in seconds or an HTTP date, when sent): the
  core lowers or pauses the provider's bucket and the call waits again for a token there, never
  in a worker;
- a 5xx or a connection error -> retried here after a jittered exponential backoff (full
  jitter: AWS Architecture Blog, "Exponential Backoff And Jitter", 2015), at most ``retries``
  times and never past the action's deadline; then `FAILED` naming the provider and the error;
- no answer within ``min(timeout_s, deadline - now)`` -> `TIMED_OUT` naming the provider;
- a 2xx that is not JSON (garbage), or another 4xx -> `FAILED` naming the provider.

One `httpx.AsyncClient` per provider, its connection pool sized to the provider's concurrency.
Keys are pooled round robin and sent in the provider's header only; every text that leaves this
module (reasons, logs) has each key replaced by ``***`` (`redact`), and no key is ever part of
an output, a metric or a stats entry.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import hashlib
import json
import logging
import os
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ...core import commands as C
from ...core import events as E
from ...core.actions import Status
from ...core.errors import InvalidAction
from ...kinds import ProviderRequest, ProviderResult, provider_request
from .config import ProviderConfig

log = logging.getLogger(__name__)

Emit = Callable[[E.Event], None]
MAX_QUERY_CHARS = 4096  # a search query longer than this is refused (a 4xx naming the field)
MAX_URL_CHARS = 8192


class TtlCache:
    """Answers by key, each kept ``ttl`` seconds, at most ``max_entries`` (oldest dropped)."""

    def __init__(self, max_entries: int = 10_000) -> None:
        self.max_entries = max_entries
        self._d: OrderedDict[str, tuple[float, Any]] = OrderedDict()

    def get(self, key: str, now: float) -> Any | None:
        got = self._d.get(key)
        if got is None:
            return None
        if got[0] <= now:
            del self._d[key]
            return None
        self._d.move_to_end(key)
        return got[1]

    def put(self, key: str, value: Any, now: float, ttl: float) -> None:
        if ttl <= 0:
            return
        self._d[key] = (now + ttl, value)
        self._d.move_to_end(key)
        while len(self._d) > self.max_entries:
            self._d.popitem(last=False)

    def __len__(self) -> int:
        return len(self._d)


@dataclass
class ProviderStats:
    """Counts of one provider (what /v1/stats and /metrics show; never a key)."""

    calls: int = 0  # HTTP requests sent (retries included)
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # by kind: http_5xx, timeout, ...
    throttled: int = 0  # 429s answered (each went back to the core)
    retries: int = 0  # 5xx / connection errors retried here
    hits: int = 0  # answers served from the cache (no quota, no call)
    misses: int = 0
    latency_sum_s: float = 0.0  # of answered requests
    latency_count: int = 0
    latency_max_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        n = self.latency_count
        return {"calls": self.calls, "ok": self.ok, "errors": dict(self.errors),
                "throttled": self.throttled, "retries": self.retries, "cache_hits": self.hits,
                "cache_misses": self.misses, "latency_avg_s": round(self.latency_sum_s / n, 6) if n else None,
                "latency_max_s": round(self.latency_max_s, 6), "latency_count": n,
                "latency_sum_s": round(self.latency_sum_s, 6)}


class RequestError(InvalidAction):
    """A provider request the manager refuses; ``field`` names the wrong part (a 400)."""


def normalize(kind: str, request: Mapping[str, Any]) -> dict[str, Any]:
    """The request as sent and as compared for coalescing and the cache: a query's whitespace
    collapsed, a URL stripped, options sorted. Raises `RequestError` naming the field."""
    if kind == "search":
        q = request.get("query")
        if not isinstance(q, str) or not q.strip():
            raise RequestError("query", "must be a non-empty string")
        if len(q) > MAX_QUERY_CHARS:
            raise RequestError("query", f"must be at most {MAX_QUERY_CHARS} characters, got {len(q)}")
        out: dict[str, Any] = {"query": " ".join(q.split())}
    elif kind == "fetch":
        u = request.get("url")
        if not isinstance(u, str) or not u.strip().startswith(("http://", "https://")):
            raise RequestError("url", "must be an http(s) URL")
        if len(u) > MAX_URL_CHARS:
            raise RequestError("url", f"must be at most {MAX_URL_CHARS} characters, got {len(u)}")
        out = {"url": u.strip()}
    else:
        p = request.get("path", "")
        if not isinstance(p, str) or (p and not p.startswith("/")) or len(p) > MAX_URL_CHARS:
            raise RequestError("path", "must be a path starting with '/'")
        m = request.get("method", "POST")
        if m not in ("GET", "POST"):
            raise RequestError("method", f"must be GET or POST, got {m!r}")
        out = {"method": m, "path": p}
    opts = request.get("options")
    if opts is not None:
        if not isinstance(opts, Mapping):
            raise RequestError("options", "must be an object")
        out["options"] = {str(k): opts[k] for k in sorted(opts)}
    return out


def request_key(provider: str, kind: str, normalized: Mapping[str, Any], scope: str) -> str:
    """The coalescing and cache key: the scope (a tenant, or ``*`` when shared), the provider
    and a digest of the normalized request."""
    blob = json.dumps([provider, kind, normalized], sort_keys=True, separators=(",", ":"),
                      default=str)
    return f"{scope}|{provider}|{hashlib.sha256(blob.encode()).hexdigest()[:32]}"


def retry_after_s(value: str | None, now_wall: float) -> float | None:
    """A ``Retry-After`` header in seconds (delta-seconds or an HTTP date), or None."""
    if value is None:
        return None
    v = value.strip()
    if v.isdigit():
        return float(v)
    try:
        when = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now_wall)


def _disk_path(directory: str, key: str) -> Path:
    return Path(directory) / (hashlib.sha256(key.encode()).hexdigest() + ".json")


def _disk_get(directory: str, key: str) -> tuple[Any | None, float]:
    """(answer, seconds left) from the disk cache; (None, 0) when absent, expired or unreadable
    (an expired file is removed). Expiry is wall-clock time: it survives a restart."""
    p = _disk_path(directory, key)
    try:
        rec = json.loads(p.read_text(encoding="utf-8"))
        left = float(rec["expires"]) - time.time()
        if rec.get("key") != key:
            return None, 0.0
    except (OSError, ValueError, KeyError, TypeError):
        return None, 0.0
    if left <= 0:
        p.unlink(missing_ok=True)
        return None, 0.0
    return rec.get("value"), left


def _disk_put(directory: str, key: str, value: Any, ttl: float) -> None:
    p = _disk_path(directory, key)
    tmp = p.with_suffix(f".tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps({"key": key, "expires": time.time() + ttl, "value": value}),
                       encoding="utf-8")
        tmp.replace(p)
    except (OSError, TypeError, ValueError) as e:  # (a full disk: the memory cache still holds it)
        log.warning("answer cache %s: not written: %s", directory, type(e).__name__)
        tmp.unlink(missing_ok=True)


class ApiManager:
    """Sends the core's provider calls; the answer cache; per-provider counts."""

    def __init__(self, providers: Sequence[ProviderConfig], *, emit: Emit | None = None,
                 clock: Callable[[], float] = time.monotonic, max_cache_entries: int = 10_000,
                 backoff_base_s: float = 0.1, backoff_cap_s: float = 4.0) -> None:
        self.providers = {p.name: p for p in providers}
        self.emit = emit
        self.clock = clock
        self.cache = TtlCache(max_cache_entries)
        self.stats: dict[str, ProviderStats] = {p.name: ProviderStats() for p in providers}
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._next_key: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._running: dict[str, asyncio.Task[None]] = {}  # action id -> its call
        self._secrets = tuple(k for p in providers for k in p.keys)

    # ---- the front door: keys and cache ---------------------------------------------------------
    def prepare(self, kind: str, provider: str, request: Mapping[str, Any], tenant: str,
                ) -> tuple[ProviderRequest, str]:
        """The action's typed request and its key, for ``request`` of ``tenant`` to ``provider``.
        Raises `RequestError` (``provider`` unknown or of another kind, a bad request)."""
        cfg = self.providers.get(provider)
        if cfg is None:
            names = ", ".join(sorted(self.providers)) or "none declared"
            raise RequestError("provider", f"unknown provider {provider!r} (providers: {names})")
        if cfg.kind != kind and cfg.kind != "http":
            raise RequestError("provider", f"provider {provider!r} is a {cfg.kind} provider, not {kind}")
        norm = normalize(kind, request)
        body = request.get("json") if kind == "http" else None
        if body is not None:
            norm = {**norm, "json": body}
        key = request_key(provider, kind, norm, "*" if cfg.cache_shared else tenant)
        return ProviderRequest(kind=kind, request=norm, coalesce=key), key

    def lookup(self, provider: str, key: str) -> ProviderResult | None:
        """A cached answer (counted as a hit; ``cached`` true), or None (a miss): memory, then the provider's
        ``cache_dir`` (an answer found there is kept in memory for what is left of its TTL)."""
        st = self.stats.get(provider)
        got = self.cache.get(key, self.clock())
        cfg = self.providers.get(provider)
        if got is None and cfg is not None and cfg.cache_dir:
            got, left = _disk_get(cfg.cache_dir, key)
            if got is not None:
                self.cache.put(key, got, self.clock(), left)
        if st is not None:
            if got is None:
                st.misses += 1
            else:
                st.hits += 1
        if got is None:
            return None
        return ProviderResult(provider=str(got.get("provider", provider)), result=got.get("result"),
                              cached=True)

    # ---- calls --------------------------------------------------------------------------------
    def call(self, cmd: C.CallProvider | C.CancelAction) -> None:
        """Send one call (the core took its token and slot); report exactly once. A
        `CancelAction` (on no node) aborts the call in flight: it reports CANCELLED."""
        if isinstance(cmd, C.CancelAction):
            running = self._running.get(cmd.action_id)
            if running is not None:
                running.cancel()
            return
        aid = cmd.action.id
        task = asyncio.get_running_loop().create_task(self._run(cmd), name=f"call-{aid}")
        self._tasks.add(task)
        self._running[aid] = task
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(functools.partial(self._forget, aid))

    def _forget(self, aid: str, task: asyncio.Task[None]) -> None:
        if self._running.get(aid) is task:
            del self._running[aid]

    def _client(self, cfg: ProviderConfig) -> httpx.AsyncClient:
        c = self._clients.get(cfg.name)
        if c is None:
            n = cfg.limits.concurrency
            c = self._clients[cfg.name] = httpx.AsyncClient(
                limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
                follow_redirects=False, trust_env=False)
        return c

    def _headers(self, cfg: ProviderConfig) -> dict[str, str]:
        if not cfg.keys:
            return {}
        i = self._next_key.get(cfg.name, 0)
        self._next_key[cfg.name] = i + 1
        return {cfg.auth_header: f"{cfg.auth_prefix}{cfg.keys[i % len(cfg.keys)]}"}

    def redact(self, text: str) -> str:
        for k in self._secrets:
            if k:
                text = text.replace(k, "***")
        return text

    def _request(self, cfg: ProviderConfig, payload: Mapping[str, Any]) -> tuple[str, str, Any, Any]:
        """(method, url, json body, query params) of a call."""
        p = provider_request(payload)
        req = p.request
        opts = dict(req.get("options") or {})
        kind = p.kind or cfg.kind
        if kind == "search":
            return "POST", cfg.base_url + cfg.path, {cfg.query_field: req.get("query"), **opts}, None
        if kind == "fetch":
            return "POST", cfg.base_url + cfg.path, {cfg.url_field: req.get("url"), **opts}, None
        method = str(req.get("method", "POST"))
        body = req.get("json")
        return method, cfg.base_url + str(req.get("path", "")), body if method == "POST" else None, \
            (opts or None)

    def _finish(self, aid: str, status: Status, output: Any = None, reason: str = "",
                run_s: float | None = None) -> None:
        if self.emit is not None:
            self.emit(E.ActionFinished(self.clock(), aid, status, output, self.redact(reason), run_s))

    def _error(self, st: ProviderStats, kind: str) -> None:
        st.errors[kind] = st.errors.get(kind, 0) + 1

    async def _run(self, cmd: C.CallProvider) -> None:
        aid, name = cmd.action.id, cmd.provider
        cfg = self.providers.get(name)
        st = self.stats.setdefault(name, ProviderStats())
        if cfg is None:
            self._finish(aid, Status.FAILED, reason=f"provider {name!r}: not configured in the API manager")
            return
        try:
            await self._attempts(cmd, cfg, st)
        except asyncio.CancelledError:
            self._finish(aid, Status.CANCELLED, reason=f"provider {name!r}: call cancelled")
            raise
        except Exception as e:  # (a report is owed whatever happens)
            self._error(st, "internal")
            log.warning("provider %s: call %s failed: %s", name, aid, self.redact(repr(e)))
            self._finish(aid, Status.FAILED, reason=f"provider {name!r}: {type(e).__name__}")

    async def _attempts(self, cmd: C.CallProvider, cfg: ProviderConfig, st: ProviderStats) -> None:
        aid, name = cmd.action.id, cfg.name
        method, url, body, params = self._request(cfg, cmd.action.payload)
        client = self._client(cfg)
        started = self.clock()
        tries = 0
        while True:
            now = self.clock()
            left = cmd.deadline - now
            if left <= 0:
                self._error(st, "timeout")
                self._finish(aid, Status.TIMED_OUT, reason=f"provider {name!r}: no answer within the "
                             f"action's deadline ({tries} tries)", run_s=now - started)
                return
            timeout = min(cfg.timeout_s, left)
            st.calls += 1
            t0 = self.clock()
            try:
                resp = await client.request(method, url, json=body, params=params,
                                            headers=self._headers(cfg), timeout=timeout)
                data_raw = resp.content
            except httpx.TimeoutException:
                self._error(st, "timeout")
                self._finish(aid, Status.TIMED_OUT, run_s=self.clock() - started,
                             reason=f"provider {name!r}: no answer within {timeout:.3g} s")
                return
            except httpx.TransportError as e:
                err, kind = f"unreachable ({type(e).__name__})", "connect"
            else:
                lat = self.clock() - t0
                st.latency_sum_s += lat
                st.latency_count += 1
                st.latency_max_s = max(st.latency_max_s, lat)
                code = resp.status_code
                if code == 429:
                    st.throttled += 1
                    ra = retry_after_s(resp.headers.get("retry-after"), time.time())
                    if self.emit is not None:
                        self.emit(E.ProviderThrottled(self.clock(), aid, ra, "HTTP 429"))
                    return
                if 200 <= code < 300:
                    try:
                        data = json.loads(data_raw)
                    except ValueError:
                        self._error(st, "garbage")
                        snippet = self.redact(data_raw[:80].decode("utf-8", "replace"))
                        self._finish(aid, Status.FAILED, run_s=lat, reason=(
                            f"provider {name!r}: answered garbage (HTTP {code}, not JSON: {snippet!r})"))
                        return
                    st.ok += 1
                    out = {"provider": name, "result": data}
                    key = provider_request(cmd.action.payload).coalesce
                    if isinstance(key, str) and cfg.cache_ttl_s > 0:
                        self.cache.put(key, out, self.clock(), cfg.cache_ttl_s)
                        if cfg.cache_dir:
                            _disk_put(cfg.cache_dir, key, out, cfg.cache_ttl_s)
                    self._finish(aid, Status.SUCCEEDED, run_s=lat,
                                 output=ProviderResult(provider=name, result=data))
                    return
                if code < 500:
                    self._error(st, f"http_{code}")
                    snippet = self.redact(data_raw[:200].decode("utf-8", "replace"))
                    self._finish(aid, Status.FAILED, run_s=lat,
                                 reason=f"provider {name!r}: HTTP {code}: {snippet}")
                    return
                err, kind = f"HTTP {code}", "http_5xx"
            self._error(st, kind)
            tries += 1
            if tries > cfg.retries:
                self._finish(aid, Status.FAILED, run_s=self.clock() - started,
                             reason=f"provider {name!r}: {err} ({tries} tries)")
                return
            pause = random.uniform(0.0, min(self.backoff_cap_s, self.backoff_base_s * 2 ** tries))
            if self.clock() + pause >= cmd.deadline:
                self._finish(aid, Status.FAILED, run_s=self.clock() - started,
                             reason=f"provider {name!r}: {err} ({tries} tries; no time left "
                                    "before the deadline for another)")
                return
            st.retries += 1
            await asyncio.sleep(pause)

    def stats_view(self) -> dict[str, dict[str, Any]]:
        return {name: s.as_dict() for name, s in sorted(self.stats.items())}

    async def aclose(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for c in self._clients.values():
            await c.aclose()
        self._clients.clear()
