"""A provider as the service config declares it: where it is, how to authenticate, its limits.

```yaml
providers:
  - name: serper
    kind: search              # search | fetch | http
    base_url: https://google.serper.dev
    path: /search             # (search: /search; fetch: /; http: the action's own path)
    keys: [{file: /etc/tangram/serper.key}, {env: SERPER_KEY}]   # pooled, round robin
    auth_header: X-API-KEY    # the key's header (default Authorization, "Bearer KEY")
    limits: {rate_per_s: 50, burst: 50, concurrency: 16, budget: 100000}   # or rate_per_min
    timeout_s: 30             # one call (the action's deadline bounds it too)
    retries: 3                # 5xx / connection errors, jittered backoff within the deadline
    cache_ttl_s: 600          # answers kept (0: none); per tenant unless cache_shared: true
    cache_dir: /var/cache/tangram/serper   # answers also kept on disk (survive a restart)
    local_first: {index: wiki, min_score: 0.5, topk: 3}   # search: a local index answers first
```

Keys are read here, once, and only kept in `ProviderConfig.keys` (never printed: `__repr__`
shows how many). A missing key file or an unset variable is a `ProviderConfigError` naming the
field (``providers[0].keys[1].file``), never a call that fails later.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.errors import TangramError
from ...core.providers import ProviderLimits

KINDS = ("search", "fetch", "http")
_KEYS = {"name", "kind", "base_url", "path", "keys", "auth_header", "auth_prefix", "limits",
         "timeout_s", "retries", "cache_ttl_s", "cache_shared", "cache_dir", "query_field",
         "url_field", "local_first"}
_LIMIT_KEYS = {"rate_per_s", "rate_per_min", "burst", "concurrency", "budget", "budget_per_hour",
               "budget_per_step", "min_rate_per_s",
               "decrease", "probe_per_s", "max_attempts"}


class ProviderConfigError(TangramError, ValueError):
    """A provider entry is wrong; ``field`` names where (``providers[0].limits.burst``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True, slots=True)
class LocalFirst:
    """A search provider's local stand-in: a search is asked of this local index first, and
    the provider is called only when the index cannot answer it (runtime/providers.py,
    `ProviderFront.search`; docs/search.md, "Local first, then the provider")."""

    index: str  # a local index (`tangram index build --name NAME`), served as a retriever model
    # the index's top score (cosine) below this: the provider answers (None: the index always
    # answers when it can)
    min_score: float | None = None
    topk: int = 3  # documents the index returns (Search-R1's default)


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    name: str
    kind: str
    base_url: str
    limits: ProviderLimits
    path: str = ""
    keys: tuple[str, ...] = field(default=(), repr=False)  # secrets: never shown
    auth_header: str = "Authorization"
    auth_prefix: str = "Bearer "
    timeout_s: float = 30.0
    retries: int = 3
    cache_ttl_s: float = 600.0
    cache_shared: bool = False
    cache_dir: str | None = None  # answers also kept on disk here (None: memory only)
    query_field: str = "q"
    url_field: str = "url"
    local_first: LocalFirst | None = None  # search only: a local index answers first

    def __repr__(self) -> str:
        return (f"ProviderConfig(name={self.name!r}, kind={self.kind!r}, base_url={self.base_url!r},"
                f" keys=<{len(self.keys)} hidden>, limits={self.limits!r})")


def _num(raw: Any, where: str, *, lo: float = 0.0, strict: bool = False, integer: bool = False,
         ) -> float:
    ok = isinstance(raw, int | float) and not isinstance(raw, bool)
    if ok and integer and not isinstance(raw, int):
        ok = False
    if ok:
        v = float(raw)
        ok = v == v and v not in (float("inf"), float("-inf")) and (v > lo if strict else v >= lo)
    if not ok:
        rule = f"{'an integer' if integer else 'a finite number'} {'>' if strict else '>='} {lo:g}"
        raise ProviderConfigError(where, f"must be {rule}, got {raw!r}")
    return float(raw)


def _keys(raw: Any, where: str, env: Mapping[str, str]) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise ProviderConfigError(where, "must be a list of {file: PATH} or {env: NAME}")
    out: list[str] = []
    for i, k in enumerate(raw):
        w = f"{where}[{i}]"
        if not isinstance(k, Mapping) or len(k) != 1 or next(iter(k)) not in ("file", "env"):
            raise ProviderConfigError(w, "must be {file: PATH} or {env: NAME}")
        (src, val), = k.items()
        if not isinstance(val, str) or not val:
            raise ProviderConfigError(f"{w}.{src}", "must be a non-empty string")
        if src == "file":
            try:
                key = Path(val).read_text(encoding="utf-8").strip()
            except OSError as e:
                raise ProviderConfigError(f"{w}.file", f"cannot read the key file: "
                                                       f"{e.strerror or type(e).__name__}") from None
        else:
            key = env.get(val, "").strip()
            if not key:
                raise ProviderConfigError(f"{w}.env", f"variable {val} is not set or empty")
        if not key or any(c in key for c in "\r\n"):
            raise ProviderConfigError(f"{w}.{src}", "the key is empty or spans lines")
        out.append(key)
    return tuple(out)


def parse_limits(name: str, raw: Any, where: str) -> ProviderLimits:
    if not isinstance(raw, Mapping):
        raise ProviderConfigError(where, "must be a mapping (rate_per_s or rate_per_min, ...)")
    unknown = sorted(set(raw) - _LIMIT_KEYS)
    if unknown:
        raise ProviderConfigError(f"{where}.{unknown[0]}", "unknown field")
    if ("rate_per_s" in raw) == ("rate_per_min" in raw):
        raise ProviderConfigError(f"{where}.rate_per_s", "give exactly one of rate_per_s, rate_per_min")
    if "rate_per_s" in raw:
        rate = _num(raw["rate_per_s"], f"{where}.rate_per_s", strict=True)
    else:
        rate = _num(raw["rate_per_min"], f"{where}.rate_per_min", strict=True) / 60.0
    kw: dict[str, Any] = {"name": name, "rate": rate}
    if "burst" in raw:
        kw["burst"] = _num(raw["burst"], f"{where}.burst", lo=1.0)
    if "concurrency" in raw:
        kw["concurrency"] = int(_num(raw["concurrency"], f"{where}.concurrency", lo=1, integer=True))
    for b in ("budget", "budget_per_hour", "budget_per_step"):
        if raw.get(b) is not None:
            kw[b] = int(_num(raw[b], f"{where}.{b}", integer=True))
    if "min_rate_per_s" in raw:
        kw["min_rate"] = _num(raw["min_rate_per_s"], f"{where}.min_rate_per_s", strict=True)
    if "probe_per_s" in raw:
        kw["probe_per_s"] = _num(raw["probe_per_s"], f"{where}.probe_per_s")
    if "decrease" in raw:
        kw["decrease"] = _num(raw["decrease"], f"{where}.decrease", strict=True)
    if "max_attempts" in raw:
        kw["max_attempts"] = int(_num(raw["max_attempts"], f"{where}.max_attempts", lo=1, integer=True))
    try:
        return ProviderLimits(**kw)
    except ValueError as e:  # (a rule between fields: min_rate above rate, decrease >= 1)
        msg = str(e)
        sub = msg.split(":", 1)[0].rsplit(".", 1)[-1]
        raise ProviderConfigError(f"{where}.{sub}", msg.split(": ", 1)[-1]) from None


def _cache_dir(raw: Any, where: str) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw:
        raise ProviderConfigError(where, f"must be a directory path, got {raw!r}")
    try:
        Path(raw).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ProviderConfigError(where, f"cannot make the directory: {e.strerror or type(e).__name__}") from None
    return raw


def _local_first(raw: Any, where: str, kind: str) -> LocalFirst | None:
    if raw is None:
        return None
    if kind != "search":
        raise ProviderConfigError(where, f"only a search provider has one, this is a {kind} provider")
    if not isinstance(raw, Mapping):
        raise ProviderConfigError(where, "must be a mapping {index: NAME, min_score?: S, topk?: K}")
    unknown = sorted(set(raw) - {"index", "min_score", "topk"})
    if unknown:
        raise ProviderConfigError(f"{where}.{unknown[0]}", "unknown field")
    index = raw.get("index")
    if not isinstance(index, str) or not index:
        raise ProviderConfigError(f"{where}.index", f"must name a local index, got {index!r}")
    ms = raw.get("min_score")
    if ms is not None and (not isinstance(ms, int | float) or isinstance(ms, bool)
                           or not -1.0 <= ms <= 1.0):
        raise ProviderConfigError(f"{where}.min_score", f"must be a number in [-1, 1] (a cosine), got {ms!r}")
    topk = raw.get("topk", 3)
    from ..retrieval.index import MAX_TOPK

    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= MAX_TOPK:
        raise ProviderConfigError(f"{where}.topk", f"must be an integer in [1, {MAX_TOPK}], got {topk!r}")
    return LocalFirst(index=index, min_score=None if ms is None else float(ms), topk=topk)


def parse_provider(raw: Any, where: str, env: Mapping[str, str] | None = None) -> ProviderConfig:
    env = os.environ if env is None else env
    if not isinstance(raw, Mapping):
        raise ProviderConfigError(where, "must be a mapping")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ProviderConfigError(f"{where}.{unknown[0]}", "unknown field")
    name = raw.get("name")
    if not isinstance(name, str) or not name or len(name) > 64 or not name.replace("-", "").replace("_", "").isalnum():
        raise ProviderConfigError(f"{where}.name", f"must be 1-64 letters, digits, '-' or '_', got {name!r}")
    kind = raw.get("kind", "search")
    if kind not in KINDS:
        raise ProviderConfigError(f"{where}.kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
    url = raw.get("base_url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ProviderConfigError(f"{where}.base_url", f"must be an http(s) URL, got {url!r}")
    path = raw.get("path", "/search" if kind == "search" else "")
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise ProviderConfigError(f"{where}.path", f"must start with '/', got {path!r}")
    limits = parse_limits(name, raw.get("limits"), f"{where}.limits")
    strs = {}
    for k, default in (("auth_header", "Authorization"), ("auth_prefix", "Bearer "),
                       ("query_field", "q"), ("url_field", "url")):
        v = raw.get(k, default)
        if not isinstance(v, str) or (k != "auth_prefix" and not v):
            raise ProviderConfigError(f"{where}.{k}", f"must be a non-empty string, got {v!r}")
        strs[k] = v
    if "auth_header" in raw and "auth_prefix" not in raw:
        strs["auth_prefix"] = ""  # (an API-key header carries the key alone)
    shared = raw.get("cache_shared", False)
    if not isinstance(shared, bool):
        raise ProviderConfigError(f"{where}.cache_shared", f"must be true or false, got {shared!r}")
    return ProviderConfig(
        name=name, kind=kind, base_url=url.rstrip("/"), limits=limits, path=path,
        keys=_keys(raw.get("keys"), f"{where}.keys", env),
        timeout_s=_num(raw.get("timeout_s", 30.0), f"{where}.timeout_s", strict=True),
        retries=int(_num(raw.get("retries", 3), f"{where}.retries", integer=True)),
        cache_ttl_s=_num(raw.get("cache_ttl_s", 600.0), f"{where}.cache_ttl_s"),
        cache_shared=shared, cache_dir=_cache_dir(raw.get("cache_dir"), f"{where}.cache_dir"),
        local_first=_local_first(raw.get("local_first"), f"{where}.local_first", kind), **strs)


def parse_providers(raw: Any, where: str = "providers",
                    env: Mapping[str, str] | None = None) -> tuple[ProviderConfig, ...]:
    """The service config's ``providers`` list (None: none)."""
    if raw is None:
        return ()
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise ProviderConfigError(where, "must be a list of providers")
    out = tuple(parse_provider(p, f"{where}[{i}]", env) for i, p in enumerate(raw))
    names = [p.name for p in out]
    for i, n in enumerate(names):
        if n in names[:i]:
            raise ProviderConfigError(f"{where}[{i}].name", f"provider {n!r} declared twice")
    return out
