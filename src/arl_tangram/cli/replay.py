"""`tangram replay`: a trace on real resources (the real engine, sandboxes and models).

Invariant: a malformed trace or cluster spec, an action naming a model the cluster lacks, or a
demand no node can hold, exits 2 with ``file:line: field: message`` before anything runs. Every
figure printed was measured in this run (and, with ``--predict``, simulated on the same trace
with the calibrated spec, side by side).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..core.errors import SpecError


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "replay", help="replay a trace on real sandboxes and models, per policy",
        description="Drive the real engine (embedded, or a running `tangram serve` at --url) with "
        "a trace (docs/trace-format.md), closed loop: generation time is a real wait, each CPU "
        "action burns its work_s in a real sandbox over its allotment's cores, session actions "
        "run in real sessions, reward/judge actions are scored by the cluster's real models. "
        "Prints measured ACT, step and CPU utilization per policy.")
    p.add_argument("--trace", required=True, metavar="FILE", help="JSON Lines trace")
    p.add_argument("--cluster", metavar="FILE",
                   help="cluster spec (a `tangram calibrate` output); default: calibrate now")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--policy", help="one policy label (as `tangram simulate`)")
    g.add_argument("--compare", action="store_true", help="every policy `tangram simulate "
                   "--compare` runs (static-pool at allotments above the largest node skipped)")
    p.add_argument("--url", help="replay against a running service (its own policy) instead")
    p.add_argument("--predict", action="store_true",
                   help="also simulate the trace with the calibrated spec; print the errors")
    p.add_argument("--steps", type=int, default=None, help="replay only the first N RL steps")
    p.add_argument("--train-s", type=float, default=0.0, help="training phase after each step")
    p.add_argument("--image", action="append", default=[], metavar="NAME=PATH",
                   help="an environment image the trace's sessions name (sessions.X.image): "
                   "imported from PATH (on every node) before the run; repeatable; adds to the "
                   "cluster spec's images:")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except SpecError as exc:
        print(f"tangram replay: {exc}", file=sys.stderr)
        return 2
    except KeyError as exc:
        print(f"tangram replay: {exc.args[0]}", file=sys.stderr)
        return 2


def resolve_cluster(path: str | None, say: Callable[[str], None]) -> tuple[Any, dict[str, Any]]:
    """(cluster spec, its calibration section); no path: measure this machine now."""
    from ..replay.calibrate import calibrate, cluster_of, read_calibration
    from ..specfile import load_cluster_yaml

    if path:
        return load_cluster_yaml(path), read_calibration(path)
    say("no --cluster: calibrating this machine first (tangram calibrate --out FILE saves it)")
    spec = calibrate(say=say)
    return cluster_of(spec), dict(spec["calibration"])


def policy_labels(cluster: Any) -> list[str]:
    """`tangram simulate --compare`'s runs, less static-pool allotments no node could give
    (they are static-pool:max's run again)."""
    from ..core.resources import CPU
    from ..sim import runner

    biggest = max(n.capacity.get(CPU) for n in cluster.nodes)
    out = []
    for label in runner.policies():
        parse = getattr(runner, "parse_policy", None)
        if parse is not None:
            _name, fixed = parse(label)
            k = fixed.get("static_k")
            if k is not None and k > biggest:
                continue
        out.append(label)
    return out


def replay_all(cluster: Any, steps: Sequence[Any], labels: Sequence[str], *, trace: str,
               units_per_s: float, train_s: float, url: str | None, progress: bool,
               on_done: Callable[[Any], None] | None = None,
               images: Mapping[str, str] | None = None) -> dict[str, Any]:
    from ..replay.driver import replay_policy, warm_process

    warm_process(cluster)
    total = sum(len(t.steps) for b in steps for t in b)
    reports: dict[str, Any] = {}
    bar: Any = None
    if progress:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        bar = Progress(TextColumn("{task.description:<18}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), transient=False)
        bar.start()
    try:
        for label in labels:
            tid = bar.add_task(label, total=total) if bar is not None else None
            tick = (lambda n, t=tid: bar.advance(t, n)) if bar is not None else None
            rep = asyncio.run(replay_policy(cluster, steps, label, trace=trace,
                                            units_per_s=units_per_s, train_s=train_s, url=url,
                                            progress=tick, images=images))
            reports[rep.policy] = rep
            if on_done is not None:
                on_done(rep)
    finally:
        if bar is not None:
            bar.stop()
    return reports


def _fmt(v: float) -> str:
    return "inf" if math.isinf(v) else f"{v:.2f}"


def _pct(v: float) -> str:
    return "inf" if math.isinf(v) else f"{100 * v:+.0f}%"


def lost_actions(reports: Mapping[str, Any]) -> str:
    """A line naming, per policy, the actions that did not succeed (rejected, failed, timed out:
    not in its ACT), or "" when every action of every policy succeeded. A baseline that loses
    actions is not a deployment anyone would run; its ACT is over fewer actions."""
    parts = []
    for name, r in reports.items():
        bad = {k: v for k, v in sorted(r.by_status.items()) if k != "succeeded" and v}
        if bad:
            parts.append(f"{name}: " + ", ".join(f"{v} {k}" for k, v in bad.items()))
    return ("NOT SUCCEEDED (not in ACT): " + "; ".join(parts)) if parts else ""


def table(reports: Mapping[str, Any], sims: Mapping[str, Any] | None, title: str,
          ours: str = "tangram", opt: float | None = None,
          bounds: Mapping[str, Mapping[str, float]] | None = None) -> Any:
    """Measured figures per policy (with ``sims``: the simulator's beside them). ``opt``: each
    action alone on the calibrated trace; ``bounds``: per policy, the bound on that run's own
    release times (`replay.predict.run_bound`)."""
    from rich.table import Table

    t = Table(title=title)
    cols = ["policy", "actions", "ACT avg s", "p50", "p99", "step s", "util cpu"]
    if sims:
        cols[2:2] = []
        cols = ["policy", "actions", "ACT avg s (sim, err)", "p50 (sim)", "p99 (sim)",
                "step s (sim, err)", "util cpu (sim)"]
    mine = reports.get(ours)
    if mine is not None and len(reports) > 1:
        cols += ["ACT x" + (" (sim)" if sims else ""), "step x" + (" (sim)" if sims else "")]
    cols.append("other load")
    for c in cols:
        t.add_column(c, justify="left" if c == "policy" else "right")
    s_mine = sims.get(ours) if sims else None
    for name, r in reports.items():
        s = sims.get(name) if sims else None
        a, st = r.act, r.step_avg_s
        if s is not None:
            from ..replay.predict import err

            row = [name, str(r.actions),
                   f"{_fmt(a['avg'])} ({_fmt(s.act['avg'])}, {_pct(err(a['avg'], s.act['avg']))})",
                   f"{_fmt(a['p50'])} ({_fmt(s.act['p50'])})", f"{_fmt(a['p99'])} ({_fmt(s.act['p99'])})",
                   f"{_fmt(st)} ({_fmt(s.step_avg_s)}, {_pct(err(st, s.step_avg_s))})",
                   f"{100 * r.cpu_utilization:.0f}% ({100 * s.utilization.get('cpu', 0.0):.0f}%)"]
        else:
            row = [name, str(r.actions), _fmt(a["avg"]), _fmt(a["p50"]), _fmt(a["p99"]), _fmt(st),
                   f"{100 * r.cpu_utilization:.0f}%"]
        if mine is not None and len(reports) > 1:
            ra = a["avg"] / mine.act["avg"] if mine.act["avg"] > 0 else math.inf
            rs = st / mine.step_avg_s if mine.step_avg_s > 0 else math.inf
            if s is not None and s_mine is not None:
                pa = s.act["avg"] / s_mine.act["avg"] if s_mine.act["avg"] > 0 else math.inf
                ps = s.step_avg_s / s_mine.step_avg_s if s_mine.step_avg_s > 0 else math.inf
                row += [f"{_fmt(ra)} ({_fmt(pa)})", f"{_fmt(rs)} ({_fmt(ps)})"]
            else:
                row += [_fmt(ra), _fmt(rs)]
        ol = r.other_load
        row.append("?" if ol is None else f"{ol:.2f}")
        t.add_row(*row)
    cap = []
    if bounds:
        cap.append(bound_line(reports, bounds, sims))
    if opt is not None and opt > 0:
        cap.append(f"each action alone at its best allotment, no queueing, no start-up "
                   f"(calibrated trace): ACT avg {_fmt(opt)} s")
    lost = lost_actions(reports)
    if lost:
        cap.append(lost)
    if mine is not None and len(reports) > 1:
        cap.append("ACT x / step x: the policy's figure divided by tangram's (> 1: tangram is better)")
    if sims:
        cap.append("(sim, err): the simulator's prediction with the calibrated spec, and its "
                   "error relative to the measurement")
    cap.append("util cpu: CPU-seconds the sandboxes consumed / (cores x makespan); the "
               "simulator's: allotted while running")
    cap.append("other load: cores busy on this machine with neither a sandbox nor the engine's "
               "process during the run (other jobs); the calibration measured it as it was then")
    t.caption = "\n".join(cap)
    return t


def bound_line(reports: Mapping[str, Any], bounds: Mapping[str, Mapping[str, float]],
               sims: Mapping[str, Any] | None) -> str:
    """The caption line of the bounds: per policy, the bound on that run's own submit times,
    the measured ACT over it, and (with ``sims``) the same for the prediction's run."""
    parts = []
    for k, r in reports.items():
        b = bounds.get(k, {}).get("act_avg", 0.0)
        s = sims.get(k) if sims else None
        sb = s.bound["act_avg"] if s is not None and s.bound else 0.0
        cell = f"{k} {_fmt(b)} s (x {_fmt(r.act['avg'] / b)}" if b > 0 else f"{k} - (-"
        if s is not None and sb > 0:  # (no square brackets: rich reads them as markup)
            cell += f"; sim {_fmt(sb)} s, x {_fmt(s.act['avg'] / sb)}"
        parts.append(cell + ")")
    return ("bound (a lower bound on a run's ACT avg given its own submit times, closed loop: "
            "per pool the larger of each action alone and preemptive shortest-remaining-first of "
            "the least core-seconds on the pool, calibrated trace; a measurement can fall below "
            "it where the machine ran faster than its calibration): " + ", ".join(parts))


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..replay.calibrate import quick_units_per_s
    from ..replay.inputs import load_for_replay, parse_image_args, read_images, trace_images
    from ..replay.predict import fidelity, optimum, predict, run_bound

    console = Console(stderr=args.json)
    if not console.is_terminal:
        console.width = 160
    if args.url and args.compare:
        raise SpecError("--url", None, "--compare", "a running service has one policy; use --policy "
                        "(which it must run) or replay embedded")
    if args.policy:
        from ..sim.runner import parse_policy

        parse_policy(args.policy)  # KeyError (exit 2) on an unknown label
    # the cluster first when it is a file: a bad trace or spec fails before any measurement
    from ..specfile import load_cluster_yaml

    images = {**(read_images(args.cluster) if args.cluster else {}),
              **parse_image_args(getattr(args, "image", None) or [])}
    # embedded, every session's image needs a path; a running service may hold it already
    need = None if args.url else images
    if args.cluster:
        load_for_replay(args.trace, load_cluster_yaml(args.cluster), args.steps, need)
    cluster, cal = resolve_cluster(args.cluster, lambda m: console.print(f"[dim]{m}[/dim]"))
    steps = load_for_replay(args.trace, cluster, args.steps, need)
    used = trace_images(steps)
    images = {k: v for k, v in images.items() if k in used}
    units = float(cal.get("units_per_s") or 0.0)
    if units <= 0:
        units = quick_units_per_s()
        console.print(f"[dim]no calibration in the spec: work program measured here at "
                      f"{units:.0f} units per core-second[/dim]")
    if args.predict and cal.get("cold_start_s") is None and cal.get("session_open_s") is None:
        console.print("[yellow]--predict with a spec that has no calibration: the prediction "
                      "takes sandbox starts and session opens from the trace's cold_start_s "
                      "figures, which describe other machines (the first action of each "
                      "session pays its whole cold_start_s); leave --cluster out, or give a "
                      "`tangram calibrate --out FILE` spec, to predict this machine[/yellow]")
    labels = policy_labels(cluster) if args.compare else [args.policy]
    reports = replay_all(cluster, steps, labels, trace=args.trace, units_per_s=units,
                         train_s=args.train_s, url=args.url,
                         progress=not args.no_progress and not args.json, images=images)
    sims: dict[str, Any] = {}
    if args.predict:
        for label in reports:
            sims[label] = predict(cluster, steps, label, cal, train_s=args.train_s, label=args.trace)
    bounds = {k: run_bound(cluster, steps, cal, r) for k, r in reports.items()}
    if args.json:
        out: dict[str, Any] = {"trace": args.trace, "calibration": cal,
                               "optimum": {"act_avg": optimum(cluster, steps, cal, args.train_s),
                                           "by_policy": bounds},
                               "reports": {k: r.as_dict() for k, r in reports.items()}}
        if sims:
            out["predicted"] = {k: s.as_dict() for k, s in sims.items()}
            out["fidelity"] = fidelity(reports, sims)
        print(json.dumps(out, indent=2, default=_json_default))
    else:
        n_act = sum(len(t.steps) for b in steps for t in b)
        console.print(table(reports, sims or None,
                            f"{args.trace}: {n_act} actions, real "
                            f"{cluster.total_capacity().get('cpu'):g} CPU",
                            opt=optimum(cluster, steps, cal, args.train_s), bounds=bounds))
        if sims:
            _print_fidelity(console, fidelity(reports, sims))
    return 0


def _print_fidelity(console: Any, fid: Mapping[str, Any]) -> None:
    errs = [abs(r["act_avg"]["error"]) for r in fid["policies"].values()]
    rerrs = [abs(v["act_avg"]["error"]) for v in fid["ratios"].values()]
    if errs:
        console.print(f"fidelity: avg ACT error max {100 * max(errs):.0f}% "
                      f"(goal 15%); within 15%: {sum(e <= 0.15 for e in errs)}/{len(errs)} policies")
    if rerrs:
        console.print(f"          ACT ratio error max {100 * max(rerrs):.0f}%; within 15%: "
                      f"{sum(e <= 0.15 for e in rerrs)}/{len(rerrs)} ratios")


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and math.isinf(o):
        return "inf"
    raise TypeError(f"not JSON serializable: {type(o).__name__}")
