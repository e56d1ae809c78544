"""The prediction per action kind, looked at closely (issue 39; docs/fidelity.md).

Two probes of a calibrated spec (`tangram calibrate --out FILE`):

- ``real``: one real replay of a trace (``demo``: what `make demo` replays; ``elastic``:
  `bench_real.py`'s trace of tool calls and elastic tests) under one policy, then its
  prediction per kind, with the spec's ``device_cores`` and with none (a CPU-backed forward
  on the node's cores, or on devices of its own), and each model action's measured ACT;
- ``amplify``: simulation only: each policy's per-kind prediction of the elastic trace with
  every test's work x1.0 and x0.9: how much an error in the tests' work moves the other kinds
  (a tool call waits for a core behind the tests).

    .venv/bin/python benchmarks/fidelity_kinds.py real cal.yaml --trace demo --policy tangram
    .venv/bin/python benchmarks/fidelity_kinds.py amplify cal.yaml

Needs root for ``real`` (sandboxes). A real replay on a loaded machine reads its load too.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from arl_tangram.core.actions import ActionKind


def _elastic_trace() -> Any:
    spec = importlib.util.spec_from_file_location("bench_real", Path(__file__).with_name("bench_real.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.elastic_trace()


def _trace(name: str, cluster: Any) -> Any:
    from arl_tangram.cli.demo import sample_trace
    from arl_tangram.replay.driver import machine_cores

    if name == "elastic":
        return _elastic_trace()
    return sample_trace("mixed", machine_cores(), 0, None, 12.0, [m.name for m in cluster.models])[0]


def real(cluster: Any, cal: dict[str, Any], trace: str, policy: str) -> None:
    from arl_tangram.replay.driver import replay_policy, warm_process
    from arl_tangram.replay.predict import predict

    trajs = _trace(trace, cluster)
    warm_process(cluster)
    rep = asyncio.run(replay_policy(cluster, [trajs], policy, trace=trace,
                                    units_per_s=float(cal["units_per_s"]), train_s=0.0, url=None))
    measured = {k: v for k, v in rep.acts_by_kind.items() if v}
    print(f"{trace}, {policy}: measured ACT avg {rep.act['avg']:.4f} s")
    for dc in (None, 0.0):
        c = cluster if dc is None else dataclasses.replace(
            cluster, nodes=tuple(dataclasses.replace(n, device_cores=dc) for n in cluster.nodes))
        pred = predict(c, [trajs], policy, cal, label=trace)
        shown = "the spec's" if dc is None else "0"
        print(f"  predicted with device_cores {shown}: all {pred.act['avg']:.4f} s "
              f"({100 * (pred.act['avg'] / rep.act['avg'] - 1):+.1f}%)")
        for kind, acts in sorted(measured.items()):
            got, m = pred.act_by_kind[kind]["avg"], statistics.fmean(acts)
            print(f"    {kind:<7} n={len(acts):<4} measured {1000 * m:8.2f} ms, predicted "
                  f"{1000 * got:8.2f} ms ({100 * (got / m - 1):+.1f}%)")
    for kind in ("reward", "judge"):
        if kind in measured:
            print(f"  {kind} actions measured (ms): "
                  + ", ".join(f"{1000 * a:.1f}" for a in measured[kind]))


def amplify(cluster: Any, cal: dict[str, Any], policies: Sequence[str]) -> None:
    from arl_tangram.replay.predict import predict

    trajs = _elastic_trace()
    for policy in policies:
        by_f = {}
        for f in (1.0, 0.9):
            steps = [[dataclasses.replace(t, steps=tuple(
                (g, dataclasses.replace(a, work_s=a.work_s * f) if a.kind == ActionKind.TEST else a)
                for g, a in t.steps)) for t in trajs]]
            p = predict(cluster, steps, policy, cal, label="elastic")
            by_f[f] = {k: v["avg"] for k, v in p.act_by_kind.items()}
        base, less = by_f[1.0], by_f[0.9]
        print(f"{policy:<15} " + ", ".join(f"{k} {1000 * v:.1f} ms" for k, v in base.items())
              + "; tests' work x0.9: "
              + ", ".join(f"{k} {100 * (less[k] / base[k] - 1):+.1f}%" for k in base))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("probe", choices=("real", "amplify"))
    p.add_argument("cluster", help="a calibrated spec (tangram calibrate --out FILE)")
    p.add_argument("--trace", choices=("demo", "elastic"), default="demo")
    p.add_argument("--policy", default="tangram", help="real: the policy replayed")
    p.add_argument("--policies", default="tangram,fifo,static-pool:1,static-pool:2",
                   help="amplify: comma-separated labels")
    args = p.parse_args(argv)
    from arl_tangram.replay.calibrate import read_calibration
    from arl_tangram.specfile import load_cluster_yaml

    cluster, cal = load_cluster_yaml(args.cluster), read_calibration(args.cluster)
    if args.probe == "real":
        real(cluster, cal, args.trace, args.policy)
    else:
        amplify(cluster, cal, args.policies.split(","))
    return 0


if __name__ == "__main__":
    sys.exit(main())
