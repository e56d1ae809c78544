"""`tangram demo`: a real, contended replay of a built-in workload, every policy, with the
simulator's prediction beside each measured figure.

Invariant: nothing is hand-made. The machine is measured first (`tangram calibrate`'s code);
the trace is a seeded sample of a built-in workload (`sim.workloads`), generated here, sized
from this machine's core count (``4 x cores`` trajectories, one RL step) and compressed in time
by one factor applied to every generation and CPU work time alike (so the load on the
machine is the workload's own), with each of the workload's models mapped onto a local model
(several, so loads and swaps happen). Every policy then runs it on the real engine, sandboxes
and models; the simulator runs it on the calibrated spec. The figures printed are this run's.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "demo", help="replay a built-in workload on this machine under every policy",
        description="Measure this machine, sample a built-in workload sized to its cores, replay "
        "it for real under every policy (tangram, the baselines, static pools) and print measured "
        "ACT, step and CPU utilization next to the simulator's prediction; writes a PNG.")
    p.add_argument("--workload", default="mixed", help="built-in workload to sample (mixed)")
    p.add_argument("--trajectories", type=int, default=None,
                   help="trajectories in the step (default: 4 x this machine's cores)")
    p.add_argument("--step-s", type=float, default=12.0,
                   help="the longest trajectory's length on an idle core after compression (12)")
    p.add_argument("--policies", default=None,
                   help="comma-separated policy labels (default: every one `--compare` runs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default="demo.png", help="PNG to write (demo.png)")
    p.add_argument("--trace-out", default=None, help="also write the sampled trace (JSONL)")
    p.add_argument("--cluster", default=None, help="a calibrated spec to use instead of measuring")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)
    return p


def sample_trace(workload: str, cores: int, seed: int, trajectories: int | None,
                 step_s: float, models: Sequence[str]) -> tuple[list[Any], float]:
    """One seeded RL step of ``workload``, compressed to ``step_s``; (trajectories, factor)."""
    from ..sim.workloads import get_workload

    w = get_workload(workload)
    n = trajectories or 4 * cores
    batch = next(iter(w.batches(seed, n, 1)))
    longest = max(t.start + sum(g + (0.0 if a.kind.uses_model else a.work_s) for g, a in t.steps)
                  for t in batch)
    f = step_s / longest if longest > 0 else 1.0
    names: dict[str, str] = {}
    out = []
    for t in batch:
        steps = []
        for g, a in t.steps:
            kw: dict[str, Any] = {}
            if a.model is not None:
                if not models:
                    continue
                kw["model"] = names.setdefault(a.model, models[len(names) % len(models)])
            else:
                kw["work_s"] = a.work_s * f
            steps.append((g * f, dataclasses.replace(a, **kw)))
        if steps:
            out.append(dataclasses.replace(t, start=t.start * f, steps=tuple(steps)))
    return out, f


def _plot(reports: dict[str, Any], sims: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    for i, (name, r) in enumerate(reports.items()):
        color = f"C{i % 10}"
        a = sorted(r.acts)
        if a:
            ax1.plot(a, [(k + 1) / len(a) for k in range(len(a))], color=color, label=name)
        s = sims.get(name)
        if s is not None and s.act_samples is not None and len(s.act_samples):
            b = sorted(float(x) for x in s.act_samples)
            ax1.plot(b, [(k + 1) / len(b) for k in range(len(b))], ":", color=color, alpha=0.7)
        if r.cpu_series:
            xs, ys = zip(*r.cpu_series, strict=True)
            ax2.plot(xs, [100 * y for y in ys], color=color, label=name)
    ax1.set_xscale("log")
    ax1.set_xlabel("ACT (s)")
    ax1.set_ylabel("fraction of actions")
    ax1.set_title("ACT CDF: measured (solid), simulator (dotted)")
    ax1.legend(fontsize="small")
    ax2.set_xlabel("seconds since the step began")
    ax2.set_ylabel("CPU busy, % of the node (sandboxes' cgroups)")
    ax2.set_title("CPU utilization over time (measured)")
    ax2.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..core.errors import SpecError
    from ..sim import runner
    from .replay import policy_labels, replay_all, table

    console = Console()
    if not console.is_terminal:
        console.width = 170
    t_begin = time.perf_counter()
    labels_arg = [x.strip() for x in args.policies.split(",")] if args.policies else None
    try:
        for label in labels_arg or ():
            runner.parse_policy(label)
        from ..sim.workloads import get_workload

        get_workload(args.workload)
    except KeyError as exc:
        print(f"tangram demo: {exc.args[0]}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        console.print("[yellow]tangram demo: sandboxes need root (namespaces, cgroups); "
                      "run it as root or in a container with CAP_SYS_ADMIN[/yellow]")
        return 1
    from ..replay.calibrate import calibrate, cluster_of, read_calibration
    from ..replay.driver import machine_cores
    from ..replay.predict import fidelity, optimum, predict, run_bound
    from ..sim.trace import dump_trace
    from ..specfile import load_cluster_yaml

    cores = machine_cores()
    console.rule(f"[bold]ARL-Tangram demo[/bold]: {args.workload} on this machine ({cores} cores)")
    try:
        if args.cluster:
            cluster, cal = load_cluster_yaml(args.cluster), read_calibration(args.cluster)
        else:
            console.print("[dim]measuring this machine (tangram calibrate)...[/dim]")
            spec = calibrate(repeats=3, say=lambda m: console.print(f"[dim]  {m}[/dim]"))
            cluster, cal = cluster_of(spec), dict(spec["calibration"])
    except SpecError as exc:
        print(f"tangram demo: {exc}", file=sys.stderr)
        return 2
    models = [m.name for m in cluster.models]
    trajs, f = sample_trace(args.workload, cores, args.seed, args.trajectories, args.step_s, models)
    if args.trace_out:
        dump_trace(trajs, args.trace_out)
    steps = [trajs]
    n_act = sum(len(t.steps) for t in trajs)
    console.print(f"trace: {len(trajs)} trajectories of {args.workload} (seed {args.seed}), "
                  f"{n_act} actions, times x{f:.3g} (one factor for generation and work); "
                  f"models mapped onto {', '.join(models) or 'none'}")
    labels = labels_arg or policy_labels(cluster)
    units = float(cal["units_per_s"])
    trace_label = args.trace_out or f"{args.workload}-seed{args.seed}"
    reports = replay_all(cluster, steps, labels, trace=trace_label, units_per_s=units,
                         train_s=0.0, url=None, progress=not args.no_progress)
    sims = {k: predict(cluster, steps, k, cal, label=trace_label) for k in reports}
    console.print(table(reports, sims, f"{args.workload}: {len(trajs)} trajectories, {n_act} "
                        f"actions, real {cluster.total_capacity().get('cpu'):g} CPU "
                        f"(measured; the simulator's prediction in parentheses)",
                        opt=optimum(cluster, steps, cal),
                        bounds={k: run_bound(cluster, steps, cal, r) for k, r in reports.items()}))
    statics = {k: r for k, r in reports.items() if k.startswith("static-pool")}
    if statics and "tangram" in reports:
        best = min(statics, key=lambda k: statics[k].act["avg"])
        mine = reports["tangram"].act["avg"]
        console.print(f"best static pool: {best} (avg ACT {statics[best].act['avg']:.2f} s, "
                      f"{statics[best].act['avg'] / mine:.2f}x tangram's)" if mine > 0 else "")
    fid = fidelity(reports, sims)
    errs = {k: v["act_avg"]["error"] for k, v in fid["policies"].items()}
    rat = {k: v["act_avg"]["error"] for k, v in fid["ratios"].items()}
    console.print("fidelity (predicted vs measured avg ACT): " + ", ".join(
        f"{k} {100 * e:+.0f}%" for k, e in errs.items()))
    if rat:
        console.print("fidelity of the ratios baseline/tangram (avg ACT): " + ", ".join(
            f"{k} {100 * e:+.0f}%" for k, e in rat.items()))
    path = args.plot or os.path.join(tempfile.gettempdir(), "tangram-demo.png")
    _plot(reports, sims, path)
    console.print(f"wrote {path}; total {time.perf_counter() - t_begin:.0f} s")
    return 0 if all(not math.isnan(e) for e in errs.values()) else 1
