"""`tangram calibrate`: measure this machine into a cluster spec for `tangram simulate`.

Invariant: every figure written was measured in this run (`replay.calibrate`); the file is a
cluster spec `tangram simulate --cluster` accepts as is.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "calibrate", help="measure this machine into a cluster spec",
        description="Measure the work program's per-core speed, sandbox cold and warm start, "
        "session open, the engine's cost per action, and each local model's load, swap-in and "
        "batch latency (alpha + beta x batch); write the cluster spec the simulator should use "
        "for this machine (docs/fidelity.md).")
    p.add_argument("--out", default="cluster.calibrated.yaml", metavar="FILE",
                   help="where to write the spec (cluster.calibrated.yaml)")
    p.add_argument("--no-models", action="store_true", help="measure the CPU side only")
    p.add_argument("--repeats", type=int, default=5, help="samples per figure (5)")
    p.add_argument("--judge-engine", action="store_true",
                   help="also start a tiny judge engine (vLLM) and measure its start and decode "
                   "step (alpha + beta x sequences) for the simulator's engine model")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from ..replay.calibrate import calibrate, write_spec
    from ..specfile import load_cluster_yaml

    if args.repeats < 1:
        print("tangram calibrate: --repeats must be >= 1", file=sys.stderr)
        return 2
    spec = calibrate(with_models=not args.no_models, repeats=args.repeats,
                     say=lambda m: print(m, file=sys.stderr), judge_engine=args.judge_engine)
    write_spec(spec, args.out)
    load_cluster_yaml(args.out)  # what tangram simulate will read: it must parse
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
