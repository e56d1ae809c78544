"""`tangram simulate`: run a workload or a trace through the scheduler core in virtual time.

Invariant: the CLI only parses, runs `arl_tangram.sim` and prints; every figure it shows comes
from a `SimReport`. A malformed trace or cluster file, or a bad argument, exits with code 2 and
a message naming the file, line and field.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..core.errors import SpecError
from ..sim.bounds import Bound, bound, table_bound
from ..sim.deepsearch import COMPARE as PROVIDER_COMPARE
from ..sim.deepsearch import PROVIDER_WORKLOADS, run_report
from ..sim.deepsearch import SEARCH_FETCH_POLICIES as PROVIDER_POLICIES
from ..sim.metrics import SimReport
from ..sim.runner import (
    BASELINES,
    Batches,
    Savings,
    best_static,
    compare,
    parse_policy,
    policies,
    ratios,
    run_policy,
    savings,
)
from ..sim.simulator import SimConfig, group_by_step
from ..sim.workloads import WORKLOADS, get_workload, with_load
from ._common import act_cdf_axes, exit_on_bad_input, label_axes, make_console, save_figure

EXIT_STALLED = 3  # a run stalled: no figures are comparable


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "simulate", help="simulate a workload under the scheduling policies",
        description="Replay a built-in workload or a trace through the scheduler core in virtual "
                    "time and report ACT, RL step duration and utilization.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--workload", choices=sorted({**WORKLOADS, **PROVIDER_WORKLOADS}),
                     help="built-in workload (default: code-rl)")
    src.add_argument("--trace", metavar="FILE", help="trajectories, JSON Lines (docs/trace-format.md)")
    p.add_argument("--cluster", metavar="FILE", help="cluster spec YAML (required with --trace; "
                   "overrides the workload's cluster otherwise)")
    p.add_argument("--policy", type=_policy, default="tangram",
                   help="policy to run (default: tangram): " + ", ".join(policies())
                   + " (static-pool:K for any fixed allotment K); for deep-search: "
                   + ", ".join(PROVIDER_POLICIES))
    p.add_argument("--seed", type=int, default=0, help="seed of the workload's sampling (default: 0)")
    p.add_argument("--trajectories", type=_positive_int, help="trajectories per RL step (workloads)")
    p.add_argument("--steps", type=_positive_int, help="RL steps to simulate")
    p.add_argument("--train-s", type=_non_negative, help="training phase after each rollout, seconds")
    p.add_argument("--tick-s", type=_positive, default=1.0, help="virtual seconds between Tick events")
    p.add_argument("--load", type=_positive, default=1.0,
                   help="load factor: every generation time divided by it (default: 1)")
    p.add_argument("--compare", action="store_true",
                   help="run every policy (static-pool at each fixed allotment); table with the "
                        "optimum, each policy as a multiple of it, and ratios to tangram")
    p.add_argument("--sweep", metavar="L1,L2,...", type=_loads,
                   help="--compare at each load factor; a table (and with --plot a figure) of "
                        "the ratios against load")
    p.add_argument("--savings", action="store_true",
                   help="smallest cluster on which tangram matches a baseline on the full cluster")
    p.add_argument("--baseline", choices=(*BASELINES, "all"), default="trajectory-bound",
                   help="baseline for --savings (default: trajectory-bound)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON (stable keys)")
    p.add_argument("--plot", metavar="FILE.png", help="write ACT CDFs and utilization over time")
    p.add_argument("--dump-trace", metavar="FILE", help="write the trajectories as a JSONL trace and exit")
    p.set_defaults(command="simulate")
    return p


def _policy(s: str) -> str:
    if s in PROVIDER_POLICIES:  # (a provider workload's; `_reports` checks the pairing)
        return s
    try:
        parse_policy(s)
    except KeyError as exc:
        raise argparse.ArgumentTypeError(str(exc.args[0])) from None
    return s


def _loads(s: str) -> tuple[float, ...]:
    try:
        out = tuple(float(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be numbers separated by commas, got {s!r}") from None
    if not out or any(not (x > 0 and math.isfinite(x)) for x in out):
        raise argparse.ArgumentTypeError(f"every load factor must be a finite number > 0, got {s!r}")
    return out


def _positive_int(s: str) -> int:
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {s}")
    return v


def _positive(s: str) -> float:
    v = float(s)
    if not v > 0 or math.isinf(v):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {s}")
    return v


def _non_negative(s: str) -> float:
    v = float(s)
    if not v >= 0 or math.isinf(v):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {s}")
    return v


# ---- inputs -------------------------------------------------------------------------------------


def _inputs(args: argparse.Namespace) -> tuple[str, Any, Batches, float]:
    """(label, cluster, batches factory, default train_s) from --workload or --trace."""
    from ..sim.trace import load_trace
    from ..specfile import load_cluster_yaml

    if args.trace:
        if not args.cluster:
            raise SpecError(args.trace, None, "--cluster", "a trace needs --cluster FILE")
        cluster = load_cluster_yaml(args.cluster)
        steps = group_by_step(load_trace(args.trace))
        if args.steps:
            steps = steps[: args.steps]
        _check_models(cluster, steps, args.trace)
        return args.trace, cluster, lambda: steps, 0.0
    w = PROVIDER_WORKLOADS.get(args.workload or "") or get_workload(args.workload or "code-rl")
    n = args.trajectories or w.trajectories
    cluster = load_cluster_yaml(args.cluster) if args.cluster else w.cluster(n)
    seed, steps_n = args.seed, args.steps or w.steps
    return w.name, cluster, lambda: w.batches(seed, n, steps_n), w.train_s


def _check_models(cluster: Any, steps: Iterable[Sequence[Any]], file: str) -> None:
    names = {m.name for m in cluster.models}
    for batch in steps:
        for t in batch:
            for i, (_g, a) in enumerate(t.steps):
                if a.model is not None and a.model not in names:
                    raise SpecError(file, None, f"{t.id}.steps[{i}][1].model",
                                    f"model {a.model!r} is not in the cluster spec")


# ---- output -------------------------------------------------------------------------------------


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "-"
    return "inf" if math.isinf(v) else f"{v:.2f}"


def _table(reports: dict[str, SimReport], title: str, opt: Bound | None = None) -> Any:
    from rich.table import Table

    stalled = any(r.stalled for r in reports.values())
    ratio = ratios(reports) if "tangram" in reports and len(reports) > 1 and not stalled else {}
    best = best_static(reports)
    dims = [d for d in ("cpu", "gpu") if any(d in r.utilization for r in reports.values())]
    t = Table(title=title)
    for col in ("policy", "actions", "ACT avg s", "p50", "p99", "step s", "bound s", "x bound"):
        t.add_column(col, justify="right" if col != "policy" else "left")
    for d in dims:
        t.add_column(f"util {d}", justify="right")
        t.add_column(f"idle {d}", justify="right")
    if ratio:
        t.add_column("ACT x", justify="right")
        t.add_column("step x", justify="right")
    pad = ["", ""] * len(dims) + (["", ""] if ratio else [])
    if opt is not None:
        lowest, _who = table_bound(opt, reports)
        t.add_row("optimum (bound)", str(opt.act["count"]), _fmt(lowest), _fmt(opt.act["p50"]),
                  _fmt(opt.act["p99"]), _fmt(opt.step_avg_s), _fmt(lowest), "1.00", *pad, style="dim")
    for name, r in reports.items():
        label = f"{name} (best static)" if name == best else name
        if r.stalled:
            label += " STALLED"
        own = r.bound["act_avg"] if r.bound else math.nan
        xb = _fmt(r.act["avg"] / own) if opt is not None and own > 0 else "-"
        row = [label, str(r.actions), _fmt(r.act["avg"]), _fmt(r.act["p50"]), _fmt(r.act["p99"]),
               _fmt(r.step_avg_s), _fmt(own) if opt is not None else "-", xb]
        for d in dims:
            row += [f"{100 * r.utilization.get(d, 0):.1f}%", f"{100 * r.held_idle.get(d, 0):.1f}%"]
        if ratio:
            rr = ratio.get(name)
            row += [_fmt(rr["act_avg"]), _fmt(rr["step"])] if rr else ["1.00", "1.00"]
        t.add_row(*row)
    from .replay import lost_actions

    notes = []
    lost = lost_actions(reports)
    if lost:
        notes.append(lost)
    if opt is not None:
        provider = any("provider_act_avg" in (r.bound or {}) for r in reports.values())
        notes.extend(PROVIDER_BOUND_NOTES if provider else BOUND_NOTES)
    if ratio:
        notes.append("ACT x / step x: the policy's figure divided by tangram's (> 1: tangram is better)")
    setup = max((r.setup_s for r in reports.values()), default=0.0)
    if setup > 0:
        notes.append(f"set-up before step 1 ({setup:.1f} s: model loads, warm pools filled) is not in any step or ACT")
    t.caption = "\n".join(notes)
    return t


BOUND_NOTES = (
    "bound s: a lower bound on the row's ACT avg given the times its actions were submitted in "
    "that run (closed loop: submits follow the schedule): per pool, the larger of each action "
    "alone (no queueing, no cold start, best allotment) and preemptive shortest-remaining-first "
    "of the actions' least core-seconds (GPU-seconds) on the pool's total capacity; x bound: "
    "ACT avg / bound s",
    "optimum: ACT avg and bound s are the lowest row's bound (no run in the table is below it); "
    "p50, p99 and step: each action alone",
)


PROVIDER_BOUND_NOTES = (
    "bound s: a lower bound on the row's ACT avg given the times its calls were submitted in "
    "that run: per provider, each answered call's latency after the earliest time the "
    "provider's token bucket lets it start (the k-th distinct request released takes the "
    "k-th token; a repeated one may join the first), a call never answered 0 "
    "(sim/deepsearch.py, provider_bound); x bound: ACT avg / bound s",
    "optimum: ACT avg and bound s are the lowest row's bound; p50, p99 and step: each call "
    "alone at its own latency (a coalesced call may finish sooner)",
)


def _stall_lines(reports: dict[str, SimReport]) -> list[str]:
    out = []
    for name, r in reports.items():
        if r.stalled:
            state = ", ".join(f"{k} {v}" for k, v in (r.stall or {}).items())
            out.append(f"{name} stalled: {state}")
    return out


def _savings_table(rows: list[Savings]) -> Any:
    from rich.table import Table

    t = Table(title="resources tangram needs to match each baseline (baseline on the full cluster)")
    for col in ("baseline", "scale", "nodes kept", "target ACT/step s", "tangram ACT/step s",
                "CPU saved", "GPU saved"):
        t.add_column(col, justify="left" if col == "baseline" else "right")
    for s in rows:
        nodes = ", ".join(f"{p} {k}/{n}" for p, (k, n) in s.nodes.items())
        t.add_row(s.baseline, "not matched" if s.scale is None else f"{s.scale:.3f}", nodes,
                  f"{_fmt(s.target['act_avg'])} / {_fmt(s.target['step_avg_s'])}",
                  f"{_fmt(s.achieved['act_avg'])} / {_fmt(s.achieved['step_avg_s'])}",
                  f"{100 * s.saving['cpu']:.1f}%" if "cpu" in s.saving else "-",
                  f"{100 * s.saving['gpu']:.1f}%" if "gpu" in s.saving else "-")
    return t


def plot(reports: dict[str, SimReport], path: str) -> None:
    """ACT CDF per policy (left) and busy fraction of CPU/GPU over time (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, r in reports.items():
        a = np.sort(np.asarray(r.act_samples, dtype=float))
        if len(a):
            ax1.plot(a, np.arange(1, len(a) + 1) / len(a), label=name)
        for dim, style in (("cpu", "-"), ("gpu", "--")):
            pts = [(t, u[dim]) for t, u in (r.series or []) if dim in u]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax2.plot(xs, ys, style, label=f"{name} {dim}")
    act_cdf_axes(ax1, "ACT CDF")
    label_axes(ax2, "virtual time (s)", "busy fraction of capacity", "utilization over time")
    save_figure(fig, path)


# ---- run ----------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    return exit_on_bad_input("simulate", _run, args)


def _run(args: argparse.Namespace) -> int:
    console = make_console(stderr=args.json)
    label, cluster, base_batches, train_default = _inputs(args)
    batches = with_load(base_batches, args.load)
    train_s = args.train_s if args.train_s is not None else train_default
    config = SimConfig(train_s=train_s, tick_s=args.tick_s)
    if args.dump_trace:
        from ..sim.trace import dump_trace

        n = dump_trace((t for b in batches() for t in b), args.dump_trace)
        console.print(f"wrote {n} trajectories to {args.dump_trace}")
        return 0
    kw = {"seed": args.seed, "workload": label, "config": config}
    if label in PROVIDER_WORKLOADS and (args.sweep or args.savings):
        raise KeyError(f"{label}: --sweep and --savings size node pools; a provider workload has "
                       "none (run --compare)")
    if args.sweep:
        return _sweep(args, console, label, cluster, base_batches, config)
    reports = _reports(args, console, cluster, batches, kw)
    opt = bound(batches(), cluster, train_s)
    stalled = _stall_lines(reports)
    found = _savings(args, cluster, batches, reports, kw) if args.savings and not stalled else []
    if args.plot:
        plot(reports, args.plot)
        console.print(f"wrote {args.plot}")
    if args.json:
        _print_json(args, label, train_s, opt, reports, found, stalled)
    else:
        load = f", load x{args.load:g}" if args.load != 1.0 else ""
        console.print(_table(reports, f"{label}: seed {args.seed}{load}, "
                                      f"{sum(n.capacity.get('cpu') for n in cluster.nodes):g} CPU, "
                                      f"{sum(n.capacity.get('gpu') for n in cluster.nodes):g} GPU", opt))
        if found:
            console.print(_savings_table(found))
    if stalled:
        for line in stalled:
            console.print(f"[red]{line}")
        console.print("[red]stalled: work was left that could not progress; no ratios are shown "
                      f"(exit {EXIT_STALLED})")
        return EXIT_STALLED
    return 0


def _reports(args: argparse.Namespace, console: Any, cluster: Any, batches: Batches,
             kw: dict[str, Any]) -> dict[str, SimReport]:
    """--compare: every policy (a line as each ends); else the one --policy. A provider
    workload (deep-search) compares the provider policies (`sim.deepsearch.COMPARE`)."""
    if kw["workload"] in PROVIDER_WORKLOADS:
        names = PROVIDER_COMPARE if args.compare else (args.policy,)
        if args.policy not in PROVIDER_POLICIES and not args.compare:
            raise KeyError(f"policy {args.policy!r}: {kw['workload']} runs the provider policies "
                           f"{', '.join(PROVIDER_POLICIES)}")
        out = {}
        for name in names:
            out[name] = r = run_report(cluster, batches(), name, **kw)
            console.print(f"[dim]{r.policy}: {r.actions} actions in {r.wall_s:.1f} s[/dim]")
        return out
    if args.policy in PROVIDER_POLICIES and parse_policy_or_none(args.policy) is None:
        raise KeyError(f"policy {args.policy!r} is a provider policy: run it with --workload deep-search")
    if args.compare:
        return compare(cluster, batches, **kw, on_report=lambda r: console.print(
            f"[dim]{r.policy}: {r.actions} actions in {r.wall_s:.1f} s[/dim]"))
    return {args.policy: run_policy(cluster, batches, args.policy, **kw)}


def parse_policy_or_none(label: str) -> Any:
    try:
        return parse_policy(label)
    except KeyError:
        return None


def _savings(args: argparse.Namespace, cluster: Any, batches: Batches,
             reports: dict[str, SimReport], kw: dict[str, Any]) -> list[Savings]:
    """--savings against --baseline (static-pool: the best static run), each baseline's run
    taken from ``reports`` where it is there."""
    found: list[Savings] = []
    names = BASELINES if args.baseline == "all" else (args.baseline,)
    for b in names:
        if b == "static-pool":
            b = best_static(reports) or "static-pool:max"
        base = reports.get(b) or run_policy(cluster, batches, b, **kw)
        found.append(savings(cluster, batches, base, **kw))
    return found


def _print_json(args: argparse.Namespace, label: str, train_s: float, opt: Bound,
                reports: dict[str, SimReport], found: list[Savings], stalled: list[str]) -> None:
    out: dict[str, Any] = {"workload": label, "seed": args.seed, "train_s": train_s,
                           "load": args.load, "bound": _bound_json(opt, reports),
                           "reports": {k: r.as_dict() for k, r in reports.items()},
                           "best_static": best_static(reports)}
    if "tangram" in reports and len(reports) > 1 and not stalled:
        out["ratios"] = ratios(reports)
    if found:
        out["savings"] = [s.as_dict() for s in found]
    print(json.dumps(out, indent=2, sort_keys=False, default=_json_default))


def _bound_json(opt: Bound, reports: dict[str, SimReport]) -> dict[str, Any]:
    """The --json "bound": each action alone (``act``, ``step_s``, ``step_avg_s``, as before),
    and the table's bound: the lowest of the runs' own bounds (``act_avg``, run ``of``)."""
    lowest, who = table_bound(opt, reports)
    return {**opt.as_dict(), "act_avg": lowest, "alone_act_avg": opt.act["avg"], "of": who}


_SWEEP_BASELINES = ("trajectory-bound", "task-isolated", "fifo", "best static")


def _sweep(args: argparse.Namespace, console: Any, label: str, cluster: Any, base: Batches,
           config: SimConfig) -> int:
    """--compare at each load factor: tangram's multiple of the optimum and each baseline's
    ratio to tangram (ACT and step), as a table, JSON and (with --plot) a figure."""
    rows: list[dict[str, Any]] = []
    stalled: list[str] = []
    for load in args.sweep:
        batches = with_load(base, load)
        reports = compare(cluster, batches, seed=args.seed, workload=label, config=config)
        lines = _stall_lines(reports)
        stalled += [f"load x{load:g}: {x}" for x in lines]
        rows.append(_sweep_row(load, reports, bound(batches(), cluster, config.train_s), lines))
        console.print(f"[dim]load x{load:g}: done[/dim]")
    cols = _SWEEP_BASELINES
    if args.json:
        print(json.dumps({"workload": label, "seed": args.seed, "sweep": rows}, indent=2,
                         default=_json_default))
    else:
        console.print(_sweep_table(rows, cols, f"{label}: seed {args.seed}"))
    if args.plot:
        _plot_sweep(rows, cols, args.plot, label)
        console.print(f"wrote {args.plot}")
    if stalled:
        for line in stalled:
            console.print(f"[red]{line}")
        return EXIT_STALLED
    return 0


def _sweep_row(load: float, reports: dict[str, SimReport], opt: Bound,
               stalled: list[str]) -> dict[str, Any]:
    """One load's figures: the bounds, tangram's ACT and its multiple of its own bound, the
    best static run, and (unless a run stalled) each baseline's ratios to tangram."""
    mine = reports["tangram"]
    own = mine.bound["act_avg"] if mine.bound else math.nan
    best_run = best_static(reports)
    row: dict[str, Any] = {"load": load, "bound_act": table_bound(opt, reports)[0],
                           "bound_alone_act": opt.act["avg"], "tangram_bound_act": own,
                           "tangram_act": mine.act["avg"],
                           "tangram_x_bound": mine.act["avg"] / own if own > 0 else math.nan,
                           "best_static_act": reports[best_run].act["avg"] if best_run else math.nan,
                           "best_static": best_static(reports), "stalled": bool(stalled),
                           "util_cpu": reports["tangram"].utilization.get("cpu", 0.0)}
    if not stalled:
        rr = ratios(reports)
        best = row["best_static"]
        for b in ("trajectory-bound", "task-isolated", "fifo"):
            row[b] = rr[b]
        if best is not None:
            row["best static"] = rr[best]
    return row


def _sweep_table(rows: list[dict[str, Any]], cols: Sequence[str], title: str) -> Any:
    from rich.table import Table

    t = Table(title=f"{title}, ratios to tangram against load "
                    "(ACT x / step x; > 1: tangram is better)")
    for col in ("load", "tangram util cpu", "bound ACT s", "tangram ACT s", "its bound s",
                "tangram x bound", *cols):
        t.add_column(col, justify="right")
    for r in rows:
        cells = [f"{r['load']:g}", f"{100 * r['util_cpu']:.1f}%", _fmt(r["bound_act"]),
                 _fmt(r["tangram_act"]), _fmt(r["tangram_bound_act"]), _fmt(r["tangram_x_bound"])]
        for c in cols:
            v = r.get(c)
            cells.append("STALLED" if r["stalled"] else
                         f"{_fmt(v['act_avg'])} / {_fmt(v['step'])}" if v else "-")
        t.add_row(*cells)
    t.caption = ("bound ACT s: the lowest of the runs' own bounds at that load; its bound s: "
                 "tangram's, on its own submit times (see `tangram simulate --compare`); "
                 "tangram x bound: tangram's ACT over its own bound")
    return t


def _plot_sweep(rows: list[dict[str, Any]], cols: Sequence[str], path: str, label: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(17, 4.5))
    xs = [r["load"] for r in rows]
    for key, name, style in (("tangram_act", "tangram", "-"), ("best_static_act", "best static", "-"),
                             ("tangram_bound_act", "bound (tangram's submits)", "--"),
                             ("bound_act", "bound (lowest run's)", ":")):
        ax3.plot(xs, [r.get(key, math.nan) for r in rows], style, marker="o", label=name)
    label_axes(ax3, "load (generation times divided by)", "average ACT (s)",
               f"{label}: average ACT and the bound", log_x=True)
    for c in cols:
        ys = [r[c]["act_avg"] if r.get(c) else math.nan for r in rows]
        zs = [r[c]["step"] if r.get(c) else math.nan for r in rows]
        ax1.plot(xs, ys, marker="o", label=c)
        ax2.plot(xs, zs, marker="o", label=c)
    for ax, what in ((ax1, "average ACT"), (ax2, "RL step")):
        ax.axhline(1.0, color="grey", lw=0.8)
        label_axes(ax, "load (generation times divided by)", f"baseline / tangram, {what}",
                   f"{label}: {what} ratio", log_x=True)
    save_figure(fig, path)


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and math.isinf(o):
        return "inf"
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")
