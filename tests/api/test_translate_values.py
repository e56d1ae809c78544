"""`api/translate.py` on exact values (issue 43: its mutants): a request's actions (ids, kinds,
demands, timeouts, fan-out per model, each refusal by its field and words), and the results'
wire bodies whole, key order too.

SandboxFusion's answers are checked against the peer's own schema: its models (tests/sandboxfusion_peer.py) are copied
from its published source, bytedance/SandboxFusion at 469de08 (sandbox/server/sandbox_api.py:
RunStatus, RunCodeResponse; sandbox/runners/types.py: CommandRunStatus, CommandRunResult), as in
tests/managers/cpu/test_sandboxfusion_wire.py. Every answer `run_code_body` makes (a sandbox's,
another producer's dict completed, an action no sandbox answered) must carry every field the
peer names, validate as its model and read back the same values.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from arl_tangram.api import translate as T
from arl_tangram.api.schemas import ActionIn, ElasticityIn, HintsIn
from arl_tangram.core.actions import (
    ActionKind,
    ActionResult,
    Elasticity,
    Speedup,
    Status,
    WorkHints,
)
from arl_tangram.core.errors import InvalidAction
from arl_tangram.core.resources import Resources
from arl_tangram.kinds import (
    CodeRequest,
    CommandRunStatus,
    JudgeVerdict,
    RunResult,
    RunStatus,
    ScoreRequest,
    ScoreResult,
    StageResult,
)
from sandboxfusion_peer import PeerRunCodeResponse, PeerRunStatus


def _as_peer(ours: dict[str, Any]) -> PeerRunCodeResponse:
    """``ours`` read as the peer reads it: every field it names there, the same values."""
    missing = set(PeerRunCodeResponse.model_fields) - set(ours)
    assert not missing, f"fields the peer names are missing: {sorted(missing)}"
    peer = PeerRunCodeResponse.model_validate(ours)
    back = json.loads(peer.model_dump_json())
    for name in PeerRunCodeResponse.model_fields:
        if isinstance(ours[name], dict) and name != "files":
            assert back[name] == {k: ours[name][k] for k in back[name]}, name
        else:
            assert back[name] == ours[name], (name, back[name], ours[name])
    return peer


def test_statuses_are_the_peers() -> None:
    assert [(s.name, s.value) for s in RunStatus] == [(s.name, s.value) for s in PeerRunStatus]
    assert {"Success", "Failed", "SandboxError"} == T._RUN_STATUSES


# ---- /run_code's action ------------------------------------------------------------------------


def test_new_id() -> None:
    a, b = T.new_id(), T.new_id()
    assert re.fullmatch(r"[0-9a-f]{32}", a) and a != b


def test_run_code_action() -> None:
    req = CodeRequest(code="echo", language="bash", memory_limit_MB=128, compile_timeout=3,
                      run_timeout=4)
    spec = T.run_code_action(req, action_id="a1", session="s1")
    assert (spec.id, spec.kind, spec.demand, spec.timeout_s, spec.tag, spec.session) == (
        "a1", ActionKind.CODE, Resources(cpu=1, memory_mb=128), 3 + 4 + 5.0, "bash", "s1")
    assert spec.payload is req
    spec = T.run_code_action(CodeRequest(code="x"))
    assert re.fullmatch(r"[0-9a-f]{32}", spec.id)
    assert (spec.demand, spec.timeout_s, spec.tag, spec.session) == (
        Resources(cpu=1, memory_mb=512), 10 + 10 + 5.0, "python", None)
    assert spec.elasticity is None and spec.model is None and spec.task == "default"


# ---- native actions ----------------------------------------------------------------------------


def _refused(a: ActionIn, where: str = "actions[2]", default: str | None = None) -> tuple[str, str]:
    with pytest.raises(InvalidAction) as e:
        T.native_actions(a, where, default)
    return e.value.field, str(e.value)


def test_demand() -> None:
    assert T._demand(ActionIn(kind="reward"), "w") == Resources()
    assert T._demand(ActionIn(kind="judge"), "w") == Resources()
    for kind in ("code", "test", "tool", "custom", "search", "fetch"):
        assert T._demand(ActionIn(kind=kind), "w") == Resources(cpu=1, memory_mb=512), kind
    assert T._demand(ActionIn(demand={"cpu": 2.5}), "w") == Resources(cpu=2.5)
    assert T._demand(ActionIn(demand={}), "w") == Resources()
    bad = ActionIn.model_construct(**{**ActionIn().__dict__, "demand": {"cpu": -1}})
    with pytest.raises(InvalidAction) as e:
        T._demand(bad, "actions[1]")
    assert (e.value.field, str(e.value)) == (
        "actions[1].demand", "actions[1].demand: resource 'cpu' must be a non-negative number, "
                             "got -1.0")


def test_one_native_action_whole() -> None:
    a = ActionIn(id="a", kind="custom", payload={"sleep": 1}, demand={"cpu": 2, "gpu": 1},
                 elasticity=ElasticityIn(min=2, max=4, parallel_fraction=0.5),
                 hints=HintsIn(expected_s=3, test_count=2, tokens=5, items=1, prompt_tokens=4),
                 task="t", trajectory="tr", siblings="g", session="s", tag="tg", timeout_s=7,
                 weight=2, idempotent=False)
    (spec,) = T.native_actions(a)
    assert (spec.id, spec.kind, spec.demand, spec.elasticity, spec.hints, spec.task,
            spec.trajectory, spec.session, spec.model, spec.tag, spec.timeout_s, spec.weight,
            spec.idempotent, spec.payload, spec.siblings) == (
        "a", ActionKind.CUSTOM, Resources(cpu=2, gpu=1), Elasticity(2, 4, "cpu", Speedup(0.5)),
        WorkHints(3, 2, 5, 1, 4), "t", "tr", "s", None, "tg", 7, 2, False, {"sleep": 1}, "g")
    assert spec.payload is not a.payload  # (a copy: the client's dict is not the core's)
    (spec,) = T.native_actions(ActionIn(kind="test"))
    assert re.fullmatch(r"[0-9a-f]{32}", spec.id)
    assert (spec.kind, spec.demand, spec.elasticity, spec.hints, spec.task, spec.timeout_s,
            spec.weight, spec.idempotent, spec.payload) == (
        ActionKind.TEST, Resources(cpu=1, memory_mb=512), None, WorkHints(), "default", 60.0,
        1.0, True, {})


def test_models_fan_out() -> None:
    specs = T.native_actions(ActionIn(id="r", kind="reward", models=["m1", "m2"],
                                      payload={"query": "q"}))
    assert [(s.id, s.model, s.kind, s.demand) for s in specs] == [
        ("r.m1", "m1", ActionKind.REWARD, Resources()), ("r.m2", "m2", ActionKind.REWARD,
                                                         Resources())]
    assert specs[0].payload == specs[1].payload == {"query": "q"}
    (one,) = T.native_actions(ActionIn(id="r", kind="reward", models=["m1"]))
    assert (one.id, one.model) == ("r", "m1")
    (one,) = T.native_actions(ActionIn(id="r", kind="judge", model="j"))
    assert (one.id, one.model, one.kind) == ("r", "j", ActionKind.JUDGE)
    # ``models`` before ``model``; ``model`` before the default
    assert [s.model for s in T.native_actions(ActionIn(kind="reward", models=["a"], model="b"),
                                              "w", "c")] == ["a"]
    (one,) = T.native_actions(ActionIn(id="r", kind="reward", model="b"), "w", "c")
    assert (one.id, one.model) == ("r", "b")
    (one,) = T.native_actions(ActionIn(id="r", kind="reward"), "w", "c")
    assert (one.id, one.model) == ("r", "c")


def test_native_refusals() -> None:
    assert _refused(ActionIn(kind="reward")) == (
        "actions[2].model", "actions[2].model: a reward action needs a model name")
    assert _refused(ActionIn(kind="judge"), default="") == (
        "actions[2].model", "actions[2].model: a judge action needs a model name")
    assert _refused(ActionIn(kind="reward", models=["a", "b", "a"])) == (
        "actions[2].models", "actions[2].models: model names repeat")
    assert _refused(ActionIn(kind="code", model="m")) == (
        "actions[2].model", "actions[2].model: a code action takes no model")
    assert _refused(ActionIn(kind="tool", models=["m"])) == (
        "actions[2].model", "actions[2].model: a tool action takes no model")
    assert _refused(ActionIn(kind="custom", elasticity=ElasticityIn(min=2, max=1))) == (
        "actions[2].elasticity",
        "actions[2].elasticity: elasticity.max (1.0) must be >= elasticity.min (2.0)")
    el = ElasticityIn.model_construct(min=1.0, max=2.0, dim="cpu", parallel_fraction=1.5)
    assert _refused(ActionIn.model_construct(**{**ActionIn().__dict__, "elasticity": el})) == (
        "actions[2].elasticity", "actions[2].elasticity: parallel_fraction must be in [0, 1], got 1.5")
    hints = HintsIn.model_construct(expected_s=None, test_count=None, tokens=-1, items=None,
                                    prompt_tokens=None)
    assert _refused(ActionIn.model_construct(**{**ActionIn().__dict__, "hints": hints})) == (
        "actions[2].hints.tokens", "actions[2].hints.tokens: must be in [0, 1000000000000], "
                                   "got -1")
    hints = HintsIn.model_construct(expected_s=-2.5, test_count=None, tokens=None, items=None,
                                    prompt_tokens=None)
    assert _refused(ActionIn.model_construct(**{**ActionIn().__dict__, "hints": hints})) == (
        "actions[2].hints.expected_s", "actions[2].hints.expected_s: must be a number in "
                                       "[0, 1e+09], got -2.5")
    bad = ActionIn.model_construct(**{**ActionIn(id="x").__dict__, "timeout_s": 0})
    assert _refused(bad) == ("actions[2]", "actions[2]: action x: timeout_s must be > 0, got 0")
    assert _refused(ActionIn(kind="reward"), where="action")[0] == "action.model"
    with pytest.raises(InvalidAction, match=r"^action\.model: "):
        T.native_actions(ActionIn(kind="reward"))  # (the default ``where``)


@pytest.mark.parametrize(("payload", "field", "why"), [
    ({"files": {"a\x00b": "eA=="}}, "actions[2].payload.files",
     "a file name must not contain NUL"),
    ({"files": {"ok.txt": "eA==", "x" * 256: "eA=="}}, "actions[2].payload.files",
     "each part of a file name must be at most 255 bytes, got one of 256"),
    ({"fetch_files": ["ok", "b\x00"]}, "actions[2].payload.fetch_files",
     "a file name must not contain NUL"),
    ({"files": {}, "fetch_files": ["d/" * 2049]}, "actions[2].payload.fetch_files",
     "a file name must be at most 4096 bytes, got 4098"),
])
def test_file_names_refused(payload: dict[str, Any], field: str, why: str) -> None:
    assert _refused(ActionIn(kind="code", payload=payload)) == (field, f"{field}: {why}")


def test_file_names_passed() -> None:
    for payload in ({"files": {"a/b.txt": "eA==", "x" * 255: None}, "fetch_files": ["c"]},
                    {"files": "a\x00", "fetch_files": "b\x00"},  # (not names: the manager's)
                    {"fetch_files": [3, None]}, {"files": None}, {}):
        (spec,) = T.native_actions(ActionIn(kind="code", payload=payload))
        assert spec.payload == payload
    T._check_file_names({"files": {"ok": ""}, "fetch_files": ("a\x00",)}, "w")  # (a tuple)


def test_reward_actions() -> None:
    r1, r2 = ScoreRequest(query="a"), ScoreRequest(query="b")
    groups = T.reward_actions([r1, r2], ["m1", "m2"])
    assert [[(s.kind, s.model, s.task, s.demand, s.hints) for s in g] for g in groups] == [
        [(ActionKind.REWARD, m, "rlhf", Resources(), WorkHints(items=1)) for m in ("m1", "m2")]
    ] * 2
    assert [[s.payload for s in g] for g in groups] == [[r1, r1], [r2, r2]]
    assert groups[0][0].payload is r1 and groups[1][1].payload is r2
    ids = [s.id for g in groups for s in g]
    assert len(set(ids)) == 4 and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert [s.task for s in T.reward_actions([r1], ["m"], task="t")[0]] == ["t"]
    assert T.reward_actions([], ["m"]) == [] and T.reward_actions([r1], []) == [[]]


# ---- results -----------------------------------------------------------------------------------


def test_result_dict() -> None:
    r = ActionResult("a", Status.TIMED_OUT, 1.0, 2.0, 4.5, node="n1", output={"x": 1},
                     reason="slow", attempts=2)
    d = T.result_dict(r)
    assert d == {"id": "a", "status": "timed_out", "finished": True, "submit_time": 1.0,
                 "start_time": 2.0, "finish_time": 4.5, "act": 3.5, "node": "n1",
                 "output": {"x": 1}, "reason": "slow", "attempts": 2}
    assert list(d) == ["id", "status", "finished", "submit_time", "start_time", "finish_time",
                       "act", "node", "output", "reason", "attempts"]
    d = T.result_dict(ActionResult("b", Status.RUNNING, 1.0, output=ScoreResult(model="m",
                                                                               score=0.5)))
    assert (d["status"], d["finished"], d["act"], d["output"]) == (
        "running", False, None, {"score": 0.5, "model": "m"})


def test_output_body() -> None:
    run = RunResult(RunStatus.Success, executor_pod_name="p")
    assert T.output_body(run) == run.to_dict() and type(T.output_body(run)) is dict
    assert T.output_body(ScoreResult(model="m", score=1.0)) == {"score": 1.0, "model": "m"}
    other = {"a": 1}
    assert T.output_body(other) is other and T.output_body(None) is None


def test_pending_dict() -> None:
    d = T.pending_dict("a", Status.QUEUED)
    assert d == {"id": "a", "status": "queued", "finished": False, "output": None, "reason": ""}
    assert list(d) == ["id", "status", "finished", "output", "reason"]


def _part(model: str, status: Status, *, sub: float = 1.0, start: float | None = None,
          finish: float | None = None, score: float = 0.5, reason: str = "") -> ActionResult:
    return ActionResult(f"g.{model}", status, sub, start, finish,
                        output=ScoreResult(model=model, score=score), reason=reason)


def test_join_group() -> None:
    ok = T.join_group("g", [_part("m1", Status.SUCCEEDED, sub=2.0, start=3.0, finish=5.0),
                            _part("m2", Status.SUCCEEDED, sub=1.5, start=4.0, finish=6.0,
                                  score=0.25)])
    assert ok == ActionResult("g", Status.SUCCEEDED, 1.5, 3.0, 6.0, output={"scores": {
        "m1": {"score": 0.5, "model": "m1"}, "m2": {"score": 0.25, "model": "m2"}}}, reason="")
    bad = T.join_group("g", [
        _part("m1", Status.SUCCEEDED, start=3.0, finish=5.0),
        _part("m2", Status.TIMED_OUT, start=2.0, finish=4.0, reason="slow"),
        _part("m3", Status.FAILED, start=None, finish=9.0, reason="broke")])
    assert bad == ActionResult("g", Status.TIMED_OUT, 1.0, 2.0, 9.0, output={"scores": {
        "m1": {"score": 0.5, "model": "m1"}, "m2": {"error": "slow"},
        "m3": {"error": "broke"}}}, reason="slow; broke")
    # a part with no finish time (cancelled before it ran): none for the group; none started:
    # no start time
    mid = T.join_group("g", [_part("m1", Status.SUCCEEDED, finish=2.0),
                             _part("m2", Status.CANCELLED, reason="")])
    assert (mid.status, mid.start_time, mid.finish_time, mid.reason) == (
        Status.CANCELLED, None, None, "")
    assert mid.output == {"scores": {"m1": {"score": 0.5, "model": "m1"}, "m2": {"error": ""}}}
    # a group id with dots: the model is what follows the last one
    dotted = T.join_group("a.b", [ActionResult("a.b.m", Status.SUCCEEDED, 0.0, output=None)])
    assert dotted.output == {"scores": {"m": None}}
    one = T.join_group("g", [_part("m", Status.CANCELLED, reason="x")])
    assert (one.status, one.reason) == (Status.CANCELLED, "x")


def test_join_group_keys_a_dotted_model_name_whole() -> None:
    """(A defect the mutation run found: the model was what followed the last dot of the part's
    id, so `qwen2.5-rm`'s score came back under "5-rm".)"""
    specs = T.native_actions(ActionIn(id="r", kind="reward", models=["qwen2.5-rm", "rm"]))
    parts = [ActionResult(s.id, Status.SUCCEEDED, 0.0, output=ScoreResult(model=s.model or "",
                                                                         score=1.0))
             for s in specs]
    assert set(T.join_group("r", parts).output["scores"]) == {"qwen2.5-rm", "rm"}


# ---- SandboxFusion's RunCodeResponse -----------------------------------------------------------


def test_run_code_body_of_a_sandbox_answer() -> None:
    run = RunResult(RunStatus.Failed, "bad", run_result=StageResult(
        CommandRunStatus.Error, 0.5, 1, "o", "e"), executor_pod_name="n1", files={"f": "eA=="},
                    memory_exceeded=True)
    d = T.run_code_body(run, Status.FAILED, "ignored", "pod")
    assert d == run.to_dict() and d["memory_exceeded"] is True  # (extras kept)
    assert d["executor_pod_name"] == "n1"
    _as_peer(d)


def test_run_code_body_of_another_producers_dict() -> None:
    for status in ("Success", "Failed", "SandboxError"):
        d = T.run_code_body({"status": status, "extra": 1}, Status.SUCCEEDED, "", "pod")
        assert d == {"status": status, "extra": 1, "message": "", "compile_result": None,
                     "run_result": None, "files": {}, "executor_pod_name": "pod"}
        assert list(d) == ["status", "extra", "message", "compile_result", "run_result", "files",
                           "executor_pod_name"]
        _as_peer(d)
    full = {"status": "Success", "message": "m", "compile_result": None,
            "run_result": {"status": "Finished", "execution_time": 0.1, "return_code": 0,
                           "stdout": "hi", "stderr": ""}, "files": {"a": "eA=="},
            "executor_pod_name": "own"}
    src = dict(full)
    assert T.run_code_body(full, Status.SUCCEEDED, "", "pod") == src
    assert full == src  # (not changed in place)
    assert T.run_code_body({"status": "Success", "executor_pod_name": None}, Status.SUCCEEDED,
                           "", "pod")["executor_pod_name"] is None


def test_run_code_body_when_no_sandbox_answered() -> None:
    d = T.run_code_body(None, Status.TIMED_OUT, "", "pod")
    assert d == {"status": "Failed", "message": "timed_out", "compile_result": None,
                 "run_result": {"status": "TimeLimitExceeded", "execution_time": None,
                                "return_code": None, "stdout": "", "stderr": ""},
                 "executor_pod_name": "pod", "files": {}}
    _as_peer(d)
    d = T.run_code_body({"status": "Timeout"}, Status.TIMED_OUT, "waited 12 s", None)
    assert (d["message"], d["executor_pod_name"], d["run_result"]["status"]) == (
        "waited 12 s", None, "TimeLimitExceeded")
    for status, reason, message in (
            (Status.CANCELLED, "", "cancelled: cancelled"),
            (Status.NODE_LOST, "node n1 lost", "node_lost: node n1 lost"),
            (Status.FAILED, "x", "failed: x")):
        d = T.run_code_body("not a dict", status, reason, "pod")
        assert d == {"status": "SandboxError", "message": message, "compile_result": None,
                     "run_result": None, "executor_pod_name": "pod", "files": {}}
        _as_peer(d)
    assert list(d) == ["status", "message", "compile_result", "run_result", "executor_pod_name",
                       "files"]


def test_run_code_response_names_the_node_else_the_pod() -> None:
    r = ActionResult("a", Status.CANCELLED, 0.0, node="n1")
    assert T.run_code_response(r, "pod")["executor_pod_name"] == "n1"
    r = ActionResult("a", Status.CANCELLED, 0.0, reason="gone")
    assert T.run_code_response(r, "pod") == {
        "status": "SandboxError", "message": "cancelled: gone", "compile_result": None,
        "run_result": None, "executor_pod_name": "pod", "files": {}}
    assert T.run_code_response(r)["executor_pod_name"] is None


# ---- scores ------------------------------------------------------------------------------------


def test_score_of() -> None:
    assert T.score_of(ScoreResult(model="m", score=1)) == 1.0
    assert type(T.score_of(ScoreResult(model="m", score=1))) is float
    v = JudgeVerdict(model="j", reasoning="", prompt_tokens=1, completion_tokens=1,
                     finish_reason="stop", score=0.75, verdict="yes")
    assert T.score_of(v) == 0.75
    assert T.score_of({"score": 2}) == 2.0 and type(T.score_of({"score": 2})) is float
    assert T.score_of({"score": -0.5, "model": "m"}) == -0.5
    for bad in ({"score": "1"}, {"score": None}, {}, [("score", 1)], None, 3.0):
        with pytest.raises(ValueError) as e:
            T.score_of(bad)
        assert str(e.value) == f"no score in output {bad!r}"
