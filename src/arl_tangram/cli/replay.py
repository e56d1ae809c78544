"""`tangram replay`: a trace on real resources (the real engine, sandboxes and models).

Invariant: a malformed trace or cluster spec, an action naming a model the cluster lacks, or a
demand no node can hold, exits 2 with ``file:line: field: message`` before anything runs. Every
figure printed was measured in this run (and, with ``--predict``, simulated on the same trace
with the calibrated spec, side by side).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..core.errors import SpecError
from ._common import exit_on_bad_input, make_console, progress_bars, resolve_cluster


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
    return exit_on_bad_input("replay", _run, args)


def policy_labels(cluster: Any) -> list[str]:
    """`replay.compare.policy_labels` (the runs of ``--compare``)."""
    from ..replay.compare import policy_labels

    return policy_labels(cluster)


def replay_all(cluster: Any, steps: Sequence[Any], labels: Sequence[str], *, trace: str,
               units_per_s: float, train_s: float, url: str | None, progress: bool,
               on_done: Callable[[Any], None] | None = None,
               images: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`replay.compare.replay_all` with a progress bar per policy when ``progress``."""
    from ..replay import compare

    with progress_bars(progress) as start_run:
        return compare.replay_all(cluster, steps, labels, trace=trace, units_per_s=units_per_s,
                                  train_s=train_s, url=url, start_run=start_run,
                                  on_done=on_done, images=images)


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
    mine = reports.get(ours)
    with_ratios = mine is not None and len(reports) > 1
    for c in _columns(bool(sims), with_ratios):
        t.add_column(c, justify="left" if c == "policy" else "right")
    s_mine = sims.get(ours) if sims else None
    for name, r in reports.items():
        s = sims.get(name) if sims else None
        row = _measured_cells(name, r) if s is None else _predicted_cells(name, r, s)
        if mine is not None and with_ratios:
            row += _ratio_cells(r, mine, s, s_mine)
        ol = r.other_load
        row.append("?" if ol is None else f"{ol:.2f}")
        t.add_row(*row)
    t.caption = "\n".join(_caption(reports, sims, opt, bounds, with_ratios))
    return t


def _columns(with_sims: bool, with_ratios: bool) -> list[str]:
    if with_sims:
        cols = ["policy", "actions", "ACT avg s (sim, err)", "p50 (sim)", "p99 (sim)",
                "step s (sim, err)", "util cpu (sim)"]
    else:
        cols = ["policy", "actions", "ACT avg s", "p50", "p99", "step s", "util cpu"]
    if with_ratios:
        cols += ["ACT x" + (" (sim)" if with_sims else ""), "step x" + (" (sim)" if with_sims else "")]
    return [*cols, "other load"]


def _measured_cells(name: str, r: Any) -> list[str]:
    a, st = r.act, r.step_avg_s
    return [name, str(r.actions), _fmt(a["avg"]), _fmt(a["p50"]), _fmt(a["p99"]), _fmt(st),
            f"{100 * r.cpu_utilization:.0f}%"]


def _predicted_cells(name: str, r: Any, s: Any) -> list[str]:
    """Each measured figure with the simulator's beside it (and its error, for the means)."""
    from ..replay.predict import err

    a, st = r.act, r.step_avg_s
    return [name, str(r.actions),
            f"{_fmt(a['avg'])} ({_fmt(s.act['avg'])}, {_pct(err(a['avg'], s.act['avg']))})",
            f"{_fmt(a['p50'])} ({_fmt(s.act['p50'])})", f"{_fmt(a['p99'])} ({_fmt(s.act['p99'])})",
            f"{_fmt(st)} ({_fmt(s.step_avg_s)}, {_pct(err(st, s.step_avg_s))})",
            f"{100 * r.cpu_utilization:.0f}% ({100 * s.utilization.get('cpu', 0.0):.0f}%)"]


def _ratio(x: float, ours: float) -> float:
    return x / ours if ours > 0 else math.inf


def _ratio_cells(r: Any, mine: Any, s: Any | None, s_mine: Any | None) -> list[str]:
    """The row's ACT and step as multiples of ours (and the prediction's, with ``sims``)."""
    ra, rs = _ratio(r.act["avg"], mine.act["avg"]), _ratio(r.step_avg_s, mine.step_avg_s)
    if s is not None and s_mine is not None:
        pa = _ratio(s.act["avg"], s_mine.act["avg"])
        ps = _ratio(s.step_avg_s, s_mine.step_avg_s)
        return [f"{_fmt(ra)} ({_fmt(pa)})", f"{_fmt(rs)} ({_fmt(ps)})"]
    return [_fmt(ra), _fmt(rs)]


def _caption(reports: Mapping[str, Any], sims: Mapping[str, Any] | None, opt: float | None,
             bounds: Mapping[str, Mapping[str, float]] | None, with_ratios: bool) -> list[str]:
    cap = []
    if bounds:
        cap.append(bound_line(reports, bounds, sims))
    if opt is not None and opt > 0:
        cap.append(f"each action alone at its best allotment, no queueing, no start-up "
                   f"(calibrated trace): ACT avg {_fmt(opt)} s")
    lost = lost_actions(reports)
    if lost:
        cap.append(lost)
    if with_ratios:
        cap.append("ACT x / step x: the policy's figure divided by tangram's (> 1: tangram is better)")
    if sims:
        cap.append("(sim, err): the simulator's prediction with the calibrated spec, and its "
                   "error relative to the measurement")
    cap.append("util cpu: CPU-seconds the sandboxes consumed / (cores x makespan); the "
               "simulator's: allotted while running")
    cap.append("other load: cores busy on this machine with neither a sandbox nor the engine's "
               "process during the run (other jobs); the calibration measured it as it was then")
    return cap


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
    from ..replay.predict import predict, run_bound

    console = make_console(stderr=args.json)
    _check_args(args)
    cluster, cal, steps, images = _inputs(args, console)
    units = _units_per_s(cal, console)
    if args.predict and cal.get("cold_start_s") is None and cal.get("session_open_s") is None:
        console.print(_UNCALIBRATED_PREDICT)
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
        _print_json(args, cal, cluster, steps, reports, sims, bounds)
    else:
        _print_tables(args, console, cal, cluster, steps, reports, sims, bounds)
    return 0


def _check_args(args: argparse.Namespace) -> None:
    """Arguments that cannot go together, and the policy's label (`KeyError`: exit 2)."""
    if args.url and args.compare:
        raise SpecError("--url", None, "--compare", "a running service has one policy; use --policy "
                        "(which it must run) or replay embedded")
    if args.policy:
        from ..sim.runner import parse_policy

        parse_policy(args.policy)


def _inputs(args: argparse.Namespace, console: Any) -> tuple[Any, dict[str, Any], Any,
                                                             dict[str, str]]:
    """(cluster, calibration, RL steps, the images the trace uses: name -> path). The cluster
    first when it is a file: a bad trace or spec fails before any measurement."""
    from ..replay.inputs import load_for_replay, parse_image_args, read_images, trace_images
    from ..specfile import load_cluster_yaml

    images = {**(read_images(args.cluster) if args.cluster else {}),
              **parse_image_args(getattr(args, "image", None) or [])}
    # embedded, every session's image needs a path; a running service may hold it already
    need = None if args.url else images
    if args.cluster:
        load_for_replay(args.trace, load_cluster_yaml(args.cluster), args.steps, need)

    def say(m: str) -> None:
        console.print(f"[dim]{m}[/dim]")

    cluster, cal = resolve_cluster(args.cluster, say, announce=lambda: say(
        "no --cluster: calibrating this machine first (tangram calibrate --out FILE saves it)"))
    steps = load_for_replay(args.trace, cluster, args.steps, need)
    used = trace_images(steps)
    return cluster, cal, steps, {k: v for k, v in images.items() if k in used}


def _units_per_s(cal: Mapping[str, Any], console: Any) -> float:
    """The work program's speed: the calibration's, or measured in this process now."""
    from ..replay.calibrate import quick_units_per_s

    units = float(cal.get("units_per_s") or 0.0)
    if units <= 0:
        units = quick_units_per_s()
        console.print(f"[dim]no calibration in the spec: work program measured here at "
                      f"{units:.0f} units per core-second[/dim]")
    return units


_UNCALIBRATED_PREDICT = (
    "[yellow]--predict with a spec that has no calibration: the prediction "
    "takes sandbox starts and session opens from the trace's cold_start_s "
    "figures, which describe other machines (the first action of each "
    "session pays its whole cold_start_s); leave --cluster out, or give a "
    "`tangram calibrate --out FILE` spec, to predict this machine[/yellow]")


def _print_json(args: argparse.Namespace, cal: Mapping[str, Any], cluster: Any, steps: Any,
                reports: Mapping[str, Any], sims: Mapping[str, Any],
                bounds: Mapping[str, Any]) -> None:
    from ..replay.predict import fidelity, optimum

    out: dict[str, Any] = {"trace": args.trace, "calibration": cal,
                           "optimum": {"act_avg": optimum(cluster, steps, cal, args.train_s),
                                       "by_policy": bounds},
                           "reports": {k: r.as_dict() for k, r in reports.items()}}
    if sims:
        out["predicted"] = {k: s.as_dict() for k, s in sims.items()}
        out["fidelity"] = fidelity(reports, sims)
    print(json.dumps(out, indent=2, default=_json_default))


def _print_tables(args: argparse.Namespace, console: Any, cal: Mapping[str, Any], cluster: Any,
                  steps: Any, reports: Mapping[str, Any], sims: Mapping[str, Any],
                  bounds: Mapping[str, Any]) -> None:
    from ..replay.predict import fidelity, optimum

    n_act = sum(len(t.steps) for b in steps for t in b)
    console.print(table(reports, sims or None,
                        f"{args.trace}: {n_act} actions, real "
                        f"{cluster.total_capacity().get('cpu'):g} CPU",
                        opt=optimum(cluster, steps, cal, args.train_s), bounds=bounds))
    if sims:
        _print_fidelity(console, fidelity(reports, sims))


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
