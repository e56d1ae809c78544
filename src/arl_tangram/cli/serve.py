"""`tangram serve`: the orchestrator service over HTTP (uvicorn).

Invariant: it refuses to bind a non-loopback address without a bearer token (``--token-file``,
``TANGRAM_TOKEN``, ``--token`` or the config's ``auth.token``) of at least `MIN_TOKEN_LEN`
characters that are not all whitespace, and a bad config file exits with status 2 and one line
naming file:line: field.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from typing import Any

from ..runtime.config import MIN_TOKEN_LEN, POLICY_NAMES, read_token_file
from ..runtime.config import weak_token as weak_token

__all__ = ["MIN_TOKEN_LEN", "TokenError", "add_parser", "load_config", "run", "weak_token"]


class TokenError(ValueError):
    """The token cannot be read, or is too weak for the bind asked for."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("serve", help="run the orchestrator service (HTTP API)",
                              description="Run the ARL-Tangram service: SandboxFusion /run_code, "
                              "native /v1 routes, /get_reward, /classify, /metrics and a dashboard.")
    p.add_argument("--config", help="service config YAML (default: this machine, embedded default)")
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="bind port (default 8080)")
    p.add_argument("--keep-alive-s", type=float, dest="keep_alive_s", metavar="SECONDS",
                   help="how long an idle keep-alive connection stays open (default 75, "
                   "longer than common clients' idle pools; see docs/api.md)")
    p.add_argument("--policy", choices=POLICY_NAMES, help="scheduling policy (default tangram)")
    p.add_argument("--token", help="bearer token; required off loopback (at least "
                   f"{MIN_TOKEN_LEN} characters). WARNING: a token in argv is visible to every "
                   "local user (ps, /proc): prefer --token-file or $TANGRAM_TOKEN")
    p.add_argument("--token-file", dest="token_file", metavar="PATH",
                   help="read the bearer token from this file (its first line; the way to pass "
                   "it, with $TANGRAM_TOKEN)")
    p.add_argument("--no-models", action="store_true", help="do not load the default reward model")
    p.add_argument("--ray", metavar="auto|ADDRESS",
                   help="run on a Ray cluster: one NodeAgent per Ray node (see docs/ray.md)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=run)
    return p


def load_config(args: argparse.Namespace) -> Any:
    from ..runtime.config import default_config, load_service_config

    cfg = (load_service_config(args.config) if args.config
           else default_config(with_models=not args.no_models))
    over: dict[str, Any] = {}
    for name in ("host", "port", "policy", "keep_alive_s"):
        if getattr(args, name, None) is not None:
            over[name] = getattr(args, name)
    token = (args.token or _token_file(getattr(args, "token_file", None))
             or os.environ.get("TANGRAM_TOKEN") or cfg.token)
    if token:
        over["token"] = token
    return dataclasses.replace(cfg, **over) if over else cfg


def _token_file(path: str | None) -> str | None:
    """The token in ``path``: its first line, without the line end and surrounding blanks."""
    if path is None:
        return None
    try:
        return read_token_file(path)
    except ValueError as exc:
        raise TokenError(f"--token-file {path}: {str(exc).split(': ', 1)[1]}") from None


def _ray_engine(cfg: Any, address: str) -> Any:
    """An unstarted engine whose nodes are the Ray cluster's (RayExecutor)."""
    from ..runtime.build import engine_config
    from ..runtime.engine import Engine
    from ..runtime.ray_executor import RayExecutor

    return Engine(RayExecutor.from_service_config(cfg, address=address), engine_config(cfg))


def run(args: argparse.Namespace) -> int:
    from ..api.app import create_app
    from ..api.middleware import is_loopback
    from ..core.errors import SpecError
    from ..runtime.build import build_engine

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if getattr(args, "token", None) and getattr(args, "token_file", None):
        print("tangram serve: give --token or --token-file, not both", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args)
    except (SpecError, ValueError) as exc:
        print(f"tangram serve: {exc}", file=sys.stderr)
        return 2
    why = (None if is_loopback(cfg.host) or (cfg.tenants and not cfg.token)
           else weak_token(cfg.token))
    if why is not None:
        print(f"tangram serve: binding {cfg.host} (not loopback) {why}: put it in a file for "
              "--token-file or set TANGRAM_TOKEN", file=sys.stderr)
        return 2
    if getattr(args, "token", None):
        print("tangram serve: warning: --token is visible to every local user (ps, /proc); "
              "use --token-file or TANGRAM_TOKEN", file=sys.stderr)
    import uvicorn

    from ..managers.cpu.images import spools

    spools.sweep(cfg.image_upload_dir)  # upload spools a killed service left (issue 41, M7)
    app = create_app(_ray_engine(cfg, args.ray) if getattr(args, "ray", None) else build_engine(cfg),
                     cfg, manage_engine=True)
    models = ", ".join(m.name for m in cfg.models) or "none"
    print(f"tangram serve: http://{cfg.host}:{cfg.port}  policy={cfg.policy}  models={models}",
          file=sys.stderr)
    # one write per response, and deadlines and caps for slow clients (see their docstrings)
    from ..api.transport import guard_of, http_protocol

    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level=args.log_level,
                access_log=False, timeout_graceful_shutdown=5,
                http=http_protocol(guard_of(cfg.limits)),
                timeout_keep_alive=cfg.keep_alive_s)
    return 0
