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

from ._common import (
    act_cdf_axes,
    cdf,
    check_workload,
    label_axes,
    make_console,
    policy_list,
    resolve_cluster,
    save_figure,
)


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
        if r.acts:
            ax1.plot(*cdf(r.acts), color=color, label=name)
        s = sims.get(name)
        if s is not None and s.act_samples is not None and len(s.act_samples):
            ax1.plot(*cdf(s.act_samples), ":", color=color, alpha=0.7)
        if r.cpu_series:
            xs, ys = zip(*r.cpu_series, strict=True)
            ax2.plot(xs, [100 * y for y in ys], color=color, label=name)
    act_cdf_axes(ax1, "ACT CDF: measured (solid), simulator (dotted)", small_legend=True)
    label_axes(ax2, "seconds since the step began", "CPU busy, % of the node (sandboxes' cgroups)",
               "CPU utilization over time (measured)")
    save_figure(fig, path)


def run(args: argparse.Namespace) -> int:
    from ..core.errors import SpecError

    console = make_console(width=170)
    t_begin = time.perf_counter()
    try:
        labels_arg = policy_list(args.policies)
        check_workload(args.workload)
    except KeyError as exc:
        print(f"tangram demo: {exc.args[0]}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        console.print("[yellow]tangram demo: sandboxes need root (namespaces, cgroups); "
                      "run it as root or in a container with CAP_SYS_ADMIN[/yellow]")
        return 1
    from ..replay.driver import machine_cores

    cores = machine_cores()
    console.rule(f"[bold]ARL-Tangram demo[/bold]: {args.workload} on this machine ({cores} cores)")
    try:
        cluster, cal = resolve_cluster(
            args.cluster, lambda m: console.print(f"[dim]  {m}[/dim]"), repeats=3,
            announce=lambda: console.print("[dim]measuring this machine (tangram calibrate)...[/dim]"))
    except SpecError as exc:
        print(f"tangram demo: {exc}", file=sys.stderr)
        return 2
    steps = [_trace(args, console, cores, [m.name for m in cluster.models])]
    reports, sims = _replay_and_predict(args, console, cluster, cal, steps, labels_arg)
    _print_best_static(console, reports)
    errs = _print_fidelity(console, reports, sims)
    path = args.plot or os.path.join(tempfile.gettempdir(), "tangram-demo.png")
    _plot(reports, sims, path)
    console.print(f"wrote {path}; total {time.perf_counter() - t_begin:.0f} s")
    return 0 if all(not math.isnan(e) for e in errs.values()) else 1


def _trace(args: argparse.Namespace, console: Any, cores: int, models: list[str]) -> list[Any]:
    """The sampled RL step (written to --trace-out if asked), said in one line."""
    from ..sim.trace import dump_trace

    trajs, f = sample_trace(args.workload, cores, args.seed, args.trajectories, args.step_s, models)
    if args.trace_out:
        dump_trace(trajs, args.trace_out)
    n_act = sum(len(t.steps) for t in trajs)
    console.print(f"trace: {len(trajs)} trajectories of {args.workload} (seed {args.seed}), "
                  f"{n_act} actions, times x{f:.3g} (one factor for generation and work); "
                  f"models mapped onto {', '.join(models) or 'none'}")
    return trajs


def _replay_and_predict(args: argparse.Namespace, console: Any, cluster: Any,
                        cal: dict[str, Any], steps: list[list[Any]],
                        labels: list[str] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every policy replayed for real, each one's prediction, and the table of both."""
    from ..replay.predict import optimum, predict, run_bound
    from .replay import policy_labels, replay_all, table

    trajs = steps[0]
    trace_label = args.trace_out or f"{args.workload}-seed{args.seed}"
    reports = replay_all(cluster, steps, labels or policy_labels(cluster), trace=trace_label,
                         units_per_s=float(cal["units_per_s"]), train_s=0.0, url=None,
                         progress=not args.no_progress)
    sims = {k: predict(cluster, steps, k, cal, label=trace_label) for k in reports}
    n_act = sum(len(t.steps) for t in trajs)
    console.print(table(reports, sims, f"{args.workload}: {len(trajs)} trajectories, {n_act} "
                        f"actions, real {cluster.total_capacity().get('cpu'):g} CPU "
                        f"(measured; the simulator's prediction in parentheses)",
                        opt=optimum(cluster, steps, cal),
                        bounds={k: run_bound(cluster, steps, cal, r) for k, r in reports.items()}))
    return reports, sims


def _print_best_static(console: Any, reports: dict[str, Any]) -> None:
    statics = {k: r for k, r in reports.items() if k.startswith("static-pool")}
    if statics and "tangram" in reports:
        best = min(statics, key=lambda k: statics[k].act["avg"])
        mine = reports["tangram"].act["avg"]
        console.print(f"best static pool: {best} (avg ACT {statics[best].act['avg']:.2f} s, "
                      f"{statics[best].act['avg'] / mine:.2f}x tangram's)" if mine > 0 else "")


def _print_fidelity(console: Any, reports: dict[str, Any], sims: dict[str, Any]) -> dict[str, float]:
    """The prediction's error per policy and per ratio to tangram; returns the first."""
    from ..replay.predict import fidelity

    fid = fidelity(reports, sims)
    errs = {k: v["act_avg"]["error"] for k, v in fid["policies"].items()}
    rat = {k: v["act_avg"]["error"] for k, v in fid["ratios"].items()}
    console.print("fidelity (predicted vs measured avg ACT): " + ", ".join(
        f"{k} {100 * e:+.0f}%" for k, e in errs.items()))
    if rat:
        console.print("fidelity of the ratios baseline/tangram (avg ACT): " + ", ".join(
            f"{k} {100 * e:+.0f}%" for k, e in rat.items()))
    return errs
