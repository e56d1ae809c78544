"""Service configuration: one YAML file (``tangram serve --config``) or the embedded default.

Invariant: a `ServiceConfig` is validated when built; every error in a file is a `SpecError`
naming ``file:line: field`` (like `core.cluster.parse_cluster`). A node's manager sections
(``cpu``, ``gpu``) are built into the managers' own typed configs (`CpuManagerConfig`,
`GpuManagerConfig`) when the file is parsed, once; an error names the key
(``nodes[0].cpu.warm_max``). The core's `CoreConfig` is built once, with the `ServiceConfig`
(``ServiceConfig.core``: ``policy``, ``scheduler``, the providers' limits, the tenants' shares),
and handed to the engine as it is.

Layout of the file (every key optional)::

    policy: tangram               # tangram | trajectory-bound | task-isolated | fifo
    server: {host: 127.0.0.1, port: 8080, keep_alive_s: 75}
    auth: {token_env: TANGRAM_TOKEN}   # or token: "...", or token_file: /path (first line)
    tenants:                      # named tokens, each with its quotas (see TenantConfig)
      - {name: alice, token_file: /etc/tangram/alice, max_sessions: 64,
         max_concurrent_actions: 256, cpu_share: 0.5, share: 0.5}
    limits: {max_body_bytes: 8388608, max_pending: 100000, result_ttl_s: 600, ...}
    default_reward_model: minilm
    nodes:
      - name: local
        pool: default
        capacity: {cpu: 2, memory_mb: 4096}   # override what the node measures
        cpu: {...}                               # CpuManagerConfig fields
        gpu: {...}                               # GpuManagerConfig fields; `gpu: false` disables
    models:
      - {name: minilm, kind: similarity, path: /path/to/hf/dir}
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from ..core.cluster import ModelSpec
from ..core.config import POLICIES, CoreConfig
from ..core.errors import SpecError
from ..core.images import valid_name
from ..core.resources import Resources
from ..managers.api.config import ProviderConfig, ProviderConfigError, parse_providers
from ..managers.cpu.config import CpuManagerConfig
from ..managers.gpu.config import GpuManagerConfig
from ..specfile import read_yaml

# the core's policies a service may run: all but static-pool, a simulator baseline whose k
# is given in its label (`sim.runner`)
POLICY_NAMES = tuple(p for p in POLICIES if p != "static-pool")
MIN_TOKEN_LEN = 16  # a token read from a config file, or guarding a public bind, has this many
TENANT_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}\Z")  # (match + \Z: not "x\n")
DEFAULT_TENANT = "default"  # the tenant of the single ``auth.token`` / ``--token``
_M = TypeVar("_M", CpuManagerConfig, GpuManagerConfig)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    """One node hosted by the local executor."""

    name: str = "local"  # node name the core sees
    pool: str = "default"  # pool label
    capacity: Resources | None = None  # override of the measured capacity (None: measure)
    cpu: CpuManagerConfig = field(default_factory=CpuManagerConfig)  # its CPU manager's
    gpu: GpuManagerConfig | None = field(default_factory=GpuManagerConfig)  # None: no GPU manager
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name must be a non-empty string")
        if not isinstance(self.cpu, CpuManagerConfig):
            raise TypeError(f"cpu must be a CpuManagerConfig, got {type(self.cpu).__name__}")
        if self.gpu is not None and not isinstance(self.gpu, GpuManagerConfig):
            raise TypeError(f"gpu must be a GpuManagerConfig or None, got {type(self.gpu).__name__}")


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitsConfig:
    """Bounds that keep the service alive under abuse or overload."""

    max_body_bytes: int = 8 * 1024 * 1024  # request bodies larger than this get 413
    max_pending: int = 100_000  # unfinished actions; beyond this new submits are shed
    result_ttl_s: float = 600.0  # finished results are kept this long for GET /v1/actions/{id}
    max_results: int = 100_000  # and at most this many (oldest evicted first)
    idempotency_ttl_s: float = 3600.0  # how long an idempotency key maps to its action
    shed_grace_s: float = 10.0  # /run_code answers 504 after compile+run timeout + this
    tick_s: float = 0.5  # period of Tick events (aging, TTLs, scale-in)
    max_batch: int = 4096  # actions in one POST /v1/actions
    max_wait_s: float = 300.0  # longest long-poll a client may ask for
    max_sessions: int = 1024  # open sessions; POST /v1/sessions beyond this gets 429
    # POST /v1/sessions answers once its node opened the session (201) or could not (503, the
    # node's reason); still waiting for room on a node after this long: 202 "opening"
    session_open_wait_s: float = 30.0
    # slow clients (issue 35, M4; api/transport.py `ConnectionGuard`): a request's headers must
    # be whole within header_timeout_s of the connection (or of its first byte on a kept-alive
    # one), its body may go body_timeout_s without a byte while the server waits for one; past
    # either the connection is closed. Connections that have not finished their first request's
    # headers (no token seen yet): at most max_connections_per_ip from one address and
    # max_pending_connections in all, the one waiting longest dropped (docs/api.md).
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_connections_per_ip: int = 64
    max_pending_connections: int = 256

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int | float) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{f.name} must be a positive number, got {v!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantConfig:
    """One named API token and its quotas (issue 25). What a tenant creates (sessions, actions,
    images imported over HTTP) is its own: another tenant's requests get 404 for it.

    Quotas (None: no cap of its own; the service-wide limits still hold):
    ``max_sessions``: its open sessions; ``max_concurrent_actions``: its actions submitted and
    not yet finished; ``cpu_share``: the fraction of the cluster's CPUs its unfinished actions
    may demand at once (a submit beyond a cap gets 429).

    ``share``: its weight in the scheduler's fair share (issue 41; docs/core.md, "Tenants' fair
    share"): under contention the core serves the tenant with the least dominant share of
    what is in use over its ``share`` first, and lends what a tenant leaves idle. None: the
    smallest share a tenant names (no tenant naming one: no fair share, one order for all)."""

    name: str
    token: str = field(repr=False)
    max_sessions: int | None = None
    max_concurrent_actions: int | None = None
    cpu_share: float | None = None
    share: float | None = None
    # MiB of each node's layer budget kept for its image sessions' writable layers (issue 41,
    # M3; `CpuManagerConfig.layer_reservations`): below it, never refused because other
    # tenants filled the node. None: the shared part only.
    layer_reserve_mb: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not TENANT_NAME_RE.match(self.name):
            raise ValueError(f"name must match {TENANT_NAME_RE.pattern}, got {self.name!r}")
        if not isinstance(self.token, str) or not self.token.strip():
            raise ValueError("token must be a non-blank string")
        for k in ("max_sessions", "max_concurrent_actions", "layer_reserve_mb"):
            v = getattr(self, k)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise ValueError(f"{k} must be a positive integer, got {v!r}")
        c = self.cpu_share
        if c is not None and (not isinstance(c, int | float) or isinstance(c, bool)
                              or not 0 < c <= 1):
            raise ValueError(f"cpu_share must be in (0, 1], got {c!r}")
        w = self.share
        if w is not None and (not isinstance(w, int | float) or isinstance(w, bool)
                              or not 0 < w < math.inf):
            raise ValueError(f"share must be a finite number > 0, got {w!r}")


def weak_token(token: str | None) -> str | None:
    """Why ``token`` is too weak to guard anything (None when it is not): fewer than
    `MIN_TOKEN_LEN` characters, or all whitespace."""
    if not token:
        return "needs a token"
    if not token.strip():
        return "needs a token that is not all whitespace"
    if len(token.strip()) < MIN_TOKEN_LEN:
        return (f"needs a token of at least {MIN_TOKEN_LEN} characters "
                f"(this one has {len(token.strip())})")
    return None


def read_token_file(path: str) -> str:
    """The token in ``path``: its first line without the line end and surrounding blanks
    (ValueError saying why when it cannot be read or is empty)."""
    try:
        with open(path, encoding="utf-8") as f:
            line = f.readline()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"token file {path}: cannot read it: {exc}") from None
    token = line.strip()
    if not token:
        raise ValueError(f"token file {path}: its first line is empty")
    return token


DEFAULT_KEEP_ALIVE_S = 75.0  # see ServiceConfig.keep_alive_s


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceConfig:
    """Everything `tangram serve` needs."""

    policy: str = "tangram"  # core policy name
    nodes: tuple[NodeConfig, ...] = (NodeConfig(),)  # nodes the local executor hosts
    models: tuple[ModelSpec, ...] = ()  # reward models the GPU managers may load
    default_reward_model: str | None = None  # model used when a reward request names none
    host: str = "127.0.0.1"  # bind address
    port: int = 8080  # bind port
    # How long the server keeps an idle HTTP keep-alive connection open. Longer than common
    # clients' idle pools (aiohttp 15 s, httpx 5 s, requests/urllib3: no limit), so the client,
    # not the server, closes idle connections: a server that closes first races the client's
    # next request on that connection ("Server disconnected without sending a response").
    # 75 s as nginx's default; uvicorn's own default is 5 s.
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S
    token: str | None = field(default=None, repr=False)  # the single bearer token (tenant
    # DEFAULT_TENANT, no quotas of its own); a token or tenants are required off loopback
    tenants: tuple[TenantConfig, ...] = ()  # named tokens with quotas (issue 25)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    # Scheduler knobs: `CoreConfig` fields other than ``policy`` (e.g. ``warm_keys``,
    # ``short_action_s``, ``aging_s``), validated by building that CoreConfig.
    scheduler: Mapping[str, Any] = field(default_factory=dict)
    # Environment images every node imports at start (issue 17): (name, path on the node).
    images: tuple[tuple[str, str], ...] = ()
    # Of those, the names a Ray node imports when its agent starts (``eager: true``); the
    # others a Ray node imports on first use. (The local executor imports all at start.)
    eager_images: tuple[str, ...] = ()
    # Host directories whose files `POST /v1/images {"path"}` may import (issue 25): none by
    # default (every path refused). YAML: ``images: {import_dirs: [...], load: [...]}``.
    image_import_dirs: tuple[str, ...] = ()
    # `PUT /v1/images/{name}` (an archive in the request body, issue 25): its size cap, and the
    # directory its body is spooled to before the import (None: the system's temp directory).
    # YAML: ``images: {max_upload_mb: 16384, upload_dir: /var/tmp}``.
    image_max_upload_bytes: int = 16 * 1024**3
    image_upload_dir: str | None = None
    # Providers (issue 37): web search, page fetch, any HTTP API, with their limits, which the
    # core schedules as capacity (`managers/api/config.py`; docs/search.md).
    providers: tuple[ProviderConfig, ...] = ()
    source: str = "<default>"  # where it came from (file path or <default>)
    # The core's config, built once when this config is (`_core_config`): ``policy``, the
    # ``scheduler`` knobs, the providers' limits and the tenants' shares.
    core: CoreConfig = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.policy not in POLICY_NAMES:
            raise ValueError(f"policy must be one of {', '.join(POLICY_NAMES)}, got {self.policy!r}")
        if not self.nodes:
            raise ValueError("nodes must not be empty")
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"node names must be unique, got {names}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if (not isinstance(self.keep_alive_s, int | float) or isinstance(self.keep_alive_s, bool)
                or not self.keep_alive_s > 0):
            raise ValueError(f"keep_alive_s must be a positive number, got {self.keep_alive_s!r}")
        tnames = [t.name for t in self.tenants] + ([DEFAULT_TENANT] if self.token else [])
        if len(set(tnames)) != len(tnames):
            raise ValueError(f"tenants must have unique names (the single token is tenant "
                             f"{DEFAULT_TENANT!r}), got {tnames}")
        toks = [t.token for t in self.tenants] + ([self.token] if self.token else [])
        if len(set(toks)) != len(toks):
            raise ValueError("tenants must have distinct tokens (two have the same)")
        mnames = {m.name for m in self.models}
        if self.default_reward_model and self.default_reward_model not in mnames:
            raise ValueError(f"default_reward_model {self.default_reward_model!r} is not a model")
        object.__setattr__(self, "core", self._core_config())
        reserve = {t.name: t.layer_reserve_mb for t in self.tenants if t.layer_reserve_mb}
        if reserve:  # each node's CPU manager keeps them (its start fails if they pass its budget)
            object.__setattr__(self, "nodes", tuple(
                replace(n, cpu=replace(n.cpu, layer_reservations={**n.cpu.layer_reservations,
                                                                  **reserve}))
                for n in self.nodes))

    def _core_config(self) -> CoreConfig:
        extra: dict[str, Any] = {}
        if self.providers:  # (their limits are capacity the core schedules, issue 37)
            extra["providers"] = tuple(p.limits for p in self.providers)
        shares = self.tenant_shares()  # (the core's fair share, issue 41)
        if shares:
            extra["tenant_shares"] = shares
        try:
            return CoreConfig(policy=self.policy, **{**self.scheduler, **extra})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"scheduler: {exc}") from None

    def model(self, name: str) -> ModelSpec | None:
        return next((m for m in self.models if m.name == name), None)

    def tenant_shares(self) -> dict[str, float] | None:
        """The tenants' ``share`` weights for the core (`CoreConfig.tenant_shares`); None when
        no tenant names one. (The named tenants: the single token's has no share, and is not
        built here, where the core's config is, before a weak token is refused by name.)"""
        shares = {t.name: float(t.share) for t in self.tenants if t.share is not None}
        return shares or None

    def all_tenants(self) -> tuple[TenantConfig, ...]:
        """Every token the service takes: ``tenants`` and the single ``token`` (as tenant
        `DEFAULT_TENANT`, without quotas). Empty: no auth (loopback only)."""
        legacy = (TenantConfig(name=DEFAULT_TENANT, token=self.token),) if self.token else ()
        return (*self.tenants, *legacy)

    def tenant(self, name: str | None) -> TenantConfig | None:
        return next((t for t in self.all_tenants() if t.name == name), None)


# ---- the embedded default ----------------------------------------------------------------------


def gpu_extra_available() -> bool:
    """True when torch and transformers import (the ``[gpu]`` extra is installed)."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except Exception:
        return False
    return True


def default_models() -> tuple[ModelSpec, ...]:
    """The packaged MiniLM similarity model when the ``[gpu]`` extra is installed, else none."""
    if not gpu_extra_available():
        return ()
    try:
        from ..managers.gpu.testing import default_similarity_model_path

        path = default_similarity_model_path()
    except Exception:
        return ()
    if not path:
        return ()
    return (
        ModelSpec(
            name="minilm", kind="similarity", path=str(path), memory_mb=200.0, load_s=2.0,
            alpha=0.01, beta=0.002, max_batch=64, max_instances=1,
        ),
    )


def default_config(*, policy: str = "tangram", with_models: bool = True, **kw: Any) -> ServiceConfig:
    """This machine as one node; MiniLM as the default reward model when available."""
    models = default_models() if with_models else ()
    return ServiceConfig(
        policy=policy, models=models,
        default_reward_model=models[0].name if models else None, **kw,
    )


# ---- YAML ---------------------------------------------------------------------------------------


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items() if k != "__line__"}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    return obj


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self._eager: list[str] = []  # images: entries with eager: true

    def fail(self, raw: Any, fieldname: str, msg: str) -> SpecError:
        line = raw.get("__line__") if isinstance(raw, Mapping) else None
        return SpecError(self.source, line, fieldname, msg)

    def mapping(self, raw: Any, parent: Any, name: str, allowed: set[str]) -> dict[str, Any]:
        if raw is None:
            return {}
        if not isinstance(raw, Mapping):
            raise self.fail(parent, name, "must be a mapping")
        unknown = set(raw) - allowed - {"__line__"}
        if unknown:
            raise self.fail(raw, f"{name}.{sorted(unknown)[0]}", "unknown field")
        return dict(raw)

    def node(self, raw: Any, i: int, parent: Any) -> NodeConfig:
        f = f"nodes[{i}]"
        d = self.mapping(raw, parent, f, {"name", "pool", "capacity", "cpu", "gpu", "labels"})
        cpu = self.manager(CpuManagerConfig, d.get("cpu"), raw, f"{f}.cpu")
        gpu = None if d.get("gpu", {}) is False else self.manager(
            GpuManagerConfig, d.get("gpu"), raw, f"{f}.gpu")
        try:
            cap = d.get("capacity")
            return NodeConfig(
                name=str(d.get("name", "local")), pool=str(d.get("pool", "default")),
                capacity=Resources(_plain(cap)) if cap is not None else None,
                cpu=cpu, gpu=gpu,
                labels={str(k): str(v) for k, v in _plain(d.get("labels") or {}).items()},
            )
        except (TypeError, ValueError, AttributeError) as exc:
            raise self.fail(raw, f, str(exc)) from None

    def manager(self, cls: type[_M], raw: Any, parent: Any, where: str) -> _M:
        """A node's ``cpu:`` or ``gpu:`` section built into ``cls`` (an empty or absent one:
        its defaults); an unknown key or a bad value names the key (``nodes[0].cpu.warm_max``)."""
        names = {f.name for f in fields(cls)}
        d = _plain(self.mapping(raw or {}, parent, where, names))
        try:
            return cls(**d)
        except (TypeError, ValueError) as exc:
            msg = str(exc).removeprefix(f"{cls.__name__}.")
            key = next((k for k in sorted(names, key=len, reverse=True)
                        if msg.startswith(f"{k} ")), None)
            raise self.fail(raw if isinstance(raw, Mapping) else parent,
                            f"{where}.{key}" if key else where, msg) from None

    def model(self, raw: Any, i: int, parent: Any) -> ModelSpec:
        f = f"models[{i}]"
        d = self.mapping(raw, parent, f, set(ModelSpec.__dataclass_fields__))
        if "name" not in d:
            raise self.fail(raw, f"{f}.name", "is required")
        try:
            return ModelSpec(**_plain(d))
        except (TypeError, ValueError) as exc:
            raise self.fail(raw, f, str(exc)) from None

    def image_import_dirs(self, raw: Any, parent: Any) -> tuple[str, ...]:
        """``images.import_dirs`` when ``images`` is a mapping: absolute directories."""
        if not isinstance(raw, Mapping):
            return ()
        dirs = raw.get("import_dirs")
        if dirs is None:
            return ()
        if not isinstance(dirs, list):
            raise self.fail(raw, "images.import_dirs", "must be a list of absolute directories")
        for i, d in enumerate(dirs):
            if not isinstance(d, str) or not os.path.isabs(d) or os.path.realpath(d) == "/":
                raise self.fail(raw, f"images.import_dirs[{i}]",
                                f"must be an absolute directory other than /, got {d!r}")
        return tuple(dirs)

    def image_upload(self, raw: Any) -> dict[str, Any]:
        """``images.max_upload_mb`` and ``images.upload_dir`` when ``images`` is a mapping."""
        if not isinstance(raw, Mapping):
            return {}
        out: dict[str, Any] = {}
        mb = raw.get("max_upload_mb")
        if mb is not None:
            if isinstance(mb, bool) or not isinstance(mb, int) or mb < 1:
                raise self.fail(raw, "images.max_upload_mb", f"must be an integer >= 1, got {mb!r}")
            out["image_max_upload_bytes"] = mb * 1024 * 1024
        d = raw.get("upload_dir")
        if d is not None:
            if not isinstance(d, str) or not os.path.isabs(d):
                raise self.fail(raw, "images.upload_dir", f"must be an absolute directory, got {d!r}")
            out["image_upload_dir"] = d
        return out

    def images(self, raw: Any, parent: Any) -> tuple[tuple[str, str], ...]:
        if raw is None:
            return ()
        if isinstance(raw, Mapping):  # {import_dirs: [...], load: [{name, path}]}
            d = self.mapping(raw, parent, "images",
                             {"import_dirs", "load", "max_upload_mb", "upload_dir"})
            return self.images(d.get("load"), raw)
        if not isinstance(raw, list):
            raise self.fail(parent, "images", "must be a list of {name, path}, or "
                            "{import_dirs: [...], load: [{name, path}]}")
        out = []
        for i, r in enumerate(raw):
            d = self.mapping(r, parent, f"images[{i}]", {"name", "path", "eager"})
            eager = d.get("eager", False)
            if not isinstance(eager, bool):
                raise self.fail(r, f"images[{i}].eager", f"must be true or false, got {eager!r}")
            name, path = d.get("name"), d.get("path")
            if not valid_name(name):
                raise self.fail(r, f"images[{i}].name", f"must be an image name, got {name!r}")
            if not isinstance(path, str) or not os.path.isabs(path):
                raise self.fail(r, f"images[{i}].path", f"must be an absolute path, got {path!r}")
            out.append((name, path))
            if eager:
                self._eager.append(name)
        return tuple(out)

    def strong(self, token: str, raw: Any, fieldname: str) -> str:
        why = weak_token(token)
        if why is not None:
            raise self.fail(raw, fieldname, why)
        return token

    def token(self, d: Mapping[str, Any], raw: Any, where: str) -> str | None:
        """``token`` or ``token_file`` of a mapping (not both), at least `MIN_TOKEN_LEN` long."""
        tok, path = d.get("token"), d.get("token_file")
        if tok is not None and path is not None:
            raise self.fail(raw, f"{where}.token_file", "give token or token_file, not both")
        if path is not None:
            if not isinstance(path, str) or not os.path.isabs(path):
                raise self.fail(raw, f"{where}.token_file", f"must be an absolute path, got {path!r}")
            try:
                tok = read_token_file(path)
            except ValueError as exc:
                raise self.fail(raw, f"{where}.token_file", str(exc)) from None
            return self.strong(tok, raw, f"{where}.token_file")
        if tok is None:
            return None
        if not isinstance(tok, str):
            raise self.fail(raw, f"{where}.token", "must be a string")
        return self.strong(tok, raw, f"{where}.token")

    def tenants(self, raw: Any, parent: Any) -> tuple[TenantConfig, ...]:
        if raw is None:
            return ()
        if not isinstance(raw, list):
            raise self.fail(parent, "tenants", "must be a list of {name, token | token_file, "
                            "max_sessions, max_concurrent_actions, cpu_share, share, layer_reserve_mb}")
        names = {f.name for f in fields(TenantConfig)} | {"token_file"}
        out = []
        for i, r in enumerate(raw):
            f = f"tenants[{i}]"
            d = _plain(self.mapping(r, parent, f, names))
            if d.get("name") == DEFAULT_TENANT:  # (issue 35, L3: it would be the operator)
                raise self.fail(r, f"{f}.name", f"{DEFAULT_TENANT!r} is the single token's "
                                "tenant (auth.token), the operator's; name this one otherwise")
            tok = self.token(d, r, f)
            if tok is None:
                raise self.fail(r, f"{f}.token", "a tenant needs token or token_file")
            d.pop("token_file", None)
            d["token"] = tok
            try:
                out.append(TenantConfig(**d))
            except (TypeError, ValueError) as exc:
                raise self.fail(r, f, str(exc)) from None
        return tuple(out)

    def scheduler(self, raw: Any, parent: Any) -> dict[str, Any]:
        """The ``scheduler`` knobs (`CoreConfig` fields but ``policy``), checked when the
        `ServiceConfig` builds its `CoreConfig` (an error there names ``scheduler``)."""
        names = {f.name for f in fields(CoreConfig)} - {"policy"}
        d = _plain(self.mapping(raw, parent, "scheduler", names))
        for k, v in list(d.items()):
            if isinstance(v, list):
                d[k] = tuple(v)
            elif isinstance(v, Mapping):
                d[k] = Resources(v)
        return d

    def providers(self, raw: Any, parent: Any) -> tuple[ProviderConfig, ...]:
        try:
            return parse_providers(_plain(raw))
        except ProviderConfigError as exc:
            items = raw if isinstance(raw, list) else []
            i = exc.field.split("]", 1)[0].rsplit("[", 1)[-1] if "[" in exc.field else ""
            at = items[int(i)] if i.isdigit() and int(i) < len(items) else parent
            raise self.fail(at, exc.field, str(exc).split(": ", 1)[-1]) from None

    def parse(self, data: Any) -> ServiceConfig:
        top = {"policy", "server", "auth", "limits", "nodes", "models", "default_reward_model",
               "scheduler", "images", "tenants", "providers"}
        d = self.mapping(data, data, "<root>", top)
        server = self.mapping(d.get("server"), data, "server", {"host", "port", "keep_alive_s"})
        auth = self.mapping(d.get("auth"), data, "auth", {"token", "token_env", "token_file"})
        lim_names = {f.name for f in fields(LimitsConfig)}
        limits_raw = self.mapping(d.get("limits"), data, "limits", lim_names)
        try:
            limits = LimitsConfig(**_plain(limits_raw))
        except (TypeError, ValueError) as exc:
            raise self.fail(d.get("limits"), "limits", str(exc)) from None
        raw_nodes = d.get("nodes")
        if raw_nodes is not None and (not isinstance(raw_nodes, list) or not raw_nodes):
            raise self.fail(data, "nodes", "must be a non-empty list")
        nodes = tuple(self.node(r, i, data) for i, r in enumerate(raw_nodes or [{}]))
        raw_models = d.get("models") or []
        if not isinstance(raw_models, list):
            raise self.fail(data, "models", "must be a list")
        models = tuple(self.model(r, i, data) for i, r in enumerate(raw_models))
        token = self.token(auth, d.get("auth"), "auth")
        if token is None and auth.get("token_env"):
            token = os.environ.get(str(auth["token_env"]))
            if token is not None:
                self.strong(token, d.get("auth"), "auth.token_env")
        kw: dict[str, Any] = {"nodes": nodes, "models": models, "limits": limits,
                              "scheduler": self.scheduler(d.get("scheduler"), data),
                              "images": self.images(d.get("images"), data),
                              "image_import_dirs": self.image_import_dirs(d.get("images"), data),
                              **self.image_upload(d.get("images")),
                              "eager_images": tuple(self._eager),
                              "tenants": self.tenants(d.get("tenants"), data),
                              "providers": self.providers(d.get("providers"), data)}
        for key, val in (("policy", d.get("policy")), ("host", server.get("host")),
                         ("port", server.get("port")), ("token", token),
                         ("default_reward_model", d.get("default_reward_model"))):
            if val is not None:
                kw[key] = val if key == "port" else str(val)
        ka = server.get("keep_alive_s")
        if ka is not None:
            if not isinstance(ka, int | float) or isinstance(ka, bool) or not ka > 0:
                raise self.fail(d.get("server"), "server.keep_alive_s",
                                f"must be a positive number of seconds, got {ka!r}")
            kw["keep_alive_s"] = float(ka)
        if "default_reward_model" not in kw and models:
            kw["default_reward_model"] = models[0].name
        try:
            return ServiceConfig(source=self.source, **kw)
        except (TypeError, ValueError) as exc:
            msg = str(exc)
            if msg.startswith("scheduler: "):  # (the CoreConfig it builds)
                raise self.fail(d.get("scheduler") or data, "scheduler",
                                msg.removeprefix("scheduler: ")) from None
            fieldname = msg.split(" ", 1)[0] if msg.split(" ", 1)[0] in top | {"host", "port"} else "<root>"
            raise self.fail(data, fieldname, msg) from None


def parse_service_config(data: Any, source: str = "<config>") -> ServiceConfig:
    """Build a `ServiceConfig` from parsed YAML (mappings may carry ``__line__``)."""
    return _Parser(source).parse(data if data is not None else {})


def load_service_config(path: str | Path) -> ServiceConfig:
    """Read a service config file; errors are `SpecError` naming file:line: field.

    The file itself is masked inside every sandbox of its nodes (``cpu.hidden_paths``), in case
    it lies under a directory sandboxes see (``/etc``, say): it may hold the token."""
    cfg = parse_service_config(read_yaml(path), str(path))
    return hide_in_sandboxes(cfg, os.path.realpath(path))


def overrides(cfg: CpuManagerConfig | GpuManagerConfig) -> dict[str, Any]:
    """The fields of ``cfg`` that differ from its class's defaults, as keyword arguments: what a
    Ray node builds its own config from (`RayExecutor.from_service_config`), so a default that
    depends on the machine (the temp directory of `CpuManagerConfig.work_root`) is that node's."""
    base = type(cfg)()
    return {f.name: getattr(cfg, f.name) for f in fields(cfg)
            if getattr(cfg, f.name) != getattr(base, f.name)}


def hide_in_sandboxes(cfg: ServiceConfig, *paths: str) -> ServiceConfig:
    """``cfg`` with ``paths`` added to every node's ``cpu.hidden_paths``."""
    nodes = []
    for n in cfg.nodes:
        have = n.cpu.hidden_paths or ()
        if isinstance(have, str):
            have = (have,)
        nodes.append(replace(n, cpu=replace(n.cpu, hidden_paths=(*tuple(have), *paths))))
    return replace(cfg, nodes=tuple(nodes))
