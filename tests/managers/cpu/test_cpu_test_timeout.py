# ruff: noqa: F811  (the module-scoped `mgr` fixture is imported, then requested)
"""A TEST action is bounded by its `timeout_s` as a whole (issue 35, M5): the compile stage and
every case together end within it, however many cases it has and whatever each case's own
`run_timeout`; the cases that finished are reported, the one running at the deadline is
`TimeLimitExceeded`, those never started are `skipped`, and the action is `timed_out`. The
number of cases is capped by the CPU manager's `max_test_cases` (refused, naming the field).
Real sandboxes; each case is a separate process of the case runner (`sandbox/init._run_cases`)."""

from __future__ import annotations

import itertools

import pytest
from _cpu_fixture import mgr  # noqa: F401
from _cpu_helpers import allot

from arl_tangram.core.actions import ActionKind, ActionSpec, Status
from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig

pytestmark = [pytest.mark.integration, pytest.mark.needs_root,
              pytest.mark.asyncio(loop_scope="module")]

_ids = itertools.count()


def make_test(code: str, cases: list[dict[str, object]], timeout_s: float,
                **payload: object) -> ActionSpec:
    return ActionSpec(id=f"tt{next(_ids)}", kind=ActionKind.TEST, timeout_s=timeout_s,
                      payload={"code": code, "cases": cases, **payload})


# Case "block" sleeps far past the action's timeout_s (but within its own run_timeout); every
# other case answers at once.
BLOCKING = "x = input()\nif x == 'block':\n    import time\n    time.sleep(600)\nprint(x)\n"


async def test_cases_end_at_the_actions_timeout_s(mgr: CpuManager) -> None:
    cases: list[dict[str, object]] = [{"stdin": str(i), "expected_stdout": str(i)}
                                      for i in range(7)]
    cases += [{"stdin": "block", "expected_stdout": "block"}]
    cases += [{"stdin": str(i), "expected_stdout": str(i)} for i in range(8, 60)]
    # each case alone may run 10 s; the action as a whole 3 s (one core: one case at a time)
    r = await mgr.run(make_test(BLOCKING, cases, timeout_s=3, run_timeout=10), allot(cpu=1))
    assert r.cases is not None and len(r.cases) == 60, r.to_dict()
    assert [c.passed for c in r.cases[:7]] == [True] * 7, r.to_dict()
    assert [c.run.stdout for c in r.cases[:7] if c.run] == [f"{i}\n" for i in range(7)]
    assert r.cases[7].run is not None and r.cases[7].run.status == "TimeLimitExceeded"
    assert not r.cases[7].passed and not r.cases[7].skipped
    assert [c.skipped for c in r.cases[8:]] == [True] * 52, r.to_dict()
    assert all(c.run is None and not c.passed for c in r.cases[8:])
    assert r.status == "Failed" and r.timeout_s_exceeded and r.timed_out
    assert r.action_status is Status.TIMED_OUT
    assert r.message == "7/60 cases passed; timeout_s (3 s) ran out: 7 of 60 cases finished"
    d = r.to_dict()
    assert [c["skipped"] for c in d["cases"]].count(True) == 52


async def test_sixty_half_second_cases_under_five_seconds_time_out(mgr: CpuManager) -> None:
    """The review's shape: 60 cases of 0.5 s, timeout_s 5, one core: not all 60 run (30 s)."""
    code = "import time\nx = input()\ntime.sleep(0.5)\nprint(x)\n"
    cases: list[dict[str, object]] = [{"stdin": str(i), "expected_stdout": str(i)}
                                      for i in range(60)]
    r = await mgr.run(make_test(code, cases, timeout_s=5), allot(cpu=1))
    assert r.cases is not None and len(r.cases) == 60
    finished = [c for c in r.cases if c.run is not None and c.run.status == "Finished"]
    killed = [c for c in r.cases if c.run is not None and c.run.status == "TimeLimitExceeded"]
    skipped = [c for c in r.cases if c.skipped]
    assert all(c.passed for c in finished), r.to_dict()
    # one case at a time: the cases before the deadline finished, then at most the one running
    # at it was killed, and every later one never started
    assert len(killed) <= 1 and len(finished) + len(killed) + len(skipped) == 60
    n = len(finished) + len(killed)
    assert [c.skipped for c in r.cases] == [False] * n + [True] * (60 - n)
    assert len(skipped) >= 1, r.to_dict()
    assert r.action_status is Status.TIMED_OUT and r.status == "Failed"
    assert r.message.endswith(f"timeout_s (5 s) ran out: {len(finished)} of 60 cases finished")


async def test_a_case_within_the_deadline_is_not_cut(mgr: CpuManager) -> None:
    """The bound takes nothing from an action that fits: every case runs, Success."""
    cases: list[dict[str, object]] = [{"stdin": str(i), "expected_stdout": str(i)}
                                      for i in range(5)]
    r = await mgr.run(make_test("print(input())", cases, timeout_s=60), allot(cpu=1))
    assert r.status == "Success" and r.action_status is Status.SUCCEEDED, r.to_dict()
    assert not r.timeout_s_exceeded and [c.passed for c in r.cases or ()] == [True] * 5


async def test_more_cases_than_max_test_cases_are_refused(mgr: CpuManager) -> None:
    assert CpuManagerConfig().max_test_cases == 1024 == mgr.config.max_test_cases
    cases: list[dict[str, object]] = [{"stdin": "", "expected_stdout": None}] * 1025
    r = await mgr.run(make_test("print(1)", cases, timeout_s=60), allot(cpu=1))
    assert r.status == "SandboxError" and r.cases is None and r.executor_pod_name is None
    assert r.message == ("payload.cases: at most 1024 cases (the CPU manager's max_test_cases), "
                         "got 1025")
    with pytest.raises(ValueError, match="max_test_cases must be a positive number, got 0"):
        CpuManagerConfig(max_test_cases=0)
