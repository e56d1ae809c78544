"""`api/service.py` on exact values (issue 43: its mutants), fast: most tests drive `Service`
over a scripted engine (`_Eng`: records what it is asked, answers what the test set), some over
a real engine and the in-test executor (tests/runtime/fakes.py). Pinned: each refusal's field and
words (batch bounds, models, sessions, resources, demands, images, idempotency keys), what
reaches the engine (ids, demands, waits, owners), groups of fanned-out models, the tenancy calls
per tenant, and the reward routes' bodies (rewards, scores_by_model, /classify's labels).
"""

from __future__ import annotations

import asyncio
import re
import time
from types import SimpleNamespace
from typing import Any

import pytest
from fakes import FakeExecutor, core_factory

from arl_tangram.api import service as S
from arl_tangram.api.schemas import ActionsIn, ClassifyIn, GetRewardIn, RunCodeRequest, SessionIn
from arl_tangram.api.service import (
    MIN_SESSION_MB,
    KeyReused,
    Service,
    SessionExpired,
    SessionNotOpened,
    Shed,
    TooManySessions,
)
from arl_tangram.api.tenancy import QuotaExceeded
from arl_tangram.core.actions import ActionKind, ActionResult, Status
from arl_tangram.core.cluster import ModelSpec
from arl_tangram.core.errors import BrokenError, InvalidAction
from arl_tangram.core.resources import Resources
from arl_tangram.kinds import ScoreResult
from arl_tangram.runtime.config import LimitsConfig, ServiceConfig, TenantConfig
from arl_tangram.runtime.engine import EXPIRED, OPENING, Engine, EngineConfig, UnknownAction

MODELS = (
    ModelSpec("a", kind="scalar", memory_mb=10),
    ModelSpec("b", kind="scalar", memory_mb=10),
    ModelSpec("sim", kind="similarity", memory_mb=10),
)
CAP = Resources(cpu=2, memory_mb=4096)


class _Eng:
    """A scripted engine: records its calls; answers from ``results`` / ``why`` / ``images``."""

    def __init__(
        self,
        nodes: tuple[Any, ...] = (SimpleNamespace(name="n1", capacity=CAP),),
        dims: frozenset[str] = frozenset({"cpu", "memory_mb"}),
    ) -> None:
        self.config = SimpleNamespace(idempotency_ttl_s=3600.0)
        self.nodes_ = list(nodes)
        self.dims_ = dims
        self.views = 0
        self.sessions = 0
        self.live_sessions: set[str] = set()
        self.images: set[str] | None = {"py"}
        self.why: Any = None
        self.calls: list[tuple[Any, ...]] = []
        self.results: dict[str, Any] = {}
        self.statuses: dict[str, Status] = {}
        self.submitted: list[Any] = []
        self.known: set[str] = set()
        self.scores: dict[str, float] = {}
        self.gone: set[str] = set()

    def cluster_view(self) -> Any:
        self.views += 1
        return SimpleNamespace(nodes=self.nodes_, dims=lambda: self.dims_)

    def session_count(self) -> int:
        return self.sessions

    def has_session(self, sid: str) -> bool:
        return sid in self.live_sessions

    def session_gone(self, sid: str) -> str | None:
        return f"session {sid!r} was closed: its ttl_s passed" if sid in self.gone else None

    def has_image(self, name: str) -> bool | None:
        if self.images is None:  # (an executor that keeps no image cache)
            return None
        return name in self.images

    async def open_session(self, sid: str | None, **kw: Any) -> str:
        self.calls.append(("open_session", sid, kw))
        sid = sid or "s-new"
        self.live_sessions.add(sid)
        return sid

    async def wait_open(self, sid: str, wait: float) -> Any:
        self.calls.append(("wait_open", sid, wait))
        return self.why

    async def close_session(self, sid: str) -> bool:
        self.calls.append(("close_session", sid))
        return True

    def submit_nowait(self, specs: Any, idempotency_key: str | None = None) -> Any:
        one = not isinstance(specs, list)
        got = [specs] if one else list(specs)
        self.submitted.extend(got)
        self.calls.append(("submit", [s.id for s in got], idempotency_key))
        for s in got:
            if s.kind == ActionKind.REWARD and isinstance(s.payload, S.ScoreRequest):
                q = s.payload.query
                if q == "fail":
                    self.results[s.id] = ActionResult(s.id, Status.FAILED, 0.0, reason="boom")
                elif q != "lost":
                    self.results[s.id] = ActionResult(
                        s.id,
                        Status.SUCCEEDED,
                        0.0,
                        1.0,
                        2.0,
                        output=ScoreResult(model=s.model, score=self.scores[s.model + q]),
                    )
        return got[0].id if one else [s.id for s in got]

    async def result(self, aid: str, wait: float | None = None) -> Any:
        self.calls.append(("result", aid, wait))
        return self.results.get(aid)

    def status(self, aid: str) -> Status:
        return self.statuses.get(aid, Status.QUEUED)

    async def cancel(self, aid: str) -> bool:
        self.calls.append(("cancel", aid))
        return aid.endswith("yes")

    def peek(self, aid: str) -> Any:
        if aid not in self.known:
            raise UnknownAction(aid)
        return None


class _Rec:
    """Records the tenancy calls a service makes, then makes them."""

    def __init__(self, real: Any, log: list[tuple[Any, ...]]) -> None:
        self._real, self._log = real, log

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._real, name)
        if name not in ("admit", "started", "own", "admit_session", "own_session"):
            return fn

        def call(*a: Any) -> Any:
            self._log.append(
                (
                    name,
                    a[0],
                    tuple(getattr(x, "id", x) for x in a[1])
                    if len(a) > 1 and not isinstance(a[1], str)
                    else a[1:],
                )
            )
            return fn(*a)

        return call


def _svc(eng: Any = None, **cfg: Any) -> tuple[Service, Any, list[tuple[Any, ...]]]:
    eng = eng or _Eng()
    cfg.setdefault("models", MODELS)
    svc = Service(eng, ServiceConfig(**cfg))
    log: list[tuple[Any, ...]] = []
    svc.tenancy = _Rec(svc.tenancy, log)  # type: ignore[assignment]
    return svc, eng, log


def _refused(exc: pytest.ExceptionInfo[InvalidAction]) -> tuple[str, str]:
    return exc.value.field, str(exc.value)


# ---- sessions ------------------------------------------------------------------------------------


async def test_open_session_hands_the_engine_every_field_and_waits_the_limit() -> None:
    svc, eng, log = _svc(limits=LimitsConfig(session_open_wait_s=7.5))
    body = SessionIn(
        session_id="s1",
        demand={"cpu": 1, "memory_mb": 64},
        ttl_s=30,
        node="n1",
        image="py",
        layer_mb=64,
    )
    assert await svc.open_session(body) == {"session_id": "s1", "state": "open"}
    assert eng.calls == [
        (
            "open_session",
            "s1",
            {
                "demand": Resources(cpu=1, memory_mb=64),
                "ttl_s": 30.0,
                "node": "n1",
                "image": "py",
                "layer_mb": 64,
                "owner": None,
            },
        ),
        ("wait_open", "s1", 7.5),
    ]
    assert log == []
    eng.calls.clear()
    assert await svc.open_session(SessionIn()) == {"session_id": "s-new", "state": "open"}
    assert eng.calls[0] == (
        "open_session",
        None,
        {
            "demand": None,
            "ttl_s": 600.0,
            "node": None,
            "image": None,
            "layer_mb": None,
            "owner": None,
        },
    )


async def test_open_session_answers_opening_expired_or_the_nodes_reason() -> None:
    svc, eng, _ = _svc()
    eng.why = OPENING
    assert await svc.open_session(SessionIn(session_id="s2")) == {
        "session_id": "s2",
        "state": "opening",
    }
    eng.why = EXPIRED
    with pytest.raises(SessionExpired) as ei:
        await svc.open_session(SessionIn(session_id="s3", ttl_s=2.5))
    assert str(ei.value) == (
        "ttl_s: session 's3' expired before its node opened it (ttl_s=2.5 "
        "s, counted from the request, is shorter than its open took); its "
        "state is gone: open it again with a longer ttl_s"
    )
    eng.why = "the node is full"
    with pytest.raises(SessionNotOpened) as ei2:
        await svc.open_session(SessionIn(session_id="s4"))
    assert str(ei2.value) == "the node is full"


async def test_too_many_sessions_at_the_cap() -> None:
    svc, eng, _ = _svc(limits=LimitsConfig(max_sessions=2))
    eng.sessions = 2
    with pytest.raises(TooManySessions) as ei:
        await svc.open_session(SessionIn())
    assert str(ei.value) == (
        "2 sessions are open (limits.max_sessions); close one (DELETE "
        "/v1/sessions/{id}) or retry later"
    )
    assert eng.calls == []
    eng.sessions = 1
    assert (await svc.open_session(SessionIn()))["state"] == "open"


async def test_places_kept_for_other_tenants_and_the_tenants_own_quota() -> None:
    tenants = (
        TenantConfig(name="alice", token="ta", max_sessions=1),
        TenantConfig(name="bob", token="tb", max_sessions=1),
    )
    svc, eng, log = _svc(tenants=tenants, limits=LimitsConfig(max_sessions=3))
    eng.sessions = 2
    with pytest.raises(TooManySessions) as ei:
        await svc.open_session(SessionIn(), tenant="alice")
    assert str(ei.value) == (
        "2 sessions are open and 1 places are kept for tenants below their "
        "max_sessions (limits.max_sessions=3); close one (DELETE "
        "/v1/sessions/{id}) or retry later"
    )
    assert log == [("admit_session", "alice", ())]
    eng.sessions = 1
    log.clear()
    assert await svc.open_session(SessionIn(session_id="sa"), tenant="alice") == {
        "session_id": "sa",
        "state": "open",
    }
    assert log == [("admit_session", "alice", ()), ("own_session", "alice", ("sa",))]
    assert eng.calls[0][2]["owner"] == "alice"
    with pytest.raises(QuotaExceeded):
        await svc.open_session(SessionIn(), tenant="alice")
    # visible to its owner only
    assert await svc.close_session("sa", tenant="bob") is False
    assert ("close_session", "sa") not in eng.calls
    assert await svc.close_session("sa", tenant="alice") is True
    assert eng.calls[-1] == ("close_session", "sa")
    assert await svc.close_session("zz") is True  # (no auth: the engine answers)


async def test_session_demand_checks() -> None:
    svc, eng, _ = _svc()
    with pytest.raises(InvalidAction) as ei:
        await svc.open_session(SessionIn.model_construct(demand={"cpu": -1}))
    assert _refused(ei) == (
        "demand",
        "demand: resource 'cpu' must be a non-negative number, got -1.0",
    )
    with pytest.raises(InvalidAction) as ei:
        await svc.open_session(SessionIn(demand={"gpu": 1}))
    assert _refused(ei) == (
        "demand.gpu",
        "demand.gpu: unknown resource 'gpu' (this cluster's resources: cpu, memory_mb)",
    )
    with pytest.raises(InvalidAction) as ei:
        await svc.open_session(SessionIn(demand={"cpu": 2.5}))
    assert _refused(ei) == (
        "demand",
        "demand: no node can ever satisfy demand {'cpu': 2.5} "
        "(largest capacity: n1: {'cpu': 2.0, 'memory_mb': 4096.0})",
    )
    with pytest.raises(InvalidAction) as ei:
        await svc.open_session(SessionIn(demand={"memory_mb": 0.5}))
    assert _refused(ei) == (
        "demand.memory_mb",
        "demand.memory_mb: a session's sandbox needs at least 1 MiB, got 0.5",
    )
    assert MIN_SESSION_MB == 1.0
    assert eng.calls == []
    for ok in ({"cpu": 2, "memory_mb": 4096}, {"memory_mb": 1}, {"cpu": 1}, {"cpu": 2 + 1e-10}):
        assert (await svc.open_session(SessionIn(demand=ok)))["state"] == "open"
    # no node yet: nothing to check against
    svc2, _, _ = _svc(_Eng(nodes=()))
    assert (await svc2.open_session(SessionIn(demand={"gpu": 9})))["state"] == "open"


async def test_session_demand_names_every_node_up_to_four() -> None:
    nodes = tuple(SimpleNamespace(name=f"n{i}", capacity=Resources(cpu=i + 1)) for i in range(5))
    svc, _, _ = _svc(_Eng(nodes=nodes, dims=frozenset({"cpu"})))
    with pytest.raises(InvalidAction) as ei:
        await svc.open_session(SessionIn(demand={"cpu": 9}))
    assert str(ei.value) == (
        "demand: no node can ever satisfy demand {'cpu': 9.0} (largest "
        "capacity: n0: {'cpu': 1.0}; n1: {'cpu': 2.0}; n2: {'cpu': 3.0}; "
        "n3: {'cpu': 4.0})"
    )
    assert (await svc.open_session(SessionIn(demand={"cpu": 5})))["state"] == "open"


async def test_session_image_checks() -> None:
    svc, eng, _ = _svc()
    with pytest.raises(InvalidAction) as ei:
        await svc.open_session(SessionIn(image="zz"))
    assert _refused(ei) == (
        "image",
        "image: no image 'zz' on any node (POST /v1/images imports one)",
    )
    with pytest.raises(InvalidAction) as ei:
        await svc.open_session(SessionIn(image="$bad"))
    assert ei.value.field == "image" and "not valid" in str(ei.value)
    assert eng.calls == []
    # a tenant's own image is its stored name; another tenant's is no image
    tenants = (TenantConfig(name="alice", token="ta"), TenantConfig(name="bob", token="tb"))
    svc, eng, _ = _svc(tenants=tenants)
    eng.images = {"py", "alice+mine"}
    await svc.open_session(SessionIn(image="mine"), tenant="alice")
    assert eng.calls[0][2]["image"] == "alice+mine"
    with pytest.raises(InvalidAction) as ei:
        await svc.open_session(SessionIn(image="alice+mine"), tenant="bob")
    assert str(ei.value) == (
        "image: no image 'alice+mine' on any node (POST /v1/images imports one)"
    )


# ---- reward compat -------------------------------------------------------------------------------


def _scored(**cfg: Any) -> tuple[Service, _Eng, list[tuple[Any, ...]]]:
    svc, eng, log = _svc(**cfg)
    eng.scores = {"ax": 1.0, "ay": 0.0, "bx": 0.5, "by": 0.25, "simx": 0.75, "simy": 0.5}
    return svc, eng, log


async def test_get_reward_one_model_and_the_default_model() -> None:
    svc, eng, log = _scored(default_reward_model="b")
    assert await svc.get_reward(GetRewardIn(query=["x", "y"], model="a")) == {
        "rewards": [1.0, 0.0],
        "scores": [1.0, 0.0],
    }
    assert await svc.get_reward(GetRewardIn(query=["x", "y"])) == {
        "rewards": [0.5, 0.25],
        "scores": [0.5, 0.25],
    }
    assert [s.model for s in eng.submitted] == ["a", "a", "b", "b"]
    assert log == []


async def test_get_reward_several_models_averages_and_lists_each() -> None:
    svc, eng, log = _scored()
    out = await svc.get_reward(
        GetRewardIn(query=["x", "y"], model=["a", "b"], prompts=["p0", "p1"]), tenant=None
    )
    assert out == {
        "rewards": [0.75, 0.125],
        "scores": [0.75, 0.125],
        "scores_by_model": {"a": [1.0, 0.0], "b": [0.5, 0.25]},
    }
    assert [
        (s.model, s.payload.query, s.payload.prompt, s.payload.reference) for s in eng.submitted
    ] == [
        ("a", "x", "p0", None),
        ("b", "x", "p0", None),
        ("a", "y", "p1", None),
        ("b", "y", "p1", None),
    ]
    out = await svc.get_reward(GetRewardIn(query=["x"], model=["sim"], labels=["L"]))
    assert out == {"rewards": [0.75], "scores": [0.75]}
    assert eng.submitted[-1].payload.reference == "L" and eng.submitted[-1].payload.prompt is None
    assert log == []


async def test_get_reward_refusals() -> None:
    svc, eng, _ = _scored()
    for body, want in [
        (
            GetRewardIn(query=["x"]),
            ("model", "model: no model named and no default reward model configured"),
        ),
        (
            GetRewardIn(query=["x"], model="zz"),
            ("model", "model: unknown model 'zz' (models: a, b, sim)"),
        ),
        (
            GetRewardIn(query=["x"], model=["a", "zz"]),
            ("model", "model: unknown model 'zz' (models: a, b, sim)"),
        ),
        (
            GetRewardIn(query=["x", "y"], model="a", prompts=["p"]),
            ("prompts", "prompts: has 1 items; query has 2"),
        ),
        (
            GetRewardIn(query=["x"], model="a", labels=["l", "m"]),
            ("labels", "labels: has 2 items; query has 1"),
        ),
        (
            GetRewardIn(query=["x"], model=["a", "sim"]),
            (
                "labels",
                "labels: model 'sim' scores similarity to a reference: send one label per query",
            ),
        ),
    ]:
        with pytest.raises(InvalidAction) as ei:
            await svc.get_reward(body)
        assert _refused(ei) == want
    assert eng.submitted == []
    svc0, _, _ = _svc(models=())
    with pytest.raises(InvalidAction) as ei:
        await svc0.get_reward(GetRewardIn(query=["x"], model="a"))
    assert str(ei.value) == "model: unknown model 'a' (models: none configured)"


async def test_score_bounds_failures_and_tenancy() -> None:
    svc, eng, log = _scored(limits=LimitsConfig(max_batch=4))
    reqs = [S.ScoreRequest(query=q) for q in ("x", "y")]
    with pytest.raises(InvalidAction) as ei:
        await svc.score(reqs + reqs[:1], ["a", "b"], field="input")
    assert _refused(ei) == (
        "input",
        "input: 3 items x 2 models = 6 actions, at most 4 per request (limits.max_batch)",
    )
    with pytest.raises(InvalidAction) as ei:
        await svc.score(reqs * 3, ["a"])
    assert ei.value.field == "query"
    assert eng.submitted == []
    assert await svc.score(reqs, ["a", "b"]) == [
        [ScoreResult(model="a", score=1.0), ScoreResult(model="b", score=0.5)],
        [ScoreResult(model="a", score=0.0), ScoreResult(model="b", score=0.25)],
    ]
    assert [c[2] for c in eng.calls if c[0] == "result"] == [None] * 4
    with pytest.raises(BrokenError) as eb:
        await svc.score([S.ScoreRequest(query="x"), S.ScoreRequest(query="fail")], ["a"])
    assert str(eb.value) == "scoring failed: failed: boom"
    with pytest.raises(BrokenError) as eb:
        await svc.score([S.ScoreRequest(query="lost")], ["a"])
    assert str(eb.value) == "scoring failed: lost: "
    assert log == []
    eng.submitted.clear()
    await svc.score(reqs, ["a"], tenant="t1")
    ids = tuple(s.id for s in eng.submitted)
    assert log == [("admit", "t1", ids), ("started", "t1", ids)]


async def test_classify_labels_probs_and_envelope() -> None:
    svc, eng, _ = _scored(default_reward_model="a")
    before = int(time.time())
    out = await svc.classify(ClassifyIn(input=["x", "y"]))
    assert re.fullmatch(r"classify-[0-9a-f]{32}", out.pop("id"))
    assert before <= out.pop("created") <= int(time.time())
    assert out == {
        "object": "list",
        "model": "a",
        "data": [
            {"index": 0, "label": "0", "probs": [1.0], "num_classes": 1},
            {"index": 1, "label": "0", "probs": [0.0], "num_classes": 1},
        ],
        "usage": {"prompt_tokens": 0, "total_tokens": 0, "completion_tokens": 0},
    }
    out = await svc.classify(ClassifyIn(input="x", model="b"))
    assert out["data"] == [{"index": 0, "label": "0", "probs": [0.5], "num_classes": 1}]
    assert eng.submitted[-1].payload.query == "x" and eng.submitted[-1].model == "b"

    async def probs(aid: str, wait: float | None = None) -> Any:
        return ActionResult(
            aid,
            Status.SUCCEEDED,
            0.0,
            output=ScoreResult(model="a", score=0.2, probs=(0.2, 0.5, 0.3)),
        )

    eng.result = probs  # type: ignore[method-assign]
    out = await svc.classify(ClassifyIn(input="x", model="a"))
    assert out["data"] == [{"index": 0, "label": "1", "probs": [0.2, 0.5, 0.3], "num_classes": 3}]


async def test_classify_refusals() -> None:
    svc, eng, _ = _scored()
    with pytest.raises(InvalidAction) as ei:
        await svc.classify(ClassifyIn(input="x", model="sim"))
    assert _refused(ei) == (
        "model",
        "model: 'sim' is a similarity model; /classify needs a classifier (scalar) or judge model",
    )
    with pytest.raises(InvalidAction) as ei:
        await svc.classify(ClassifyIn(input=[], model="a"))
    assert _refused(ei) == ("input", "input: must not be empty")
    svc, eng, _ = _scored(limits=LimitsConfig(max_batch=1))
    with pytest.raises(InvalidAction) as ei:
        await svc.classify(ClassifyIn(input=["x", "y"], model="a"))
    assert ei.value.field == "input"
    assert eng.submitted == []


# ---- native: results, waits, cancels, groups -------------------------------------------------


def _res(aid: str, status: Status = Status.SUCCEEDED, out: Any = None) -> ActionResult:
    return ActionResult(aid, status, 1.0, 2.0, 3.0, "n1", None, out, "")


async def test_get_clamps_the_wait_and_answers_pending_or_the_result() -> None:
    svc, eng, _ = _svc(limits=LimitsConfig(max_wait_s=20))
    eng.statuses["p"] = Status.RUNNING
    assert await svc.get("p", -5) == {
        "id": "p",
        "status": "running",
        "finished": False,
        "output": None,
        "reason": "",
    }
    await svc.get("p", 1e9)
    await svc.get("p", 3.5)
    await svc.get("p")
    assert [c[2] for c in eng.calls] == [0.0, 20.0, 3.5, 0.0]
    eng.results["d"] = _res("d", out={"k": 1})
    got = await svc.get("d")
    assert (got["id"], got["status"], got["finished"], got["output"]) == (
        "d",
        "succeeded",
        True,
        {"k": 1},
    )
    # another tenant's id is unknown
    with pytest.raises(UnknownAction):
        await svc.get("d", tenant="t1")


async def test_a_group_is_joined_pending_at_its_least_status_and_cancelled_part_by_part() -> None:
    svc, eng, _ = _svc()
    svc._remember_group("g", ("g.a", "g.b"))
    eng.statuses.update({"g.a": Status.RUNNING, "g.b": Status.RUNNING})
    eng.results["g.a"] = _res("g.a", out=ScoreResult(model="a", score=1.0))
    assert await svc.result("g") is None
    assert (await svc.get("g"))["status"] == "running"  # (not the group id's own: queued)
    eng.statuses["g.b"] = Status.QUEUED
    assert (await svc.get("g"))["status"] == "queued"
    eng.results["g.b"] = _res("g.b", Status.FAILED)
    r = await svc.result("g", 2.0)
    assert r is not None and (r.id, r.status) == ("g", Status.FAILED)
    assert ("result", "g.b", 2.0) in eng.calls
    eng.calls.clear()
    assert await svc.cancel("g") is False
    assert eng.calls == [("cancel", "g.a"), ("cancel", "g.b")]
    svc._remember_group("h", ("h.no", "h.yes"))
    assert await svc.cancel("h") is True
    eng.calls.clear()
    assert await svc.cancel("solo-yes") is True and await svc.cancel("solo") is False
    assert eng.calls == [("cancel", "solo-yes"), ("cancel", "solo")]
    with pytest.raises(UnknownAction):
        await svc.cancel("solo", tenant="t1")


async def test_groups_are_kept_up_to_max_results() -> None:
    svc, _, _ = _svc(limits=LimitsConfig(max_results=2))
    for g in ("g1", "g2", "g3"):
        svc._remember_group(g, (f"{g}.a",))
    assert list(svc._groups) == ["g2", "g3"]


async def test_a_routed_result_is_the_local_answer_under_the_searchs_id() -> None:
    svc, eng, _ = _svc()
    svc._routes["s1"] = ({"route": "local"}, "loc1", None)
    svc._routes["s2"] = ({"route": "provider"}, None, None)
    assert await svc.result("s1") is None
    eng.results["loc1"] = _res("loc1", out={"hits": []})
    r = await svc.result("s1", 1.5)
    assert r is not None and r.id == "s1" and r.output == {"hits": []}
    assert ("result", "loc1", 1.5) in eng.calls
    got = await svc.get("s1")
    assert (got["id"], got["route"], got["output"]) == ("s1", "local", {"hits": []})
    eng.results["s2"] = _res("s2", out={"hits": [1]})
    got = await svc.get("s2")
    assert (got["id"], got["route"], got["output"]) == ("s2", "provider", {"hits": [1]})


def _body(*actions: dict[str, Any], **kw: Any) -> ActionsIn:
    return ActionsIn.model_validate({"actions": list(actions), **kw})


async def test_submit_fans_out_models_into_a_group_and_waits_for_results() -> None:
    svc, eng, log = _svc()
    out = await svc.submit(
        _body(
            {"id": "g1", "kind": "reward", "models": ["a", "b"], "payload": {"query": "q"}},
            {"id": "c1", "kind": "code", "payload": {"code": "x"}},
        )
    )
    assert out == {"ids": ["g1", "c1"]}
    assert eng.calls == [("submit", ["g1.a", "g1.b", "c1"], None)]
    assert svc._groups["g1"] == ("g1.a", "g1.b")
    assert log == []
    eng.results["c2"] = _res("c2", out={"ok": 1})
    eng.calls.clear()
    out = await svc.submit(_body({"id": "c2", "kind": "code", "payload": {}}, wait=True, wait_s=4))
    assert out["ids"] == ["c2"] and [r["output"] for r in out["results"]] == [{"ok": 1}]
    assert eng.calls[-1] == ("result", "c2", 4.0)


async def test_submit_as_a_tenant_owns_each_id_and_group() -> None:
    svc, eng, log = _svc(tenants=(TenantConfig(name="t1", token="k"),))
    out = await svc.submit(
        _body(
            {"id": "g1", "kind": "reward", "models": ["a", "b"], "payload": {"query": "q"}},
            {"id": "c1", "kind": "code", "payload": {}},
        ),
        idempotency_key="K",
        tenant="t1",
    )
    assert out == {"ids": ["g1", "c1"]}
    assert eng.calls == [("submit", ["g1.a", "g1.b", "c1"], "t1\x1fK")]
    ids = ("g1.a", "g1.b", "c1")
    assert log == [
        ("admit", "t1", ids),
        ("own", "t1", ids),
        ("started", "t1", ids),
        ("own", "t1", ("g1",)),
    ]
    assert svc.tenancy.owner("g1") == "t1" and svc.tenancy.owner("c1") == "t1"
    # the group id is the tenant's: another tenant may not take it, nor a plain action
    with pytest.raises(InvalidAction) as ei:
        await svc.submit(
            _body({"id": "g1", "kind": "reward", "models": ["a", "b"], "payload": {"query": "q"}}),
            tenant="t2",
        )
    assert _refused(ei) == ("actions[0].id", "actions[0].id: duplicate action id 'g1'")
    with pytest.raises(InvalidAction) as ei:
        await svc.submit(
            _body({"kind": "code", "payload": {}}, {"id": "g1", "kind": "code", "payload": {}}),
            tenant="t1",
        )
    assert _refused(ei) == ("actions[1].id", "actions[1].id: duplicate action id 'g1'")


async def test_a_group_id_an_action_holds_is_refused() -> None:
    svc, eng, _ = _svc()
    eng.known.add("taken")
    with pytest.raises(InvalidAction) as ei:
        await svc.submit(
            _body(
                {"id": "taken", "kind": "reward", "models": ["a", "b"], "payload": {"query": "q"}}
            )
        )
    assert _refused(ei) == ("actions[0].id", "actions[0].id: duplicate action id 'taken'")
    assert svc._engine_knows("taken") is True and svc._engine_knows("free") is False
    await svc.submit(
        _body({"id": "free", "kind": "reward", "models": ["a", "b"], "payload": {"query": "q"}})
    )
    assert svc._groups["free"] == ("free.a", "free.b")


async def test_submit_refusals_name_the_field() -> None:
    svc, eng, _ = _svc(limits=LimitsConfig(max_batch=2))
    code = {"kind": "code", "payload": {}}
    for body, want in [
        (_body(code, code, code), ("actions", "actions: at most 2 per request")),
        (
            _body(code, {"kind": "reward", "model": "zz", "payload": {"query": "q"}}),
            ("actions[1].model", "actions[1].model: unknown model 'zz' (models: a, b, sim)"),
        ),
        (
            _body({"kind": "code", "session": "s9", "payload": {}}),
            ("actions[0].session", "actions[0].session: session 's9' is not open"),
        ),
        (
            _body({"kind": "code", "demand": {"cpu": 1, "gpu": 1}, "payload": {}}),
            (
                "actions[0].demand.gpu",
                "actions[0].demand.gpu: unknown resource 'gpu' (this "
                "cluster's resources: cpu, memory_mb)",
            ),
        ),
    ]:
        with pytest.raises(InvalidAction) as ei:
            await svc.submit(body)
        assert _refused(ei) == want
    svc0, _, _ = _svc(models=())
    with pytest.raises(InvalidAction) as ei:
        await svc0.submit(_body({"kind": "reward", "model": "zz", "payload": {"query": "q"}}))
    assert str(ei.value) == "actions[0].model: unknown model 'zz' (models: none configured)"
    assert eng.submitted == []
    eng.live_sessions.add("s9")
    assert (await svc.submit(_body({"kind": "code", "session": "s9", "payload": {}})))["ids"]


async def test_resources_are_read_again_only_for_an_unknown_key() -> None:
    svc, eng, _ = _svc()
    code = {"kind": "code", "demand": {"cpu": 1, "memory_mb": 8}, "payload": {}}
    await svc.submit(_body(code))
    n = eng.views
    assert n >= 1
    await svc.submit(_body(code, code))
    assert eng.views == n
    eng.dims_ = frozenset({"cpu", "memory_mb", "gpu"})  # (a node joined)
    await svc.submit(_body({"kind": "code", "demand": {"gpu": 1}, "payload": {}}))
    assert eng.views == n + 1
    svc2, eng2, _ = _svc(_Eng(dims=frozenset()))  # (no node yet: nothing to check)
    await svc2.submit(_body({"kind": "code", "demand": {"gpu": 1}, "payload": {}}))
    assert eng2.submitted


async def test_the_same_key_with_another_body_is_refused_until_it_expires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(S, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time))
    svc, eng, _ = _svc()
    eng.config.idempotency_ttl_s = 10.0
    a = {"kind": "code", "payload": {"code": "A"}}
    b = {"kind": "code", "payload": {"code": "B"}}
    await svc.submit(_body(a), idempotency_key="K")
    await svc.submit(_body(a, wait=False), idempotency_key="K")  # (the same again: fine)
    clock[0] = 1009.9
    with pytest.raises(KeyReused) as ei:
        await svc.submit(_body(b), idempotency_key="K")
    assert str(ei.value) == (
        "idempotency_key: 'K' was used with another body; a retry must "
        "send the same actions (use a new key for new actions)"
    )
    with pytest.raises(KeyReused):
        await svc.submit(_body(b, idempotency_key="K"))  # (the body's own key)
    clock[0] = 1010.0  # (its ttl passed: the key is new again)
    await svc.submit(_body(b), idempotency_key="K")
    assert list(svc._idem_bodies) == ["K"] and svc._idem_bodies["K"][1] == 1010.0


async def test_keys_are_kept_at_most_four_times_max_results() -> None:
    svc, _, _ = _svc(limits=LimitsConfig(max_results=1))
    a = {"kind": "code", "payload": {"code": "A"}}
    for k in ("K1", "K2", "K3", "K4", "K5"):
        await svc.submit(_body(a), idempotency_key=k)
    assert list(svc._idem_bodies) == ["K1", "K2", "K3", "K4", "K5"]
    await svc.submit(_body(a), idempotency_key="K6")
    assert list(svc._idem_bodies) == ["K2", "K3", "K4", "K5", "K6"]
    # a body that does not serialise as JSON is compared by its repr
    body = _body(a)
    svc._check_key("K7", body)
    body.actions[0].payload["x"] = object()
    canon = repr(body.actions)
    svc._check_key("K8", body)
    import hashlib

    assert svc._idem_bodies["K8"][0] == hashlib.sha256(canon.encode()).hexdigest()


async def test_own_image_is_the_tenants_stored_name() -> None:
    tenants = (TenantConfig(name="alice", token="ta"), TenantConfig(name="bob", token="tb"))
    svc, eng, _ = _svc(tenants=tenants, token="td")
    eng.images = {"py", "alice+mine"}
    payload = {"image": "mine", "code": "x"}
    out = await svc.submit(_body({"id": "c1", "kind": "code", "payload": payload}), tenant="alice")
    assert out == {"ids": ["c1"]}
    assert eng.submitted[0].payload["image"] == "alice+mine"
    assert payload["image"] == "mine"
    await svc.submit(
        _body({"id": "c2", "kind": "code", "payload": {"image": "py"}}), tenant="alice"
    )
    assert eng.submitted[1].payload["image"] == "py"
    await svc.submit(_body({"id": "c3", "kind": "code", "payload": {"image": 3}}), tenant="alice")
    assert eng.submitted[2].payload["image"] == 3
    with pytest.raises(InvalidAction) as ei:
        await svc.submit(
            _body({"kind": "code", "payload": {"image": "alice+mine"}}), tenant="default"
        )
    assert _refused(ei) == (
        "actions[0].payload.image",
        "actions[0].payload.image: no image 'alice+mine' on any node",
    )
    # without a tenant the name is used as it is
    await svc.submit(_body({"id": "c4", "kind": "code", "payload": {"image": "mine"}}))
    assert eng.submitted[3].payload["image"] == "mine"


# ---- /run_code over a real engine --------------------------------------------------------------


class _Hang(FakeExecutor):
    async def _run(self, c: Any) -> None:
        a = c.action
        if getattr(a.payload, "code", None) == "hang":
            import time as _t

            from arl_tangram.core import events as E

            assert self.emit is not None
            self.emit(E.ActionStarted(_t.monotonic(), a.id, c.node))
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                self.emit(
                    E.ActionFinished(_t.monotonic(), a.id, Status.CANCELLED, None, "cancelled")
                )
                raise
            return
        await super()._run(c)


@pytest.fixture
async def real():
    ex = _Hang(cpu=4)
    eng = Engine(ex, EngineConfig(tick_s=0.05), core_factory=core_factory)
    await eng.start()
    yield eng, ex
    await eng.aclose()


def _started(ex: Any) -> list[str]:
    from arl_tangram.core import commands as C

    return [c.action.id for c in ex.commands if isinstance(c, C.StartAction)]


async def test_run_code_shed_past_its_deadline_cancels_the_action(real: Any) -> None:
    eng, ex = real
    svc = Service(eng, ServiceConfig(limits=LimitsConfig(shed_grace_s=0.05)))
    with pytest.raises(Shed) as ei:
        await svc.run_code(RunCodeRequest(code="hang", compile_timeout=0.1, run_timeout=0.15))
    assert str(ei.value) == ("no answer within compile_timeout + run_timeout + 0.05 s = 0.3 s")
    (aid,) = _started(ex)
    r = await eng.result(aid, wait=5)
    assert r is not None and r.status == Status.CANCELLED


async def test_run_code_cancelled_by_its_client_cancels_the_action(real: Any) -> None:
    eng, ex = real
    svc = Service(eng, ServiceConfig())
    task = asyncio.ensure_future(svc.run_code(RunCodeRequest(code="hang")))
    for _ in range(200):
        if _started(ex):
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (aid,) = _started(ex)
    r = await eng.result(aid, wait=5)
    assert r is not None and r.status == Status.CANCELLED


async def test_run_code_answers_and_tells_the_tenancy(real: Any) -> None:
    eng, ex = real
    svc, _, log = _svc(eng, models=())
    out = await svc.run_code(RunCodeRequest(code="x"))
    assert set(out) >= {"status", "run_result"}
    assert log == []
    await svc.run_code(RunCodeRequest(code="y"), tenant="t1")
    aid = _started(ex)[-1]
    assert log == [("admit", "t1", (aid,)), ("started", "t1", (aid,))]


async def test_a_session_gone_is_named_with_its_reason_to_its_owner_only() -> None:
    tenants = (TenantConfig(name="alice", token="ta"), TenantConfig(name="bob", token="tb"))
    svc, eng, _ = _svc(tenants=tenants)
    await svc.open_session(SessionIn(session_id="s1"), tenant="alice")
    code = {"kind": "code", "session": "s1", "payload": {}}
    with pytest.raises(InvalidAction) as ei:  # (open, but another tenant's)
        await svc.submit(_body(code), tenant="bob")
    assert _refused(ei) == ("actions[0].session", "actions[0].session: session 's1' is not open")
    assert (await svc.submit(_body(code), tenant="alice"))["ids"]
    eng.live_sessions.discard("s1")
    eng.gone.add("s1")
    svc.tenancy._gone("s1", "ttl")
    with pytest.raises(InvalidAction) as ei:
        await svc.submit(_body(code), tenant="alice")
    assert _refused(ei) == (
        "actions[0].session",
        "actions[0].session: session 's1' was closed: its ttl_s passed",
    )
    with pytest.raises(InvalidAction) as ei:
        await svc.submit(_body(code), tenant="bob")
    assert str(ei.value) == "actions[0].session: session 's1' is not open"
    with pytest.raises(InvalidAction) as ei:  # (no auth: every session is everyone's)
        await svc.submit(_body(code))
    assert str(ei.value) == "actions[0].session: session 's1' was closed: its ttl_s passed"


# ---- the survivors of the first mutmut run, by behaviour ------------------------------------------


async def test_result_waits_zero_by_default() -> None:
    svc, eng, _ = _svc()
    assert await svc.result("x") is None
    assert eng.calls == [("result", "x", 0.0)]


async def test_a_tenants_own_action_is_read_and_cancelled() -> None:
    svc, eng, _ = _svc(tenants=(TenantConfig(name="t1", token="k"),))
    out = await svc.submit(_body({"id": "a1yes", "kind": "code", "payload": {}}), tenant="t1")
    assert out == {"ids": ["a1yes"]}
    eng.statuses["a1yes"] = Status.RUNNING
    assert (await svc.get("a1yes", tenant="t1"))["status"] == "running"
    assert await svc.cancel("a1yes", tenant="t1") is True
    for call in (svc.get("a1yes", tenant="t2"), svc.cancel("a1yes", tenant="t2")):
        with pytest.raises(UnknownAction):
            await call


async def test_a_tenant_sends_its_own_group_again_and_another_may_not() -> None:
    svc, _, _ = _svc(
        tenants=(TenantConfig(name="t1", token="k1"), TenantConfig(name="t2", token="k2"))
    )
    g = {"id": "g1", "kind": "reward", "models": ["a", "b"], "payload": {"query": "q"}}
    await svc.submit(_body(g), tenant="t1")
    assert (await svc.submit(_body(g), tenant="t1")) == {"ids": ["g1"]}  # (the engine's to answer)
    with pytest.raises(InvalidAction) as ei:
        await svc.submit(_body(g), tenant="t2")
    assert _refused(ei) == ("actions[0].id", "actions[0].id: duplicate action id 'g1'")
    # the group forgotten by the service, its owner still known: still the owner's
    svc._groups.clear()
    with pytest.raises(InvalidAction):
        await svc.submit(_body(g), tenant="t2")
    assert (await svc.submit(_body(g), tenant="t1")) == {"ids": ["g1"]}


async def test_an_open_session_the_engine_lost_before_its_tenancy_knew_names_the_reason() -> None:
    svc, eng, _ = _svc(tenants=(TenantConfig(name="alice", token="ta"),))
    await svc.open_session(SessionIn(session_id="s1"), tenant="alice")
    eng.live_sessions.discard("s1")  # (gone from the engine; the tenancy not told yet)
    eng.gone.add("s1")
    with pytest.raises(InvalidAction) as ei:
        await svc.submit(_body({"kind": "code", "session": "s1", "payload": {}}), tenant="alice")
    assert str(ei.value) == "actions[0].session: session 's1' was closed: its ttl_s passed"


async def test_a_key_sent_again_with_its_payloads_keys_reordered_is_the_same_body() -> None:
    svc, _, _ = _svc()
    await svc.submit(_body({"kind": "code", "payload": {"a": 1, "b": 2}}), idempotency_key="K")
    await svc.submit(_body({"kind": "code", "payload": {"b": 2, "a": 1}}), idempotency_key="K")
    with pytest.raises(KeyReused):
        await svc.submit(_body({"kind": "code", "payload": {"b": 2, "a": 3}}), idempotency_key="K")


async def test_a_body_compared_by_its_repr_may_hold_a_lone_surrogate() -> None:
    import hashlib

    svc, _, _ = _svc()
    body = _body({"kind": "code", "payload": {"s": "\ud800"}})
    body.actions[0].payload["x"] = object()  # (not JSON: compared by its repr)
    svc._check_key("K", body)
    canon = repr(body.actions).encode("utf-8", "surrogatepass")
    assert svc._idem_bodies["K"][0] == hashlib.sha256(canon).hexdigest()
    svc._check_key("K", body)  # (the same body again: fine)


async def test_an_engine_config_without_a_key_ttl_keeps_keys_an_hour(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [0.0]
    monkeypatch.setattr(S, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time))
    svc, eng, _ = _svc()
    eng.config = SimpleNamespace()
    a, b = {"kind": "code", "payload": {"code": "A"}}, {"kind": "code", "payload": {"code": "B"}}
    await svc.submit(_body(a), idempotency_key="K")
    clock[0] = 3599.9
    with pytest.raises(KeyReused):
        await svc.submit(_body(b), idempotency_key="K")
    clock[0] = 3600.0
    await svc.submit(_body(b), idempotency_key="K")


async def test_a_demand_at_a_nodes_capacity_plus_the_tolerance_fits() -> None:
    svc, _, _ = _svc()
    assert (await svc.open_session(SessionIn(demand={"cpu": 2.0 + 1e-9})))["state"] == "open"


async def test_a_node_without_a_resource_has_none_of_it() -> None:
    nodes = (
        SimpleNamespace(name="n1", capacity=Resources(cpu=2)),
        SimpleNamespace(name="n2", capacity=Resources(cpu=1, gpu=1)),
    )
    svc, _, _ = _svc(_Eng(nodes=nodes, dims=frozenset({"cpu", "gpu"})))
    with pytest.raises(InvalidAction) as ei:
        await svc.open_session(SessionIn(demand={"cpu": 2, "gpu": 0.5}))
    assert str(ei.value) == (
        "demand: no node can ever satisfy demand {'cpu': 2.0, 'gpu': 0.5} "
        "(largest capacity: n1: {'cpu': 2.0}; n2: {'cpu': 1.0, 'gpu': 1.0})"
    )
    assert (await svc.open_session(SessionIn(demand={"cpu": 2, "gpu": 0})))["state"] == "open"


async def test_another_tenants_image_is_refused_even_without_an_image_cache() -> None:
    svc, eng, _ = _svc(tenants=(TenantConfig(name="alice", token="ta"),), token="td")
    eng.images = None
    with pytest.raises(InvalidAction) as ei:
        await svc.open_session(SessionIn(image="alice+mine"), tenant="default")
    assert str(ei.value) == (
        "image: no image 'alice+mine' on any node (POST /v1/images imports one)"
    )
    assert eng.calls == []
    # (an executor without a cache cannot say: the name is taken as it is)
    await svc.open_session(SessionIn(image="py"), tenant="default")
    assert eng.calls[0][2]["image"] == "py"


async def test_reward_routes_charge_the_tenant() -> None:
    svc, eng, log = _scored(tenants=(TenantConfig(name="t1", token="k"),))
    await svc.get_reward(GetRewardIn(query=["x"], model="a"), tenant="t1")
    await svc.classify(ClassifyIn(input="x", model="b"), tenant="t1")
    ids = [s.id for s in eng.submitted]
    assert log == [
        ("admit", "t1", (ids[0],)),
        ("started", "t1", (ids[0],)),
        ("admit", "t1", (ids[1],)),
        ("started", "t1", (ids[1],)),
    ]


async def test_classify_one_string_is_one_input_and_an_unknown_model_names_model() -> None:
    svc, eng, _ = _scored()
    eng.scores["axy"] = 0.5
    out = await svc.classify(ClassifyIn(input="xy", model="a"))
    assert out["data"] == [{"index": 0, "label": "0", "probs": [0.5], "num_classes": 1}]
    with pytest.raises(InvalidAction) as ei:
        await svc.classify(ClassifyIn(input="x", model="zz"))
    assert _refused(ei) == ("model", "model: unknown model 'zz' (models: a, b, sim)")


def test_own_image_replaces_a_typed_code_requests_image_only() -> None:
    from arl_tangram.kinds import CodeRequest

    svc, eng, _ = _svc(tenants=(TenantConfig(name="alice", token="ta"),))
    eng.images = {"alice+mine"}
    req = CodeRequest(code="print(1)", image="mine")
    spec = S.ActionSpec(id="c1", kind=ActionKind.CODE, payload=req)
    out = svc._own_image(spec, "w", "alice")
    assert out.payload == CodeRequest(code="print(1)", image="alice+mine")
    assert isinstance(out.payload, CodeRequest)
    assert (out.id, out.kind) == ("c1", ActionKind.CODE)
    assert req.image == "mine" and spec.payload is req


# ---- searches routed local first (`search.route_action`, here scripted) ---------------------------


@pytest.fixture
def routes(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``search.provider_action`` as the identity (the payload without its source) and
    ``search.route_action`` answering ``plan[query]``: "local" (the local index's result),
    "web" (routed to the provider) or absent (no route: {})."""
    from arl_tangram.api import search

    st: dict[str, Any] = {"plan": {}, "calls": [], "provider": []}

    def provider_action(engine: Any, spec: Any, where: str, tenant: str | None) -> Any:
        assert isinstance(engine, _Eng)
        st["provider"].append((spec.id, where, tenant))
        p = {k: v for k, v in spec.payload.items() if k != "source"}
        return S.dataclasses.replace(spec, payload=p)

    async def route_action(engine: Any, spec: Any, where: str, source: Any = "auto") -> Any:
        assert isinstance(engine, _Eng)
        st["calls"].append((spec.id, where, source))
        how = st["plan"].get(spec.payload["query"])
        fields = {"route": how, "route_reason": f"why {how}", "local_score": 0.5}
        if how == "local":
            return _res(f"loc-{spec.id}", out={"hits": ["h"]}), fields
        if how == "web":
            return None, fields
        return None, {}

    monkeypatch.setattr(search, "provider_action", provider_action)
    monkeypatch.setattr(search, "route_action", route_action)
    return st


def _search(aid: str, query: str, **payload: Any) -> dict[str, Any]:
    return {"id": aid, "kind": "search", "payload": {"query": query, **payload}}


async def test_a_search_the_local_index_answers_is_not_submitted(routes: dict[str, Any]) -> None:
    svc, eng, _ = _svc()
    routes["plan"] = {"q1": "local", "q2": "web"}
    out = await svc.submit(
        _body(
            {"id": "c1", "kind": "code", "payload": {}},
            _search("s3", "q3"),
            _search("s1", "q1", source="local"),
            _search("s2", "q2"),
        )
    )
    assert out == {"ids": ["c1", "s3", "s1", "s2"]}
    assert routes["calls"] == [
        ("s3", "actions[1]", "auto"),
        ("s1", "actions[2]", "local"),
        ("s2", "actions[3]", "auto"),
    ]
    assert routes["provider"] == [
        ("s3", "actions[1]", None),
        ("s1", "actions[2]", None),
        ("s2", "actions[3]", None),
    ]
    assert eng.calls == [("submit", ["c1", "s3", "s2"], None)]
    assert svc._routes["s1"] == (
        {"route": "local", "route_reason": "why local", "local_score": 0.5},
        "loc-s1",
        None,
    )
    assert svc._routes["s2"] == (
        {"route": "web", "route_reason": "why web", "local_score": 0.5},
        None,
        None,
    )
    assert "s3" not in svc._routes
    eng.results["loc-s1"] = _res("loc-s1", out={"hits": ["h"]})
    got = await svc.get("s1")
    assert (got["id"], got["route"], got["route_reason"], got["output"]) == (
        "s1",
        "local",
        "why local",
        {"hits": ["h"]},
    )


async def test_a_routed_search_again_is_a_retry_with_its_key_else_a_duplicate(
    routes: dict[str, Any],
) -> None:
    svc, eng, log = _svc(
        tenants=(TenantConfig(name="t1", token="k1"), TenantConfig(name="t2", token="k2"))
    )
    routes["plan"] = {"q1": "local", "q2": "web"}
    body = _body(_search("s1", "q1"), _search("s2", "q2"), _search("s5", "q5"))
    assert (await svc.submit(body, idempotency_key="K", tenant="t1")) == {"ids": ["s1", "s2", "s5"]}
    assert eng.calls == [("submit", ["s2", "s5"], "t1\x1fK")]
    assert ("own", "t1", ("s1",)) in log
    assert routes["provider"] == [
        ("s1", "actions[0]", "t1"),
        ("s2", "actions[1]", "t1"),
        ("s5", "actions[2]", "t1"),
    ]
    assert svc.tenancy.owner("s1") == "t1"
    n = len(routes["calls"])
    # the same key again: routed as before (the local answer again, the web one to the engine)
    assert (await svc.submit(body, idempotency_key="K", tenant="t1")) == {"ids": ["s1", "s2", "s5"]}
    assert routes["calls"][n:] == [("s5", "actions[2]", "auto")]  # (it had no route)
    assert eng.calls[-1] == ("submit", ["s2", "s5"], "t1\x1fK")
    for key in (None, "other"):
        with pytest.raises(InvalidAction) as ei:
            await svc.submit(_body(_search("s1", "q1")), idempotency_key=key, tenant="t1")
        assert _refused(ei) == ("actions[0].id", "actions[0].id: duplicate action id 's1'")
    with pytest.raises(InvalidAction) as ei:
        await svc.submit(
            _body(_search("x", "q9"), _search("s2", "q2")), idempotency_key="K2", tenant="t1"
        )
    assert _refused(ei) == ("actions[1].id", "actions[1].id: duplicate action id 's2'")
    # another tenant may not take a routed search's id, not even for a plain action
    with pytest.raises(InvalidAction) as ei:
        await svc.submit(_body({"id": "s1", "kind": "code", "payload": {}}), tenant="t2")
    assert _refused(ei) == ("actions[0].id", "actions[0].id: duplicate action id 's1'")


async def test_only_a_search_has_a_route(routes: dict[str, Any]) -> None:
    svc, eng, _ = _svc()
    with pytest.raises(InvalidAction) as ei:
        await svc.submit(
            _body(
                {"kind": "code", "payload": {}},
                {"kind": "fetch", "payload": {"url": "u", "source": "web"}},
            )
        )
    assert _refused(ei) == (
        "actions[1].payload.source",
        "actions[1].payload.source: only a search has a route",
    )
    assert eng.submitted == [] and routes["calls"] == []
    await svc.submit(_body({"kind": "fetch", "payload": {"url": "u"}}))
    assert len(eng.submitted) == 1 and routes["calls"] == []


async def test_routes_are_kept_up_to_max_results(routes: dict[str, Any]) -> None:
    svc, _, _ = _svc(limits=LimitsConfig(max_results=2))
    routes["plan"] = {"q": "web"}
    for i in range(3):
        await svc.submit(_body(_search(f"s{i}", "q")))
    assert list(svc._routes) == ["s1", "s2"]


async def test_run_code_in_a_session_and_a_cancel_that_fails_on_the_way_out() -> None:
    svc, eng, _ = _svc(limits=LimitsConfig(shed_grace_s=0.01))
    with pytest.raises(Shed):
        await svc.run_code(
            RunCodeRequest(code="x", compile_timeout=0.01, run_timeout=0.01), session="s7"
        )
    assert eng.submitted[0].session == "s7" and eng.submitted[0].kind == ActionKind.CODE
    assert [c for c in eng.calls if c[0] != "submit"] == [
        ("result", eng.submitted[0].id, 0.01 + 0.01 + 0.01),
        ("cancel", eng.submitted[0].id),
    ]

    started = asyncio.Event()

    async def hang(aid: str, wait: float | None = None) -> Any:
        started.set()
        await asyncio.sleep(60)

    async def closed(aid: str) -> bool:
        from arl_tangram.core.errors import ClosedError

        raise ClosedError("the engine is closing")

    eng.result, eng.cancel = hang, closed  # type: ignore[method-assign]
    task = asyncio.ensure_future(svc.run_code(RunCodeRequest(code="y")))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_native_actions_are_read_with_their_index_and_the_default_model() -> None:
    svc, eng, _ = _svc(default_reward_model="b")
    with pytest.raises(InvalidAction) as ei:
        await svc.submit(
            _body({"kind": "code", "payload": {}}, {"kind": "code", "model": "a", "payload": {}})
        )
    assert _refused(ei) == ("actions[1].model", "actions[1].model: a code action takes no model")
    await svc.submit(_body({"kind": "reward", "payload": {"query": "q"}}))
    assert eng.submitted[-1].model == "b"


async def test_a_judge_payloads_refusal_keeps_its_whole_message() -> None:
    svc, _, _ = _svc(models=(ModelSpec("gj", kind="genjudge", path="/nowhere"),))
    bad = {"openai": {"route": "completions", "body": {"prompt": "x", "max_tokens": "a: b"}}}
    with pytest.raises(InvalidAction) as ei:
        await svc.submit(
            _body({"kind": "code", "payload": {}}, {"kind": "judge", "model": "gj", "payload": bad})
        )
    assert _refused(ei) == (
        "actions[1].payload.openai.body.max_tokens",
        "actions[1].payload.openai.body.max_tokens: must be an integer >= 1, got 'a: b'",
    )


async def test_a_groups_id_is_cut_by_its_first_models_name() -> None:
    svc, _, _ = _svc()
    out = await svc.submit(
        _body({"id": "g2", "kind": "reward", "models": ["sim", "a"], "payload": {"query": "q"}})
    )
    assert out == {"ids": ["g2"]}
    assert svc._groups["g2"] == ("g2.sim", "g2.a")


async def test_a_judge_payloads_unknown_key_with_a_space_is_named_whole() -> None:
    svc, _, _ = _svc(models=(ModelSpec("gj", kind="genjudge", path="/nowhere"),))
    body = {"prompt": "x", "max_tokens": 5, "a b": 1}
    with pytest.raises(InvalidAction) as ei:
        await svc.submit(
            _body(
                {
                    "kind": "judge",
                    "model": "gj",
                    "payload": {"openai": {"route": "completions", "body": body}},
                }
            )
        )
    field, msg = _refused(ei)
    assert field == "actions[0].payload.openai.body.a b"
    assert msg.startswith("actions[0].payload.openai.body.a b: not a field this route passes on (")


async def test_a_nan_and_a_null_in_a_payload_are_two_bodies_for_a_key() -> None:
    # (a defect this file found, fixed: the digest was of the JSON-mode dump, where NaN is null)
    svc, _, _ = _svc()
    await svc.submit(_body({"kind": "code", "payload": {"a": float("nan")}}), idempotency_key="K")
    # (the same body again: NaN is spelled alike both times, not a KeyReused)
    await svc.submit(_body({"kind": "code", "payload": {"a": float("nan")}}), idempotency_key="K")
    with pytest.raises(KeyReused):
        await svc.submit(_body({"kind": "code", "payload": {"a": None}}), idempotency_key="K")


async def test_fanned_out_models_count_against_the_batch() -> None:
    svc, eng, _ = _svc(limits=LimitsConfig(max_batch=4))
    one = {"kind": "reward", "models": ["a", "b"], "payload": {"query": "q"}}
    with pytest.raises(InvalidAction) as ei:
        await svc.submit(_body(one, one, one))
    assert _refused(ei) == (
        "actions",
        "actions: 6 actions with their models fanned out, at most 4 per request",
    )
    assert eng.submitted == []
    await svc.submit(_body(one, one))  # (4: at the bound)
    assert len(eng.submitted) == 4


async def test_a_judge_actions_payload_is_typed_before_it_is_submitted() -> None:
    from arl_tangram.kinds import JudgeRequest

    svc, eng, _ = _svc(models=(ModelSpec("gj", kind="genjudge", path="/nowhere"),))
    await svc.submit(
        _body({"id": "j1", "kind": "judge", "model": "gj", "payload": {"query": "is it?"}})
    )
    (spec,) = eng.submitted
    assert (spec.id, spec.model) == ("j1", "gj")
    assert isinstance(spec.payload, JudgeRequest) and spec.payload.query == "is it?"
