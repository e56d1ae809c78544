"""Built-in workloads: seeded, shaped as documented, clusters sized by their stated rule."""

import pytest

from arl_tangram.core.actions import ActionKind
from arl_tangram.sim.workloads import WORKLOADS, get_workload


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_same_seed_same_trajectories_other_seed_differs(name):
    w = get_workload(name)
    a = [t for b in w.batches(1, 16, 2) for t in b]
    b = [t for b in w.batches(1, 16, 2) for t in b]
    c = [t for b in w.batches(2, 16, 2) for t in b]
    assert a == b and a != c
    assert len({t.id for t in a}) == 32 and {t.rl_step for t in a} == {0, 1}
    models = {m.name for m in w.cluster(16).models}
    for t in a:
        for gen, act in t.steps:
            assert gen > 0 and act.work_s > 0
            assert not act.kind.uses_model or act.model in models


def test_shapes_follow_the_documented_parameters():
    swe = [t for b in get_workload("swe-agent").batches(0, 200, 1) for t in b]
    turns = sorted(len(t.steps) - 1 for t in swe)
    assert turns[0] >= 5 and turns[-1] <= 50 and 20 <= turns[len(turns) // 2] <= 40
    assert all(a.session == "repo" for t in swe for _g, a in t.steps)
    assert all(t.steps[-1][1].kind is ActionKind.TEST for t in swe)
    code = [t for b in get_workload("code-rl").batches(0, 300, 1) for t in b]
    assert all(len(t.steps) == 1 and t.steps[0][1].hints.test_count >= 1 for t in code)
    gens = sorted(t.steps[0][0] for t in code)
    assert 80 < gens[len(gens) // 2] < 170  # ~5000 tokens at 40 tok/s
    math_ = [t for b in get_workload("tool-math").batches(0, 300, 1) for t in b]
    assert all(1 <= len(t.steps) <= 10 for t in math_)
    mixed = [t for b in get_workload("mixed").batches(0, 90, 1) for t in b]
    assert {t.task for t in mixed} == {"swe-agent", "code-rl", "code-easy", "code-hard", "tool-math",
                                       "chat-rm-small", "chat-rm", "genrm-judge", "rlhf-rm"}
    assert all(sum(t.task == k for t in mixed) == 10 for k in {t.task for t in mixed})
    assert {a.model for t in mixed for _g, a in t.steps if a.model} == {"rm-1.5b", "rm-8b", "judge-32b"}
    # heterogeneity across sources: mean generated tokens (gen seconds) differ by > 20x
    gen = {k: sum(g for t in mixed if t.task == k for g, _a in t.steps) / 10 for k in {t.task for t in mixed}}
    assert max(gen.values()) / min(gen.values()) > 20


def test_scored_answers_arrive_in_groups():
    from arl_tangram.sim.workloads import GROUP_SIZE

    batch = next(iter(get_workload("mixed").batches(0, 9 * GROUP_SIZE, 1)))
    judged = [t for t in batch if t.task == "genrm-judge"]
    assert len(judged) == GROUP_SIZE and len({t.steps[0][0] for t in judged}) == 1
    solo = next(iter(get_workload("rlhf-rm").batches(0, 32, 1)))  # no groups there
    assert len({t.steps[0][0] for t in solo}) == 32


def test_load_divides_generation_times():
    from arl_tangram.sim.workloads import with_load

    w = get_workload("tool-math")
    base, fast = (next(iter(with_load(lambda: w.batches(1, 8, 1), f)())) for f in (1.0, 4.0))
    for a, b in zip(base, fast, strict=True):
        assert [g / 4 for g, _ in a.steps] == pytest.approx([g for g, _ in b.steps])
        assert [x.work_s for _, x in a.steps] == [x.work_s for _, x in b.steps]


def test_cpu_clusters_follow_the_static_provisioning_rule():
    assert get_workload("swe-agent").cluster(64).total_capacity()["cpu"] == 128
    assert get_workload("code-rl").cluster(100).total_capacity()["cpu"] == 104  # whole 8-core nodes
    assert get_workload("rlhf-rm").cluster(10).total_capacity()["gpu"] == 8


def test_unknown_workload_names_the_choices():
    with pytest.raises(KeyError, match="swe-agent"):
        get_workload("nope")


def test_tool_math_fast_constructors_build_what_the_keyword_forms_build():
    from arl_tangram.sim.trace import SimAction, Trajectory
    from arl_tangram.sim.workloads import DOCKER_COLD_S, MATH_DEMAND

    for t in [t for b in get_workload("tool-math").batches(3, 20, 1) for t in b]:
        steps = tuple((gen, SimAction(ActionKind.CODE, a.work_s, MATH_DEMAND, tag="python",
                                      timeout_s=10.0, cold_start_s=DOCKER_COLD_S))
                      for gen, a in t.steps)
        ref = Trajectory(t.id, "tool-math", steps, 0.0, {}, t.rl_step)
        assert type(t) is Trajectory and t == ref and repr(t) == repr(ref)
        assert all(type(a) is SimAction for _g, a in t.steps)


def test_tool_math_draws_what_the_plain_samplers_draw():
    """tool_math inlines gen_seconds and lognormal: the same draws, the same floats."""
    import random

    from arl_tangram.sim.workloads import gen_seconds, lognormal, poisson, tool_math

    for seed in range(30):
        rng, ref = random.Random(seed), random.Random(seed)
        for i in range(20):
            t = tool_math(rng, 1, i)
            calls = min(10, 1 + poisson(ref, 2.5))
            want = [(gen_seconds(ref, 600, 0.7, 8000), lognormal(ref, 0.1, 1.3, 0.01, 30))
                    for _ in range(calls)]
            got = [(g, a.work_s) for g, a in t.steps]
            assert got == want and [type(x) for p in got for x in p] == [type(x) for p in want for x in p]
    assert rng.random() == ref.random()


def test_swe_agent_fast_constructors_build_what_the_keyword_forms_build():
    from arl_tangram.core.actions import WorkHints
    from arl_tangram.sim.trace import SimAction, Trajectory
    from arl_tangram.sim.workloads import (
        _SWE_FINAL_EL,
        _SWE_TEST_DEMAND,
        _SWE_TEST_EL,
        _SWE_TOOL_DEMAND,
        DOCKER_COLD_S,
        SWE_SESSION,
    )

    for t in [t for b in get_workload("swe-agent").batches(3, 20, 1) for t in b]:
        steps = []
        for i, (gen, a) in enumerate(t.steps):
            if i == len(t.steps) - 1:
                ref = SimAction(ActionKind.TEST, a.work_s, _SWE_TEST_DEMAND, _SWE_FINAL_EL,
                                WorkHints(test_count=a.hints.test_count), session="repo",
                                tag="pytest", timeout_s=1800.0, cold_start_s=DOCKER_COLD_S)
            elif a.kind is ActionKind.TEST:
                ref = SimAction(ActionKind.TEST, a.work_s, _SWE_TEST_DEMAND, _SWE_TEST_EL,
                                WorkHints(test_count=a.hints.test_count), session="repo",
                                tag="pytest", timeout_s=900.0, cold_start_s=DOCKER_COLD_S)
            else:
                ref = SimAction(ActionKind.TOOL, a.work_s, _SWE_TOOL_DEMAND, session="repo",
                                tag="bash", timeout_s=300.0, cold_start_s=DOCKER_COLD_S)
            steps.append((gen, ref))
        want = Trajectory(t.id, "swe-agent", tuple(steps), 0.0, {"repo": SWE_SESSION}, t.rl_step)
        assert type(t) is Trajectory and t == want and repr(t) == repr(want)
        assert all(type(a) is SimAction and type(a.hints) is WorkHints for _g, a in t.steps)
        assert {a.kind for _g, a in t.steps} <= {ActionKind.TEST, ActionKind.TOOL}
