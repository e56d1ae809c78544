"""A judge trace replayed for real on a judge engine, beside the simulator's prediction (issue 38,
item 4: "a real replay of a judge trace within 15% of its prediction").

The engine is vLLM's CPU build serving a tiny random Qwen2 built here (`tangram calibrate
--judge-engine`'s model), ONE instance on this machine; the trace is our own, from a seeded
generator (assumptions for a benchmark, stated here): ``--trajectories`` agents, each judged
``--turns`` times, a generation pause of lognormal(median 1 s, sigma 0.5, 0.1-5 s) before each
judgement, each judgement generating lognormal(median ``--tokens``, sigma 0.6, 16-384) tokens
(random weights never end early, and the request asks the engine to ignore the end token: the
tokens are the action's work). Several agents' judgements overlap, so the engine batches
continuously and the decode step's cost per sequence matters.

Each round calibrates the engine (its start, and its decode step ``alpha + beta k`` from 64
tokens alone and 32 at once: `EngineJudgeHost.step_costs`), then replays the trace under each
policy on a fresh engine (the instance loaded before the first arrival, as the simulator's
set-up), then predicts tangram's run with the simulator on that round's calibration
(`replay.predict`: each judgement's work = its tokens x the measured step alone). Prints per
round and policy the measured average ACT, the prediction and its error, and the medians.

With ``--own-engine`` tangram's replay engine is also measured itself, once loaded and before
the first arrival (`EngineJudgeHost.step_costs`, the calibration's widths and repeats), and the
prediction is made a second time on those figures: the engine's speed moves between processes
and minutes on this VM (the same engine's step, four times in a row: alpha 2.35-3.06 ms), so a
calibration taken on another engine carries that spread into the prediction.

    .venv/bin/python benchmarks/bench_judge_replay.py [--rounds 3] [--policies tangram,fifo]

Needs root (the sandboxes' warm pool starts with the engine) and the judge engine
(`make install` builds it; `ARL_TANGRAM_JUDGE=0` skips it).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from arl_tangram.core.actions import ActionKind, WorkHints
from arl_tangram.core.cluster import ClusterSpec
from arl_tangram.core.resources import GPU, Resources
from arl_tangram.sim.trace import SimAction, Trajectory


def judge_trace(model: str, *, seed: int = 11, trajectories: int = 12, turns: int = 3,
                tokens: int = 96) -> list[Trajectory]:
    """The trace (module doc): one RL step of ``trajectories`` agents judged ``turns`` times."""
    rng = random.Random(seed)
    out = []
    for i in range(trajectories):
        steps = []
        for _ in range(turns):
            gen = min(5.0, max(0.1, rng.lognormvariate(0.0, 0.5)))
            n = round(min(384.0, max(16.0, tokens * rng.lognormvariate(0.0, 0.6))))
            # work_s: filled by the prediction from the tokens (replay.predict)
            steps.append((gen, SimAction(ActionKind.JUDGE, 0.0, Resources(),
                                         hints=WorkHints(tokens=n), model=model, timeout_s=300.0)))
        out.append(Trajectory(f"jg-{i}", "judge", tuple(steps), 0.0, {}, 0))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--policies", default="tangram,fifo")
    p.add_argument("--trajectories", type=int, default=12)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--tokens", type=int, default=96, help="median tokens a judgement generates")
    p.add_argument("--own-engine", action="store_true",
                   help="also predict from tangram's replay engine, measured before its replay")
    args = p.parse_args(argv)

    from arl_tangram.managers.gpu.engine_judge import engine_available
    from arl_tangram.replay.calibrate import calibrate, cluster_of
    from arl_tangram.replay.driver import replay_policy
    from arl_tangram.replay.predict import predict

    why = engine_available()
    if why is not None:
        print(why, file=sys.stderr)
        return 2
    labels = args.policies.split(",")
    acts: dict[str, list[float]] = {k: [] for k in labels}
    errors: list[float] = []
    own_errors: list[float] = []
    for r in range(args.rounds):
        spec = calibrate(with_models=False, repeats=1, judge_engine=True,
                         say=lambda m: print(f"  {m}", flush=True))
        (m,) = spec["models"]
        m["max_instances"] = 1  # one engine on this machine's cores (the simulator's too)
        node = spec["nodes"][0]
        node["capacity"][GPU] = 1
        cluster, cal = cluster_of(spec), dict(spec["calibration"])
        steps = [judge_trace(m["name"], trajectories=args.trajectories, turns=args.turns,
                             tokens=args.tokens)]
        order = labels[r % len(labels):] + labels[:r % len(labels)]
        own: tuple[float, float, float, float] | None = None
        for label in order:
            if args.own_engine and label == "tangram":
                rep, own = asyncio.run(measured_replay(cluster, steps, label,
                                                       float(cal["units_per_s"])))
            else:
                rep = asyncio.run(replay_policy(cluster, steps, label, trace="judge",
                                                units_per_s=float(cal["units_per_s"]),
                                                train_s=0.0))
            acts[label].append(rep.act["avg"])
            bad = {k: v for k, v in rep.by_status.items() if k != "succeeded"}
            print(f"round {r + 1} {label:<8} ACT avg {rep.act['avg']:.3f} s, p99 "
                  f"{rep.act['p99']:.3f} s, {rep.actions} actions{f', {bad}' if bad else ''}",
                  flush=True)
        if "tangram" in labels:
            pred = predict(cluster, steps, "tangram", cal, label="judge")
            errors.append(pred.act["avg"] / acts["tangram"][-1] - 1.0)
            print(f"round {r + 1} tangram predicted {pred.act['avg']:.3f} s "
                  f"({100 * errors[-1]:+.1f}% of the measured) at this round's calibration "
                  f"(alpha {1000 * m['alpha']:.2f} ms, beta {1000 * m['beta']:.3f} ms)", flush=True)
            if own is not None:
                mine = own_cluster(spec, own)
                pred = predict(mine, steps, "tangram", cal, label="judge")
                own_errors.append(pred.act["avg"] / acts["tangram"][-1] - 1.0)
                print(f"round {r + 1} tangram predicted {pred.act['avg']:.3f} s "
                      f"({100 * own_errors[-1]:+.1f}% of the measured) on its own engine's "
                      f"step (alpha {1000 * own[0]:.2f} ms, beta {1000 * own[1]:.3f} ms)",
                      flush=True)
    print(f"\nmedian ACT avg over {args.rounds} rounds:")
    for k in labels:
        print(f"  {k:<8} {statistics.median(acts[k]):.3f} s  rounds "
              + " ".join(f"{x:.3f}" for x in acts[k]))
    if errors:
        err = statistics.median(errors)
        ok = abs(err) <= 0.15
        print(f"  tangram's prediction error, median of the rounds: {100 * err:+.1f}% "
              f"({'within' if ok else 'NOT within'} 15%); rounds "
              + ", ".join(f"{100 * e:+.1f}%" for e in errors))
        if own_errors:
            own_err = statistics.median(own_errors)
            print(f"  on its own engine's step: median {100 * own_err:+.1f}%; rounds "
                  + ", ".join(f"{100 * e:+.1f}%" for e in own_errors))
        return 0 if ok else 1
    return 0


async def measured_replay(cluster: ClusterSpec, steps: list[list[Trajectory]], label: str,
                          units_per_s: float) -> tuple[Any, tuple[float, float, float, float]]:
    """`replay_policy` on the embedded engine, its judge engine measured (`step_costs`) once
    loaded, before the first arrival (the warm-up the simulator's set-up leaves out)."""
    from arl_tangram.managers.gpu.hosts import ModelHosts
    from arl_tangram.replay import driver

    n, shares = driver.core_settings(steps, cluster)
    backend = driver.EmbeddedBackend(cluster, label, n, shares,
                                     core_kw=driver.warm_settings(steps))
    await backend.start()
    try:
        await driver._settle(backend)
        own = None
        for host in backend.executor.hosts.values():
            if isinstance(host.gpu, ModelHosts):
                for iid in host.gpu.engines.resident():
                    own = await host.gpu.engines.step_costs(iid, k=32, tokens=64, repeats=5)
        if own is None:
            raise RuntimeError("no judge engine was loaded before the replay")
        rep = await driver.replay(backend, steps, cluster, policy=label, trace="judge",
                                  units_per_s=units_per_s, train_s=0.0)
        return rep, own
    finally:
        await backend.aclose()


def own_cluster(spec: dict[str, Any], own: tuple[float, float, float, float]) -> ClusterSpec:
    """The round's cluster with the judge model's step replaced by ``own``'s (alpha, beta)."""
    from arl_tangram.replay.calibrate import cluster_of

    mine = {**spec, "models": [{**spec["models"][0], "alpha": own[0], "beta": own[1]}]}
    return cluster_of(mine)


if __name__ == "__main__":
    sys.exit(main())
