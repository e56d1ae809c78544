"""The real replay's driver, exact (issue 43 item 2): `replay/driver.py` over a recording
backend (no engine, no sandbox, no model): the payload each action becomes, the report's
figures and its --json form, the closed loop's waits, sessions, counts and step times, the CPU
meter, and the settings the core is built with.
"""

from __future__ import annotations

import asyncio
import io
import os
from types import SimpleNamespace
from typing import Any

import pytest

from arl_tangram.core.actions import ActionKind, Elasticity, Speedup, WorkHints
from arl_tangram.core.cluster import ClusterSpec, ModelSpec, NodeSpec
from arl_tangram.core.resources import Resources
from arl_tangram.replay import driver as D
from arl_tangram.replay.backends import Backend, EmbeddedBackend
from arl_tangram.replay.work import program
from arl_tangram.sim.trace import SessionDef, SimAction, Trajectory

TEXTS = D._TEXTS


def model(kind: str) -> ModelSpec:
    return ModelSpec("m", kind=kind)


# ---- what each action really does -----------------------------------------------------------


def test_model_actions_get_texts_by_their_index_and_their_model_kind() -> None:
    rew = SimAction(ActionKind.REWARD, 1.0, model="m")
    assert D.action_payload(rew, None, 1.0, 0, False) == {"query": TEXTS[0]}
    assert D.action_payload(rew, model("scalar"), 1.0, 5, False) == {"query": TEXTS[1]}
    assert D.action_payload(rew, model("similarity"), 1.0, 3, False) == {
        "response": TEXTS[3],
        "reference": TEXTS[0],
    }
    assert D.action_payload(rew, model("similarity"), 1.0, 6, False) == {
        "response": TEXTS[2],
        "reference": TEXTS[3],
    }
    assert D.action_payload(rew, model("judge"), 1.0, 2, True) == {
        "prompt": "Is this correct?",
        "response": TEXTS[2],
    }
    # a generative judge without tokens in the trace, and a retriever: a plain query
    assert D.action_payload(rew, model("genjudge"), 1.0, 1, False) == {"query": TEXTS[1]}
    ret = SimAction(ActionKind.RETRIEVE, 1.0, hints=WorkHints(tokens=9))
    assert D.action_payload(ret, None, 1.0, 4, False) == {"query": TEXTS[0]}
    gj = SimAction(ActionKind.JUDGE, 1.0, hints=WorkHints(tokens=3), model="m")
    assert D.action_payload(gj, model("genjudge"), 1.0, 7, False) == {
        "openai": {
            "route": "completions",
            "body": {
                "prompt": f"Is this correct? {TEXTS[3]}",
                "max_tokens": 3,
                "temperature": 0.0,
                "ignore_eos": True,
            },
        }
    }


def test_cpu_actions_run_the_work_program() -> None:
    code = SimAction(ActionKind.CODE, 0.5, timeout_s=7)
    got = D.action_payload(code, None, 1000.0, 3, False)
    assert got == {
        "code": program(500, 0.0, 1, session=False),
        "language": "python",
        "run_timeout": 7.0,
    }
    assert isinstance(got["run_timeout"], float)
    tool = SimAction(ActionKind.TOOL, 0.25, session="s")
    assert D.action_payload(tool, None, 100.0, 0, True)["code"] == program(25, 0.0, 1, session=True)
    test = SimAction(ActionKind.TEST, 0.01)
    assert D.action_payload(test, None, 100.0, 0, False) == {
        "code": program(1, 0.0, 1),
        "language": "python",
        "run_timeout": 600.0,
        "cases": [{"stdin": ""}],
    }
    el = Elasticity(min=1.0, max=2.5, speedup=Speedup(0.75))
    par = SimAction(ActionKind.CODE, 1.0, elasticity=el)
    assert D.action_payload(par, None, 10.0, 0, False)["code"] == program(10, 0.75, 3)
    # elastic along memory: its parallel part runs on one worker
    mem = SimAction(
        ActionKind.CODE,
        1.0,
        elasticity=Elasticity(min=1.0, max=4.0, dim="memory_mb", speedup=Speedup(0.5)),
    )
    assert D.action_payload(mem, None, 10.0, 0, False)["code"] == program(10, 0.5, 1)


# ---- results --------------------------------------------------------------------------------


def test_summary_and_quantiles() -> None:
    S = D.ReplayReport.summary
    assert S([]) == {"count": 0, "avg": 0.0, "p50": 0.0, "p99": 0.0}
    assert S([4.0]) == {"count": 1, "avg": 4.0, "p50": 4.0, "p99": 4.0}
    assert S([3.0, 1.0, 2.0, 10.0]) == {
        "count": 4,
        "avg": 4.0,
        "p50": 2.5,
        "p99": pytest.approx(3.0 + 7.0 * 0.97),
    }
    assert D._q([1.0, 2.0], 0.5) == 1.5
    assert D._q([1.0, 2.0, 4.0], 0.75) == 3.0
    assert D._q([1.0, 2.0, 4.0], 1.0) == 4.0
    assert D._q([5.0], 0.3) == 5.0
    assert D._q([1.0, 3.0, 7.0, 9.0], 0.0) == 1.0


def test_report_figures_and_its_json_form() -> None:
    r = D.ReplayReport(policy="p", trace="t.jsonl")
    assert (r.step_avg_s, r.cpu_utilization, r.other_load) == (0.0, 0.0, None)
    r.step_s = [1.0, 2.0, 6.0]
    assert r.step_avg_s == 3.0
    r.capacity_cpu, r.makespan_s, r.cpu_seconds = 4.0, 2.0, 6.0
    assert r.cpu_utilization == 0.75
    assert r.other_load is None  # (no machine figure)
    r.machine_cpu_seconds, r.own_cpu_seconds = 10.0, 1.0
    assert r.other_load == 1.5
    r.machine_cpu_seconds = 5.0
    assert r.other_load == 0.0  # (never below 0)
    r.makespan_s = 0.0
    assert r.other_load is None and r.cpu_utilization == 0.0
    r.capacity_cpu, r.makespan_s = 0.0, 2.0
    assert r.cpu_utilization == 0.0
    r = D.ReplayReport(
        policy="p",
        trace="t",
        actions=3,
        by_status={"z": 1, "a": 2},
        acts=[1.0, 3.0],
        acts_by_kind={"tool": [2.0], "code": [1.0, 3.0]},
        step_s=[4.0],
        makespan_s=8.0,
        capacity_cpu=2.0,
        cpu_seconds=4.0,
        machine_cpu_seconds=9.0,
        own_cpu_seconds=1.0,
        session_turns_ok=False,
        stats={"warm_hits": 5, "model_swaps": 2, "warm_misses": 7, "model_loads": 3},
        wall_s=9.5,
    )
    d = r.as_dict()
    assert d == {
        "policy": "p",
        "trace": "t",
        "actions": 3,
        "by_status": {"a": 2, "z": 1},
        "act": {"count": 2, "avg": 2.0, "p50": 2.0, "p99": pytest.approx(2.98)},
        "act_by_kind": {
            "code": {"count": 2, "avg": 2.0, "p50": 2.0, "p99": pytest.approx(2.98)},
            "tool": {"count": 1, "avg": 2.0, "p50": 2.0, "p99": 2.0},
        },
        "step_s": [4.0],
        "step_avg_s": 4.0,
        "makespan_s": 8.0,
        "cpu_seconds": 4.0,
        "utilization": {"cpu": 0.25},
        "own_cpu_seconds": 1.0,
        "other_load_cores": 0.5,
        "session_state_kept": False,
        "warm_hits": 5,
        "warm_misses": 7,
        "model_loads": 3,
        "model_swaps": 2,
        "wall_s": 9.5,
    }
    assert list(d["by_status"]) == ["a", "z"] and list(d["act_by_kind"]) == ["code", "tool"]
    assert d["step_s"] is not r.step_s


# ---- the closed loop ------------------------------------------------------------------------


class Clock:
    """The driver's `time` and `asyncio.sleep`: a clock that a sleep moves on."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now + 1000.0

    async def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s
        await asyncio.sleep(0)


class Fake(Backend):
    def __init__(self, clock: Clock, answers: list[tuple[str, float | None, Any]]) -> None:
        self.clock, self.answers = clock, list(answers)
        self.calls: list[Any] = []
        self.cpu_capacity = 4.0
        self.ns = 0

    async def open_session(self, sid, demand, ttl_s, image=None):
        self.calls.append(("open", sid, demand, ttl_s, image, self.clock.now))
        return sid

    async def close_session(self, sid):
        self.calls.append(("close", sid))
        if sid.endswith("bad"):
            raise RuntimeError("gone")

    async def run(self, spec):
        self.calls.append(("run", spec.id, spec.session, self.clock.now))
        self.specs = [*getattr(self, "specs", []), spec]
        return self.answers.pop(0)

    def cpu_ns(self):
        return self.ns

    def stats(self):
        return {"warm_hits": 1}


@pytest.fixture()
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(D, "time", c)
    aio = SimpleNamespace(
        **{k: getattr(asyncio, k) for k in ("gather", "create_task", "wait", "Event", "Task")}
    )
    aio.sleep = c.sleep
    monkeypatch.setattr(D, "asyncio", aio)
    return c


def cluster() -> ClusterSpec:
    return ClusterSpec((NodeSpec("n", Resources(cpu=4)),), (ModelSpec("sim", kind="similarity"),))


def turn(n: int) -> dict[str, Any]:
    return {"run_result": {"stdout": f"turn {n}\n"}}


def test_the_closed_loop_waits_opens_counts_and_closes(clock: Clock) -> None:
    sd = SessionDef(demand=Resources(memory_mb=64), ttl_s=9.0, image="img")
    tool = SimAction(
        ActionKind.TOOL,
        0.1,
        session="s",
        tag="bash",
        timeout_s=5,
        weight=2.0,
        demand=Resources(cpu=0.5, memory_mb=99),
        elasticity=Elasticity(min=0.5, max=2.0, speedup=Speedup(0.0)),
        hints=WorkHints(expected_s=0.3),
    )
    rew = SimAction(ActionKind.REWARD, 0.1, model="sim")
    nodef = SimAction(ActionKind.CODE, 0.1, session="x")
    a = Trajectory(
        "a",
        "task",
        ((1.0, tool), (2.0, tool), (0.5, rew), (0.0, nodef)),
        start=3.0,
        sessions={"s": sd},
        siblings="g",
    )
    b = Trajectory("b", "other", ((0.0, SimAction(ActionKind.CODE, 0.1)),), start=0.0)
    be = Fake(
        clock,
        [
            ("succeeded", 0.5, None),
            ("succeeded", 1.5, turn(1)),
            ("succeeded", 0.5, turn(2)),
            ("failed", 0.25, turn(1)),
            ("timed_out", 2.0, None),
        ],
    )
    seen: list[int] = []
    rep = asyncio.run(
        D.replay(
            be,
            [[b, a]],
            cluster(),
            policy="pol",
            trace="tr",
            units_per_s=100.0,
            progress=seen.append,
        )
    )
    # b's action at once; a's first at 3 + 1, then 2 and 0.5 s after each delivery (no wait
    # for a generation of 0)
    runs = [c for c in be.calls if c[0] == "run"]
    assert [(c[1], c[3]) for c in runs] == [
        ("pol:b#0", 100.0),
        ("pol:a#0", 104.0),
        ("pol:a#1", 106.0),
        ("pol:a#2", 106.5),
        ("pol:a#3", 106.5),
    ]
    assert ("open", "a/s", Resources(memory_mb=64), 9.0, "img", 104.0) in be.calls
    assert ("open", "a/x", None, 3600.0, None, 106.5) in be.calls
    assert [c for c in be.calls if c[0] == "open"] == [
        ("open", "a/s", Resources(memory_mb=64), 9.0, "img", 104.0),
        ("open", "a/x", None, 3600.0, None, 106.5),
    ]
    assert be.calls[-2:] == [("close", "a/s"), ("close", "a/x")]
    assert [c[2] for c in runs] == [None, "a/s", "a/s", None, "a/x"]
    spec = be.specs[1]
    assert (
        spec.kind,
        spec.task,
        spec.trajectory,
        spec.session,
        spec.tag,
        spec.timeout_s,
        spec.weight,
        spec.siblings,
        spec.model,
    ) == (ActionKind.TOOL, "task", "a", "a/s", "bash", 5.0, 2.0, "g", None)
    assert spec.payload["code"] == program(10, 0.0, 1, session=True)
    assert (spec.demand, spec.elasticity, spec.hints) == (tool.demand, tool.elasticity, tool.hints)
    assert clock.sleeps == [4.0, 2.0, 0.5]  # (no training time by default, no wait of 0)
    assert be.specs[3].payload == {"response": TEXTS[2], "reference": TEXTS[3]}
    assert be.specs[4].payload["code"] == program(10, 0.0, 1, session=False)  # (not a tool)
    assert seen == [1] * 5
    assert rep.actions == 5 and rep.by_status == {"succeeded": 3, "failed": 1, "timed_out": 1}
    assert rep.acts == [0.5, 1.5, 0.5, 0.25, 2.0]
    assert rep.acts_by_kind == {"code": [0.5, 2.0], "tool": [1.5, 0.5], "reward": [0.25]}
    assert rep.releases == [
        ("b", 0, 0.0, "succeeded"),
        ("a", 0, 4.0, "succeeded"),
        ("a", 1, 6.0, "succeeded"),
        ("a", 2, 6.5, "failed"),
        ("a", 3, 6.5, "timed_out"),
    ]
    assert rep.session_turns_ok is True
    assert rep.step_s == [6.5] and rep.stats == {"warm_hits": 1}
    assert (rep.policy, rep.trace, rep.capacity_cpu) == ("pol", "tr", 4.0)
    assert rep.makespan_s == 6.5 and rep.wall_s == 6.5


def test_uncounted_statuses_lost_turns_and_training_time(clock: Clock) -> None:
    tool = SimAction(ActionKind.TOOL, 0.1, session="s")
    a = Trajectory("a", "t", ((0.0, tool), (0.0, tool), (0.0, tool)), start=0.0)
    be = Fake(
        clock,
        [
            ("succeeded", None, turn(1)),
            ("cancelled", 1.0, turn(2)),
            ("succeeded", 1.0, {"run_result": {"stdout": "turn 1"}}),
        ],
    )
    rep = asyncio.run(
        D.replay(be, [[a], []], cluster(), policy="p", trace="t", units_per_s=1.0, train_s=0.5)
    )
    assert rep.actions == 3 and rep.by_status == {"succeeded": 2, "cancelled": 1}
    assert rep.acts == [1.0] and rep.releases == [("a", 2, 0.0, "succeeded")]
    assert rep.session_turns_ok is False  # (its third turn saw "turn 1")
    assert rep.step_s == [0.5, 0.5] and clock.sleeps == [0.5, 0.5]
    assert [c for c in be.calls if c[0] == "open"] == [("open", "a/s", None, 3600.0, None, 100.0)]


def test_sessions_are_closed_even_when_one_fails_or_a_run_raises(clock: Clock) -> None:
    tool = SimAction(ActionKind.TOOL, 0.1, session="bad")
    other = SimAction(ActionKind.TOOL, 0.1, session="ok")
    a = Trajectory("a", "t", ((0.0, tool), (0.0, other), (0.0, tool)))
    be = Fake(clock, [("succeeded", 1.0, turn(1)), ("succeeded", 1.0, turn(1))])
    with pytest.raises(IndexError):  # (the third run: no answer left)
        asyncio.run(D.replay(be, [[a]], cluster(), policy="p", trace="t", units_per_s=1.0))
    assert be.calls[-2:] == [("close", "a/bad"), ("close", "a/ok")]


def test_stdout_of_an_answer() -> None:
    assert D._stdout({"run_result": {"stdout": "turn 3"}}) == "turn 3"
    assert D._stdout({"run_result": {"stdout": None}}) == ""
    assert D._stdout({"run_result": "x"}) == ""
    assert D._stdout({"other": 1}) == ""
    assert D._stdout(["run_result"]) == ""
    assert D._stdout(None) == ""


# ---- the CPU meter --------------------------------------------------------------------------


def test_the_meter_samples_the_busy_fraction_and_totals_at_the_end(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine = iter([50.0, 80.0])
    own = iter([1.0, 3.5])
    monkeypatch.setattr(D, "machine_busy_s", lambda: next(machine))
    monkeypatch.setattr(D, "_own_cpu_s", lambda: next(own))
    be = Fake(clock, [])
    # the sandboxes busy 2 cores of 4 all along
    be.cpu_ns = lambda: 10**9 + int((clock.now - 100.0) * 2e9)  # type: ignore[method-assign]
    rep = D.ReplayReport(policy="p", trace="t", capacity_cpu=4.0)

    async def go() -> D._CpuMeter:
        m = D._CpuMeter(be, rep, 0.001)
        assert (m.t0, m.cpu0, m.machine0, m.own0) == (100.0, 10**9, 50.0, 1.0)
        async with m:
            for _ in range(3):
                await asyncio.sleep(0.01)  # (a real wait: a sample or more)
                clock.now += 2.0
                await asyncio.sleep(0.01)
        return m

    asyncio.run(go())
    # each sample: CPU-seconds / seconds / capacity, only when the clock moved; the last one
    # after the block ends
    ts = [t for t, _v in rep.cpu_series]
    assert rep.cpu_series and all(v == 0.5 for _t, v in rep.cpu_series)
    assert ts == sorted(set(ts)) and ts[-1] == 6.0
    assert rep.makespan_s == 6.0 and rep.cpu_seconds == 12.0
    assert rep.machine_cpu_seconds == 30.0 and rep.own_cpu_seconds == 2.5


def test_the_meter_without_counts(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(D, "machine_busy_s", lambda: None)
    monkeypatch.setattr(D, "_own_cpu_s", lambda: 0.0)
    be = Fake(clock, [])
    be.ns = None
    rep = D.ReplayReport(policy="p", trace="t", capacity_cpu=4.0)

    async def go() -> None:
        async with D._CpuMeter(be, rep, 0.001):
            await asyncio.sleep(0.01)
            clock.now += 1.0
            await asyncio.sleep(0.01)

    asyncio.run(go())
    assert rep.cpu_series == [] and rep.cpu_seconds == 0.0
    assert rep.machine_cpu_seconds is None and rep.makespan_s == 1.0


def test_machine_busy_and_own_cpu() -> None:
    with open("/proc/stat") as f:
        fields = f.readline().split()
    busy = D.machine_busy_s()
    ticks = [int(x) for x in fields[1:9]]
    want = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    assert busy is not None and want <= busy <= want + 50.0
    t = os.times()
    assert t.user + t.system <= D._own_cpu_s() <= t.user + t.system + 1.0
    assert D.machine_cores() == len(os.sched_getaffinity(0))


# ---- the core's settings --------------------------------------------------------------------


def test_core_and_warm_settings_come_from_the_first_step() -> None:
    code = SimAction(ActionKind.CODE, 1.0, tag="python")
    rew = SimAction(ActionKind.REWARD, 1.0, model="sim")
    tool = SimAction(ActionKind.TOOL, 1.0)
    t1 = Trajectory("1", "x", ((0.0, code), (0.0, tool)))
    t2 = Trajectory("2", "y", ((0.0, rew),))
    t3 = Trajectory("3", "x", ((0.0, code),))
    n, shares = D.core_settings([[t1, t2, t3], [t1]], cluster())
    assert n == 2 and set(shares) == {"x"}
    assert D.core_settings([], cluster()) == (1, {})
    assert D.core_settings([[t2]], cluster())[0] == 1
    assert D.warm_settings([[t1, t2, t3]]) == {
        "warm_keys": ("python", "tool"),
        "warm_boot": {"python": 2, "tool": 1},
    }
    assert D.warm_settings([]) == {"warm_keys": (), "warm_boot": {}}


def test_settle_returns_at_once_for_a_service() -> None:
    class Other:
        pass

    asyncio.run(asyncio.wait_for(D._settle(Other()), 1.0))
    assert isinstance(EmbeddedBackend, type)


def test_warm_process_without_models_does_nothing() -> None:
    assert D.warm_process(ClusterSpec((NodeSpec("n", Resources(cpu=1)),))) is None


# ---- the set-up: settling, warming, one policy's run ---------------------------------------------


def embedded(ready: list[list[int]], states: list[list[str]], models: bool = True) -> Any:
    """An `EmbeddedBackend` with stand-ins: its hosts' warm counts and its instances' states,
    one list per look."""
    be = EmbeddedBackend.__new__(EmbeddedBackend)
    looks = iter(ready)
    cur: dict[str, Any] = {"r": None}

    def warm(i: int) -> Any:
        def state() -> dict[str, int]:
            if i == 0:
                cur["r"] = next(looks, cur["r"])
            return {"k": cur["r"][i]}

        return state

    n = len(ready[0])
    hosts = {f"h{i}": SimpleNamespace(cpu=SimpleNamespace(warm_state=warm(i))) for i in range(n)}
    be.executor = SimpleNamespace(hosts=hosts)
    be.cluster = cluster() if models else ClusterSpec((NodeSpec("n", Resources(cpu=4)),))
    be.tick_s = 0.5
    sts = iter(states)
    last: dict[str, Any] = {"s": []}

    def view() -> Any:
        last["s"] = next(sts, last["s"])
        return SimpleNamespace(instances=[SimpleNamespace(state=s) for s in last["s"]])

    be.engine = SimpleNamespace(cluster_view=view)
    return be


def test_settle_waits_for_two_warm_sandboxes_on_every_node_then_the_loads(clock: Clock) -> None:
    be = embedded([[0, 5], [2, 1], [2, 2], [0, 0]], [["loading", "ready"], ["loading"], ["ready"]])
    asyncio.run(D._settle(be))
    # warm pools: looked at until every node has 2 (two waits of 50 ms), then two ticks, then
    # the loads (two waits of 100 ms)
    assert clock.sleeps == [0.05, 0.05, 1.0, 0.1, 0.1]


def test_settle_gives_up_on_the_warm_pool_after_its_timeout(clock: Clock) -> None:
    be = embedded([[1]], [], models=False)
    asyncio.run(D._settle(be, timeout_s=0.52))
    assert clock.sleeps == [0.05] * 11  # (0.52 s in steps of 50 ms; no model: no tick)
    be = embedded([[2]], [["loading"]])
    asyncio.run(D._settle(be, models_s=0.25))
    assert clock.sleeps[11:] == [1.0, 0.1, 0.1, 0.1]
    be = embedded([[3]], [["loading"]])
    clock.sleeps.clear()
    asyncio.run(D._settle(be, timeout_s=0.0, models_s=0.0))
    assert clock.sleeps == [1.0]


def test_warm_process_loads_and_unloads_each_single_device_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from arl_tangram.managers import gpu

    log: list[Any] = []

    class Mgr:
        def __init__(self, config: Any, models: Any) -> None:
            log.append(
                (
                    "new",
                    config.device,
                    config.cpu_devices,
                    config.cpu_device_memory_mb,
                    tuple(m.name for m in models),
                )
            )

        async def load(self, iid: str, name: str, devices: Any) -> None:
            log.append(("load", iid, name, devices))
            if name == "bad":
                raise RuntimeError("no")

        async def unload(self, iid: str, *, park: bool) -> None:
            log.append(("unload", iid, park))

        async def aclose(self) -> None:
            log.append("close")

    monkeypatch.setattr(gpu, "GpuManager", Mgr)
    models = (ModelSpec("a"), ModelSpec("two", devices=2), ModelSpec("bad"), ModelSpec("c"))
    D.warm_process(ClusterSpec((NodeSpec("n", Resources(cpu=1)),), models))
    assert log == [
        ("new", "auto", 1, 1e9, ("a", "two", "bad", "c")),
        ("load", "warm-a", "a", (0,)),
        ("unload", "warm-a", False),
        ("load", "warm-bad", "bad", (0,)),
        "close",
    ]


def test_replay_policy_builds_its_backend_and_always_closes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[Any] = []

    class B(Backend):
        def __init__(self, *a: Any, **kw: Any) -> None:
            log.append((type(self).__name__, a, kw))
            self.policy = "served"

        async def start(self) -> None:
            log.append("start")

        async def aclose(self) -> None:
            log.append("aclose")

    class Http(B):
        pass

    class Emb(B):
        pass

    async def settle(be: Any) -> None:
        log.append("settle")
        assert isinstance(be, B)

    async def rep(be: Any, steps: Any, cl: Any, **kw: Any) -> str:
        log.append(("replay", kw))
        assert isinstance(be, B) and steps is want_steps and cl is want_cl
        if kw["trace"] == "boom":
            raise RuntimeError("x")
        return "report"

    monkeypatch.setattr(D, "HttpBackend", Http)
    monkeypatch.setattr(D, "EmbeddedBackend", Emb)
    monkeypatch.setattr(D, "_settle", settle)
    monkeypatch.setattr(D, "replay", rep)
    code = SimAction(ActionKind.CODE, 1.0, tag="py")
    steps = [[Trajectory("1", "x", ((0.0, code),)), Trajectory("2", "x", ((0.0, code),))]]
    cl = cluster()
    want_steps, want_cl = steps, cl
    got = asyncio.run(
        D.replay_policy(
            cl,
            steps,
            "tangram",
            trace="t",
            units_per_s=5.0,
            train_s=1.5,
            cpu_config={"a": 1},
            images={"i": "/p"},
            progress=print,
        )
    )
    assert got == "report"
    n, shares = D.core_settings(steps, cl)
    assert log == [
        (
            "Emb",
            (cl, "tangram", n, shares),
            {"cpu_config": {"a": 1}, "images": {"i": "/p"}, "core_kw": D.warm_settings(steps)},
        ),
        "start",
        "settle",
        (
            "replay",
            {
                "policy": "tangram",
                "trace": "t",
                "units_per_s": 5.0,
                "train_s": 1.5,
                "progress": print,
            },
        ),
        "aclose",
    ]
    log.clear()
    asyncio.run(
        D.replay_policy(
            cl, steps, "fifo", trace="t", units_per_s=5.0, url="http://h:1", images={"i": "/p"}
        )
    )
    assert log[0] == ("Http", ("http://h:1",), {"images": {"i": "/p"}})
    assert log[3] == (
        "replay",
        {"policy": "served", "trace": "t", "units_per_s": 5.0, "train_s": 0.0, "progress": None},
    )
    log.clear()
    with pytest.raises(RuntimeError):
        asyncio.run(D.replay_policy(cl, steps, "fifo", trace="boom", units_per_s=5.0))
    assert log[-1] == "aclose"


def test_replay_meters_every_quarter_second_by_default(clock: Clock, monkeypatch) -> None:
    made: list[Any] = []
    real = D._CpuMeter

    class Spy(real):  # type: ignore[misc,valid-type]
        def __init__(self, be: Any, rep: Any, sample_s: float) -> None:
            made.append(sample_s)
            super().__init__(be, rep, sample_s)

    monkeypatch.setattr(D, "_CpuMeter", Spy)
    be = Fake(clock, [])
    asyncio.run(D.replay(be, [], cluster(), policy="p", trace="t", units_per_s=1.0))
    asyncio.run(D.replay(be, [], cluster(), policy="p", trace="t", units_per_s=1.0, sample_s=0.125))
    assert made == [0.25, 0.125]


def meter_run(
    clock: Clock, monkeypatch, *, capacity: float, machine: list[Any], cpu: Any, step: float = 2.0
) -> tuple[D.ReplayReport, D._CpuMeter]:
    it = iter(machine)
    monkeypatch.setattr(D, "machine_busy_s", lambda: next(it))
    monkeypatch.setattr(D, "_own_cpu_s", lambda: 0.0)
    be = Fake(clock, [])
    if callable(cpu):
        be.cpu_ns = cpu  # type: ignore[method-assign]
    else:
        cpus = iter(cpu)
        be.cpu_ns = lambda: next(cpus, cpu[-1])  # type: ignore[method-assign]
    rep = D.ReplayReport(policy="p", trace="t", capacity_cpu=capacity)
    m = D._CpuMeter(be, rep, 0.001)

    async def go() -> None:
        async with m:
            await asyncio.sleep(0.01)
            clock.now += step
            await asyncio.sleep(0.01)
        assert m._task is not None and m._task.done()  # (the sampler awaited, not left)

    asyncio.run(go())
    return rep, m


def test_the_meter_s_samples_per_second_and_core(clock: Clock, monkeypatch) -> None:
    half = clock.now

    def rate() -> int:  # (half a core busy)
        return int((clock.now - half) * 5e8)

    rep, _m = meter_run(clock, monkeypatch, capacity=1.0, machine=[1.0, 2.0], cpu=rate)
    assert rep.cpu_series == [(2.0, 0.5)]  # (1 CPU-second over 2 s on 1 core)
    rep, _m = meter_run(clock, monkeypatch, capacity=0.0, machine=[1.0, 2.0], cpu=rate)
    assert rep.cpu_series == []  # (no capacity: no fraction)


def test_the_meter_leaves_out_a_count_missing_at_either_end(clock: Clock, monkeypatch) -> None:
    rep, _m = meter_run(clock, monkeypatch, capacity=1.0, machine=[None, 5.0], cpu=[None, 5])
    assert rep.machine_cpu_seconds is None and rep.cpu_seconds == 0.0
    rep, _m = meter_run(clock, monkeypatch, capacity=1.0, machine=[5.0, None], cpu=[5, None])
    assert rep.machine_cpu_seconds is None and rep.cpu_seconds == 0.0


class Stat:
    def __init__(self, text: str) -> None:
        self.text = text

    def __call__(self, path: str) -> Any:
        assert path == "/proc/stat"
        if self.text == "!":
            raise PermissionError(13, "denied")
        return io.StringIO(self.text)


def test_machine_busy_reads_the_first_line_of_proc_stat(monkeypatch) -> None:
    hz = os.sysconf("SC_CLK_TCK")
    line = "cpu  100 20 30 4000 50 6 7 8 900 1000\ncpu0 1 1 1 1 1 1 1 1 1 1\n"
    monkeypatch.setattr(D, "open", Stat(line), raising=False)
    assert D.machine_busy_s() == pytest.approx((100 + 20 + 30 + 6 + 7 + 8) / hz)
    for text in ("", "\n", "intr 1 2 3 4 5 6 7 8 9\n", "!"):
        monkeypatch.setattr(D, "open", Stat(text), raising=False)
        assert D.machine_busy_s() is None, text


def test_core_settings_without_the_runner_s_uses_cpu(monkeypatch) -> None:
    from arl_tangram.sim import runner

    rew = SimAction(ActionKind.REWARD, 1.0, model="sim")
    steps = [[Trajectory("1", "x", ((0.0, rew),)), Trajectory("2", "x", ((0.0, rew),))]]
    assert D.core_settings(steps, cluster())[0] == 1
    monkeypatch.delattr(runner, "uses_cpu")
    assert D.core_settings(steps, cluster())[0] == 2  # (every trajectory counted)


def test_machine_cores_without_an_affinity(monkeypatch) -> None:
    def no(_pid: int) -> set[int]:
        raise OSError(38, "no")

    monkeypatch.setattr(os, "sched_getaffinity", no)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert D.machine_cores() == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert D.machine_cores() == 1


def test_settle_s_default_bounds(clock: Clock) -> None:
    asyncio.run(D._settle(embedded([[0]], [], models=False)))
    assert 60 <= len(clock.sleeps) <= 61 and set(clock.sleeps) == {0.05}  # (3 s)
    clock.sleeps.clear()
    asyncio.run(D._settle(embedded([[0]], [], models=False), timeout_s=0.0))
    assert clock.sleeps == []  # (the deadline reached: no look past it)
    asyncio.run(D._settle(embedded([[2]], [["loading"]])))
    assert clock.sleeps[0] == 1.0 and 6000 <= len(clock.sleeps[1:]) <= 6001  # (600 s)


def test_the_meter_samples_while_the_block_runs(clock: Clock, monkeypatch) -> None:
    import time

    monkeypatch.setattr(D, "machine_busy_s", lambda: None)
    monkeypatch.setattr(D, "_own_cpu_s", lambda: 0.0)
    be = Fake(clock, [])
    be.cpu_ns = lambda: int((clock.now - 100.0) * 1e9)  # type: ignore[method-assign]
    rep = D.ReplayReport(policy="p", trace="t", capacity_cpu=2.0)

    async def go() -> None:
        async with D._CpuMeter(be, rep, 0.001):
            clock.now += 2.0
            end = time.monotonic() + 5.0
            while not rep.cpu_series and time.monotonic() < end:
                await asyncio.sleep(0.01)
            clock.now += 2.0

    asyncio.run(go())
    assert rep.cpu_series[0] == (2.0, 0.5) and rep.cpu_series[-1] == (4.0, 0.5)
