"""The `tangram` command: `serve`, `demo`, `simulate`, each a module with add_parser/run.

Invariant: subcommand modules are imported only when needed, so `tangram simulate` does not pay
for the service's imports, and a missing module is reported in words, not with a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

SUBCOMMANDS = {
    "serve": ("arl_tangram.cli.serve", "run the ARL-Tangram service (HTTP API)"),
    "demo": ("arl_tangram.cli.demo", "run the main demonstration job"),
    "simulate": ("arl_tangram.cli.simulate", "simulate a workload under the scheduling policies"),
    "replay": ("arl_tangram.cli.replay", "replay a trace on real sandboxes and models"),
    "calibrate": ("arl_tangram.cli.calibrate", "measure this machine into a cluster spec"),
    "image": ("arl_tangram.cli.image", "import, list and remove environment images"),
    "index": ("arl_tangram.cli.index", "build and list local retriever indexes (/retrieve)"),
}


def _load(name: str) -> Any:
    module, _help = SUBCOMMANDS[name]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            return None
        raise


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tangram", description="ARL-Tangram: action-level "
                                     "management of external resources for agentic RL")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name, (_module, help_text) in SUBCOMMANDS.items():
        mod = _load(name) if only in (None, name) else None
        if mod is not None and hasattr(mod, "add_parser"):
            mod.add_parser(sub)
        else:
            sub.add_parser(name, help=help_text + ("" if mod is not None else " (not installed)"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    wanted = next((a for a in args_list if a in SUBCOMMANDS), None)
    parser = build_parser(wanted)
    args = parser.parse_args(args_list)
    if not args.command:
        parser.print_help()
        return 2
    mod = _load(args.command)
    if mod is None or not hasattr(mod, "run"):
        print(f"tangram {args.command}: this command is not available "
              f"(module {SUBCOMMANDS[args.command][0]} is missing)", file=sys.stderr)
        return 2
    return int(mod.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
