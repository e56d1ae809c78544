"""`core/scheduling.py`'s pass with exact values (issue 43 item 2: mutation testing).

- Its shortcuts decide as the general pass: `schedule` sends a freed node's finish through
  `fill_node` (or `run_fair` on that node), an arrival through `drain_one`, and the other
  events through `run_pass` with only the freed nodes tried for the untouched shared-pool heads
  (`try_local`, the CPU limit). Each is a copy of the general loop with what its case makes
  constant folded (the module's doc), so a pass that tries every candidate everywhere
  (`_general`) must emit the same command stream, event for event: seeded simulated RL steps
  under every policy, and seeded tenant floods (`run_fair`) with aging.
- A session head short of memory on its CPU node is parked with its exact group; on a GPU
  node it is not (`_short_besides_cpu`), nor when memory is not what it lacks (`_park`).
- Tenants' order (`run_fair`): the least share first, inside a tenant the best rank."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest
from core_helpers import Driver, act, cpu_commands, cpu_node, elastic, gpu_node, starts
from fair_sim import simulate

from arl_tangram.core import events as ev
from arl_tangram.core.actions import ActionSpec, WorkHints
from arl_tangram.core.records import is_model_key
from arl_tangram.core.resources import Resources
from arl_tangram.core.scheduling import SchedulingPass

_GS = Path(__file__).resolve().parents[2] / "benchmarks" / "golden_streams.py"


def _golden():
    spec = importlib.util.spec_from_file_location("_golden_streams_for_scheduling", _GS)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _general(self: SchedulingPass) -> None:
    """`schedule` without its shortcuts: every candidate queue through `run_pass`, tried on
    every node (no `local`), reservations redone after any change of capacity."""
    st = self.st
    if st.dirty:
        st.reserved.clear()
        keys = self.candidates()
    elif st.touched:
        keys = {k for k in st.touched if not is_model_key(k)}
    else:
        return
    self.run_pass(keys, None, -1.0)


def _unfolded(monkeypatch: pytest.MonkeyPatch) -> None:
    """`fill_node` and `drain_one` replaced by the `run_pass` calls they fold (the module's
    doc: "sending both cases through `run_pass` gives the same decisions")."""
    monkeypatch.setattr(
        SchedulingPass,
        "fill_node",
        lambda self, node: self.run_pass(
            list(self.queues.shape_keys), [node], node.free.get("cpu", 0.0)
        ),
    )
    monkeypatch.setattr(
        SchedulingPass, "drain_one", lambda self, key: self.run_pass({key}, None, -1.0)
    )


@pytest.mark.pure_core
@pytest.mark.parametrize("workload", ["code-rl", "tool-math", "grpo-siblings", "mixed"])
def test_the_shortcuts_decide_as_the_general_pass_on_simulated_steps(
    workload: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    gs = _golden()
    fast = [gs.simulated(workload, p, 16) for p in gs.POLICIES]
    monkeypatch.setattr(SchedulingPass, "schedule", _general)
    general = [gs.simulated(workload, p, 16) for p in gs.POLICIES]
    assert fast == general


def _flood(seed: int) -> list[tuple[float, ActionSpec, float]]:
    rng = random.Random(seed)
    out = []
    t = 0.0
    for i in range(120):
        t += rng.choice((0.0, 0.0, 0.05, 0.3, 1.0))
        tenant = rng.choice(("a", "a", "b", "c"))
        cpu = rng.choice((0.5, 1.0, 1.0, 2.0, 3.0))
        mem = rng.choice((128, 512, 2048))
        hints = WorkHints(expected_s=rng.choice((0.5, 2.0, 8.0)))
        out.append(
            (
                t,
                act(f"x{i}", cpu=cpu, mem=mem, tag=f"t{i % 3}", tenant=tenant, hints=hints),
                rng.choice((0.2, 1.0, 3.0, 6.0)),
            )
        )
    return out


@pytest.mark.pure_core
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("lend_floor", [1.0, 0.5])
def test_the_folded_copies_decide_as_run_pass_with_tenants(
    seed: int, lend_floor: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = [
        cpu_node("n0", cpu=4, mem=4096),
        cpu_node("n1", cpu=2, mem=8192),
        cpu_node("n2", cpu=3, mem=2048),
    ]
    cfg = {
        "tenant_shares": {"a": 1.0, "b": 2.0, "c": 1.0},
        "lend_floor": lend_floor,
        "aging_s": 4.0,
        "aging_min_s": 4.0,
        "policy": "tangram",
    }
    fast = simulate(nodes, _flood(seed), **cfg)
    _unfolded(monkeypatch)  # (the tried nodes stay: `find_node` over all and `place_among`
    # over the freed ones may pick different nodes among several that fit, seed 2 here)
    general = simulate(nodes, _flood(seed), **cfg)
    assert len(fast.starts) == 120
    assert fast.stream == general.stream


@pytest.mark.pure_core
@pytest.mark.parametrize("seed", range(3))
def test_the_shortcuts_decide_as_the_general_pass_without_tenants(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = [
        cpu_node("n0", cpu=4, mem=4096),
        cpu_node("n1", cpu=2, mem=8192),
        cpu_node("n2", cpu=3, mem=2048),
    ]
    cfg = {"aging_s": 4.0, "aging_min_s": 4.0, "policy": "tangram"}
    fast = simulate(nodes, _flood(seed), **cfg)
    monkeypatch.setattr(SchedulingPass, "schedule", _general)
    general = simulate(nodes, _flood(seed), **cfg)
    assert len(fast.starts) == 120
    assert fast.stream == general.stream


# ---- heads short of memory on their session's node ------------------------------------------


def _short(node, need: float, elastic_policy: str = "tangram", p_mem: float = 16) -> Driver:
    """Session ``s`` (64 MB) on ``node``; a 3000 MB action; ``s``'s action ``q`` needing
    ``need`` MB queued; then an action of the shared pool starts and ends there (a pass over the
    node, ``q``'s queue untouched)."""
    d = Driver([node], policy=elastic_policy, session_ttl_s=1e6)
    d.at(0.0)(ev.SessionRequested(0.0, "s", Resources(memory_mb=64)))
    d.at(0.1).arrive(act("hog", cpu=1, mem=3000))
    d.at(0.2).arrive(ActionSpec("q", demand=Resources(cpu=1, memory_mb=need), session="s"))
    d.at(0.3).arrive(act("p", cpu=1, mem=p_mem))
    d.at(0.4).finish("p")
    return d


def _groups(d: Driver) -> dict:
    return {n: {k: (g.need, g.rigid) for k, g in v.items()} for n, v in d.core.st.short_on.items()}


def test_a_head_short_of_memory_on_a_cpu_node_is_parked_in_its_group() -> None:
    d = _short(cpu_node("n0", cpu=4, mem=4096), 2048)
    shape = (("cpu", 1.0), ("memory_mb", 2048.0))
    assert d.core.st.parked == {"s": (shape, 2)}
    assert _groups(d) == {"n0": {(shape, True): (2048.0, True)}}
    assert "s" not in d.core.st.waiting_on["n0"]
    assert "q" not in starts(d.log)
    d.at(1.0).finish("hog")  # the memory comes back: it starts, unparked
    assert starts(d.log)["q"].node == "n0"
    assert d.core.st.parked == {}


def test_a_head_short_of_one_megabyte_on_a_full_node_is_parked() -> None:
    # the session (64 MB) and the 3000 MB action take all of the node's memory: none is free
    d = _short(cpu_node("n0", cpu=4, mem=3064), 1, p_mem=0)
    assert starts(d.log)["p"].node == "n0"
    assert d.core.st.nodes["n0"].free.get("memory_mb", 0.0) == 0.0
    shape = (("cpu", 1.0), ("memory_mb", 1.0))
    assert d.core.st.parked == {"s": (shape, 2)}
    assert _groups(d) == {"n0": {(shape, True): (1.0, True)}}


@pytest.mark.parametrize("gpus", [1, 2])
def test_a_head_short_of_memory_on_a_gpu_node_is_not_parked(gpus: int) -> None:
    d = _short(gpu_node("g0", gpus=gpus), 63000)
    assert d.core.st.sessions["s"].node == "g0"
    assert d.core.st.parked == {}
    assert _groups(d) == {}
    assert "q" not in starts(d.log)


def test_a_head_short_of_cpu_only_is_not_parked() -> None:
    d = _short(cpu_node("n0", cpu=1, mem=8192), 128)  # memory fits; the one core is held
    assert d.core.st.parked == {}
    assert _groups(d) == {}
    assert "s" in d.core.st.waiting_on["n0"]


# ---- tenants' order -------------------------------------------------------------------------


def test_a_fair_pass_takes_the_least_share_then_its_best_head() -> None:
    # one core: x (tenant a, 20 s expected, arrived first), y and z (tenant b, 1 s): at each
    # end every tenant holds nothing (shares tie at 0), so the better rank (shorter, tangram)
    # goes first although x arrived first: y, z, then x
    shares = {"a": 1.0, "b": 1.0}
    arr = [
        (0.0, act("hold", cpu=1, tenant="c"), 1.0),
        (0.1, act("x", cpu=1, tenant="a", hints=WorkHints(expected_s=20.0)), 1.0),
        (0.2, act("y", cpu=1, tenant="b", hints=WorkHints(expected_s=1.0)), 1.0),
        (0.3, act("z", cpu=1, tenant="b", hints=WorkHints(expected_s=1.0)), 1.0),
    ]
    r = simulate([cpu_node("n", cpu=1)], arr, tenant_shares={**shares, "c": 1.0}, lend_floor=1.0)
    assert r.starts == ["hold", "y", "z", "x"]
    assert [r.start[a] for a in ("y", "z", "x")] == [1.0, 2.0, 3.0]


# ---- one queue touched (`drain_one`, `try_place`) -------------------------------------------


def test_actions_arriving_together_start_together() -> None:
    d = Driver([cpu_node("n0", cpu=4, mem=8192)], policy="tangram")
    out = d.at(0.0)(ev.ActionsArrived(0.0, (act("a"), act("b"), act("c"))))
    assert cpu_commands(out) == [("start", "a", 1.0), ("start", "b", 1.0), ("start", "c", 1.0)]


def test_an_elastic_session_head_starts_at_its_width_on_its_node() -> None:
    d = Driver([cpu_node("n0", cpu=8, mem=8192)], policy="tangram", session_ttl_s=1e6)
    d.at(0.0)(ev.SessionRequested(0.0, "s", Resources(memory_mb=64)))
    assert cpu_commands(d.at(0.1).arrive(elastic("e", 1, 4, session="s"))) == [("start", "e", 4.0)]


def test_a_fair_pass_keeps_a_tenants_other_queues_after_a_start() -> None:
    # tenant a queues two shapes: a1, a2 (1 core) and b (2 cores, another memory); the 4 cores
    # come back at once: a1's start puts a2 on a's heap beside b, and all three start
    d = Driver(
        [cpu_node("n0", cpu=4, mem=8192)],
        policy="tangram",
        tenant_shares={"a": 1.0, "c": 1.0},
        lend_floor=1.0,
    )
    d.at(0.0).arrive(act("hold", cpu=4, tenant="c"))
    d.at(0.1).arrive(
        act("a1", cpu=1, tenant="a", hints=WorkHints(expected_s=1.0)),
        act("a2", cpu=1, tenant="a", hints=WorkHints(expected_s=1.0)),
        act("b", cpu=2, mem=512, tenant="a", hints=WorkHints(expected_s=5.0)),
    )
    assert cpu_commands(d.at(1.0).finish("hold")) == [
        ("start", "a1", 1.0),
        ("start", "a2", 1.0),
        ("start", "b", 2.0),
    ]


def test_a_freed_node_takes_the_next_shape_when_the_first_no_longer_fits() -> None:
    # 3 cores come back (fifo: arrival order): a1 (2 cores) starts, a2 (2) no longer fits,
    # b (1) is tried next and starts
    d = Driver([cpu_node("n0", cpu=3, mem=8192)], policy="fifo")
    d.at(0.0).arrive(act("hold", cpu=3))
    d.at(0.1).arrive(act("a1", cpu=2), act("a2", cpu=2), act("b", cpu=1))
    assert cpu_commands(d.at(1.0).finish("hold")) == [("start", "a1", 2.0), ("start", "b", 1.0)]


def test_an_aged_blocked_head_holds_the_node_for_itself() -> None:
    d = Driver([cpu_node("n0", cpu=1, mem=8192)], policy="tangram", aging_s=1.0, aging_min_s=1.0)
    d.at(0.0).arrive(act("hold", cpu=1))
    d.at(0.1).arrive(act("w", cpu=1))
    d.at(2.0).tick()  # w aged, still blocked: n0 is held for it
    assert d.core.st.reserved == {"n0": "w"}
    d.at(2.1).arrive(act("x", cpu=1, mem=128))
    assert d.core.st.reserved == {"n0": "w"}
    assert list(starts(d.log)) == ["hold"]
