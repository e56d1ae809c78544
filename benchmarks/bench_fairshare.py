"""Tenants' fair share (issue 41 item 3), simulated: the review's M1 scenario (carol floods
100 or 300 one-second CPU loops at t=0; alice sends eight ``print(1)``, 4 ms each, about a
second later, or with ``--sequential`` one at a time, each at the last one's answer;
`arl_tangram.sim.tenants`), through the same core the engine runs, four ways:

- ``today``: no caps, no shares: one order for all tenants (what the review measured);
- ``cap``: each tenant's ``cpu_share: 0.5`` admission cap, the tool before (a 429 beyond it,
  the client sending its next action as soon as one of its own ends);
- ``wait``: ``share: 0.5`` each, the core's fair share (DRF), lent CPU not taken back
  (``lend_floor: 1.0``): alice's share comes back as carol's running loops end;
- ``fair``: the same with lent CPU taken back at once (the default: carol's running loops'
  CPU quotas lowered, `core/lending.py`);
and each tenant alone, the lower bound of its ACT (``alone``), and alice alone on her share of
the cores (``share``: ``cpus x 0.5``), what generalized processor sharing guarantees her while
carol is backlogged.

Printed per case: alice's mean ACT and its ratio to alone; carol's last finish (the flood's
completion) and its ratio to alone; mean over alice's arrival phases (``--phases``: alice
arrives at 1 + i/phases s, i.e. at each point of a flood action's run, which is what decides
a short action's wait when nothing is preempted). Deterministic (virtual time): no repeats.

    .venv/bin/python benchmarks/bench_fairshare.py
"""

from __future__ import annotations

import argparse

from arl_tangram.sim.tenants import m1_streams, run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpus", type=float, nargs="+", default=[2.0, 16.0],
                    help="cores of the one node (2: the review's machine)")
    ap.add_argument("--flood", type=int, nargs="+", default=[100, 300])
    ap.add_argument("--short", type=int, default=8)
    ap.add_argument("--phases", type=int, default=4)
    ap.add_argument("--sequential", action="store_true",
                    help="alice sends her actions one at a time, each at the last one's answer "
                         "(a trajectory's tool calls: within her share), not as one burst")
    args = ap.parse_args()
    shares = {"alice": 0.5, "carol": 0.5}
    print(f"{'cpus':>4} {'flood':>5} {'mode':>6} {'alice ACT s':>12} {'x alone':>9} "
          f"{'x share':>9} {'carol done s':>12} {'x alone':>8}")
    for cpus in args.cpus:
        for flood in args.flood:
            rows: dict[str, list[tuple[float, float]]] = {
                m: [] for m in ("alone", "share", "today", "cap", "wait", "fair")}
            for i in range(args.phases):
                carol, alice = m1_streams(flood, args.short, 1.0 + i / args.phases, args.sequential)
                a_alone = run([alice], cpus, "today").mean_act("alice")
                c_alone = run([carol], cpus, "today").last["carol"]
                rows["alone"].append((a_alone, c_alone))
                rows["share"].append((run([alice], cpus * 0.5, "today").mean_act("alice"), c_alone))
                for mode in ("today", "cap", "wait", "fair"):
                    o = run([carol, alice], cpus, mode, shares)
                    rows[mode].append((o.mean_act("alice"), o.last["carol"]))
            base_a = sum(a for a, _ in rows["alone"]) / args.phases
            share_a = sum(a for a, _ in rows["share"]) / args.phases
            base_c = sum(c for _, c in rows["alone"]) / args.phases
            for mode, got in rows.items():
                a = sum(x for x, _ in got) / args.phases
                c = sum(y for _, y in got) / args.phases
                print(f"{cpus:>4g} {flood:>5} {mode:>6} {a:>12.4f} {a / base_a:>9.2f} "
                      f"{a / share_a:>9.2f} {c:>12.3f} {c / base_c:>8.4f}")
            fair_a = sum(x for x, _ in rows["fair"]) / args.phases
            print(f"{'':>4} {'':>5} {'':>6} alice: today/fair {sum(x for x, _ in rows['today']) / args.phases / fair_a:.1f}x, "
                  f"per phase {', '.join(f'{x:.3f}' for x, _ in rows['fair'])} s")


if __name__ == "__main__":
    main()
