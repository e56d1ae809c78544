"""Instructions per core decision, counted by callgrind: the crowded regime against its
same-contention peer, this tree against a base tree, on the same recorded events.

This VM's timings move 25-40% within minutes (docs/core.md, issue 40); instruction counts do
not. Each case's event stream is recorded once from the simulator (`bench_scale.py`'s
`Recorder`, the same workload and cluster as ``bench_scale.py --same-contention``), then
replayed into a fresh core under ``valgrind --tool=callgrind --instr-atstart=no``: the events
before the window run uninstrumented, the window (``--window`` events from the stream's
``--at`` fraction) is counted (``callgrind_control -i on``), and the process ends there. Cases:
``crowded`` (``--trajectories`` on ``--nodes`` nodes of 192 cores) and ``sparse`` (2,000
trajectories on cores scaled to the same trajectories per core). Prints instructions per event
for each case and tree, the crowded/sparse ratio per tree, and this tree/base per case.

    python benchmarks/core_instructions.py --base /tmp/base/src

``--base``: a ``src`` directory holding another tree (``git archive <commit> src``, with a
compiled core built for it, or ``ARL_TANGRAM_PURE=1`` for both). Needs valgrind (Debian
``valgrind``; ``scripts/bench-deps.sh`` installs it). A case takes 1-3 minutes per tree.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _child(stream: str, n0: int, n1: int, flag: str) -> None:  # pragma: no cover - under valgrind
    from arl_tangram.sim.runner import make_core

    with open(stream, "rb") as f:
        (args, kw), events = pickle.load(f)
    handle = make_core(*args, **kw).handle
    for e in events[:n0]:
        handle(e)
    Path(flag).write_text("ready")
    while os.path.exists(flag):  # (the parent switches instrumentation on, then removes it)
        time.sleep(0.1)
    for e in events[n0:n1]:
        handle(e)
    os._exit(0)  # (not the interpreter's teardown: it would be counted)


def record(path: Path, nodes: int, trajectories: int, scale: float) -> int:
    """Record the tangram core's events of the swe-agent run into ``path``; their count."""
    sys.path.insert(0, str(HERE))
    import bench_scale as b

    from arl_tangram.sim.runner import make_core, run_policy
    from arl_tangram.sim.simulator import SimConfig
    from arl_tangram.sim.workloads import get_workload

    w = get_workload("swe-agent")
    made: list[tuple[tuple, dict]] = []
    recs: list[b.Recorder] = []

    def recording(*args, **kw):
        made.append((args, kw))
        recs.append(b.Recorder(make_core(*args, **kw)))
        return recs[-1]

    run_policy(b.cluster_for("swe-agent", nodes, trajectories, scale),
               lambda: w.batches(0, trajectories, 1), "tangram", workload="swe-agent",
               config=SimConfig(train_s=w.train_s), core_factory=recording)
    with open(path, "wb") as f:
        pickle.dump((made[0], recs[0].events), f, protocol=5)
    return len(recs[0].events)


def count(stream: Path, n0: int, n1: int, pythonpath: str | None) -> int:
    """Instructions callgrind counts over events ``n0:n1`` of ``stream``."""
    with tempfile.TemporaryDirectory() as tmp:
        flag, out = os.path.join(tmp, "flag"), os.path.join(tmp, "callgrind.out")
        env = dict(os.environ)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        p = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
             sys.executable, __file__, "--child", str(stream), str(n0), str(n1), flag],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        while not os.path.exists(flag):
            if p.poll() is not None:
                raise RuntimeError(f"the replay ended before its window: {p.stderr.read()[-2000:]}")
            time.sleep(0.2)
        subprocess.run(["callgrind_control", "-i", "on", str(p.pid)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.unlink(flag)
        p.wait()
        for line in Path(out).read_text().splitlines():
            if line.startswith("totals:"):
                return int(line.split()[1])
    raise RuntimeError("callgrind wrote no totals")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--trajectories", type=int, default=6000, help="the crowded case's count")
    ap.add_argument("--sparse", type=int, default=2000, help="the peer's count (same contention)")
    ap.add_argument("--at", type=float, default=0.465, help="the window's start, a fraction of the stream")
    ap.add_argument("--window", type=int, default=10_000, help="events counted per case")
    ap.add_argument("--base", help="a src directory of another tree, counted beside this one")
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "arl-core-instructions"),
                    help="where recorded streams are kept (recorded once per case)")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        _child(a.child[0], int(a.child[1]), int(a.child[2]), a.child[3])
        return 0
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("core_instructions: valgrind is not installed (scripts/bench-deps.sh)", file=sys.stderr)
        return 2
    cache = Path(a.cache)
    cache.mkdir(parents=True, exist_ok=True)
    trees = [("this", None)] + ([("base", a.base)] if a.base else [])
    per: dict[tuple[str, str], float] = {}
    for case, n, scale in (("crowded", a.trajectories, 1.0),
                           ("sparse", a.sparse, a.sparse / a.trajectories)):
        stream = cache / f"swe-agent-{a.nodes}x{round(192 * scale)}-{n}.pkl"
        if not stream.exists():
            print(f"recording {case}: {n} trajectories on {a.nodes} x {round(192 * scale)} cores",
                  file=sys.stderr, flush=True)
            record(stream, a.nodes, n, scale)
        with open(stream, "rb") as f:
            total = len(pickle.load(f)[1])
        n0 = int(a.at * total)
        n1 = min(total, n0 + a.window)
        for tree, path in trees:
            ir = count(stream, n0, n1, path)
            per[(case, tree)] = ir / (n1 - n0)
            print(f"{case:8} {tree:5} events {n0:,}-{n1:,} of {total:,}: "
                  f"{per[(case, tree)]:,.0f} instructions per event", flush=True)
    for tree, _ in trees:
        print(f"{tree}: crowded / sparse per event {per[('crowded', tree)] / per[('sparse', tree)]:.3f}")
    if a.base:
        for case in ("crowded", "sparse"):
            print(f"{case}: this / base {per[(case, 'this')] / per[(case, 'base')]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
