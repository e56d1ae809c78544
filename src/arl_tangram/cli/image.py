"""`tangram image import|ls|rm`: this node's environment-image cache (issue 17).

Invariant: with ``--url`` the command talks to a running service (``/v1/images``: every node
of it); otherwise it works on a cache directory on this machine (``--images-dir``, or the one
a ``--config`` file's first node uses, or the CPU manager's default), and an image that a
running service on this machine uses cannot be removed or replaced (the service holds a
shared lock on it). No registry is contacted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "image", help="import, list and remove environment images",
        description="Manage the node's image cache: import an OCI image layout (directory or "
        "archive, as `skopeo copy` / `podman save --format oci-archive` write), a docker-archive "
        "or a root file-system tarball or directory; list; remove (refused while in use).")
    sub = p.add_subparsers(dest="image_cmd", metavar="{import,ls,rm}")

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--url", help="a running service (e.g. http://127.0.0.1:8080)")
        q.add_argument("--token", default=os.environ.get("TANGRAM_TOKEN"),
                       help="its bearer token (default: $TANGRAM_TOKEN)")
        q.add_argument("--images-dir", help="the cache directory on this machine")
        q.add_argument("--config", help="a service YAML whose first node's cache to use")
        q.add_argument("--json", action="store_true", help="print JSON")

    qi = sub.add_parser("import", help="import an image from a file or directory")
    qi.add_argument("path")
    qi.add_argument("--name", required=True)
    qi.add_argument("--node", help="(with --url) only this node")
    common(qi)
    ql = sub.add_parser("ls", help="list images")
    common(ql)
    qr = sub.add_parser("rm", help="remove an image (refused while in use)")
    qr.add_argument("name")
    common(qr)
    p.set_defaults(func=run)
    return p


def _images_dir(args: argparse.Namespace) -> str:
    if args.images_dir:
        return str(args.images_dir)
    from ..managers.cpu import CpuManagerConfig

    if args.config:
        from ..runtime.config import load_service_config

        return load_service_config(args.config).nodes[0].cpu.image_cache_dir()
    return CpuManagerConfig().image_cache_dir()


def _http(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    import httpx

    headers = {"authorization": f"Bearer {args.token}"} if args.token else {}
    r = httpx.request(method, args.url.rstrip("/") + path, json=body, headers=headers,
                      timeout=3600)
    try:
        out = r.json()
    except ValueError:
        out = {"detail": r.text}
    if r.status_code >= 400:
        raise RuntimeError(f"HTTP {r.status_code}: {out.get('detail', out)}")
    return out


def _table(rows: list[dict[str, Any]], node: str | None = None) -> None:
    for i in rows:
        where = f"{node}\t" if node else ""
        print(f"{where}{i['name']}\t{i['format']}\t{len(i['layers'])} layer(s)\t"
              f"{i['size'] / 1e6:.1f} MB\tin use: {i.get('in_use', 0)}\t{i['source']}")


def run(args: argparse.Namespace) -> int:
    from ..managers.cpu.images.store import ImageError, ImageStore

    cmd = getattr(args, "image_cmd", None)
    if cmd is None:
        print("tangram image: give import, ls or rm (see --help)", file=sys.stderr)
        return 2
    try:
        if args.url:
            if cmd == "import":
                out = _http(args, "POST", "/v1/images", {
                    "path": os.path.abspath(args.path), "name": args.name, "node": args.node})
            elif cmd == "ls":
                out = _http(args, "GET", "/v1/images")
            else:
                out = _http(args, "DELETE", f"/v1/images/{args.name}")
            if args.json or cmd != "ls":
                print(json.dumps(out, indent=2))
            else:
                for node, rows in out["nodes"].items():
                    _table(rows, node)
            return 0
        store = ImageStore(_images_dir(args))
        if cmd == "import":
            img = store.import_path(args.path, args.name)
            print(json.dumps(img.to_dict(), indent=2) if args.json else
                  f"imported {img.name} ({img.fmt}, {len(img.layers)} layer(s), "
                  f"{img.size / 1e6:.1f} MB) in {img.import_s:.2f} s into {store.root}")
        elif cmd == "ls":
            rows = [i.to_dict() for i in store.list_images()]
            if args.json:
                print(json.dumps(rows, indent=2))
            else:
                _table(rows)
        else:
            store.remove(args.name)
            print(f"removed {args.name}")
        return 0
    except (ImageError, RuntimeError, OSError, ValueError) as e:
        print(f"tangram image {cmd}: {e}", file=sys.stderr)
        return 1
