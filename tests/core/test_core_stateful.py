"""Random event sequences against every policy, with every invariant checked after each step.

`Core.validate` checks capacity, accounting, sessions on their node, NVLink domains and work
conservation; the driver checks exactly one Deliver per arrived action. At the end, the
machine drains: nodes come back, every load and batch completes, every action finishes and time
passes; then nothing may be left waiting (liveness: aging works, nothing starves).
"""

from __future__ import annotations

import pytest
from core_helpers import Driver, cpu_node, gpu_node
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from arl_tangram.core import POLICIES
from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core.actions import ActionKind, ActionSpec, Elasticity, Speedup, Status, WorkHints
from arl_tangram.core.cluster import ModelSpec
from arl_tangram.core.records import InstState
from arl_tangram.core.resources import Resources

MODELS = (
    ModelSpec("rm", memory_mb=8000, alpha=0.02, beta=0.01, max_batch=4, max_instances=2, load_s=1.0),
    ModelSpec("tp2", devices=2, memory_mb=8000, alpha=0.02, beta=0.01, max_batch=8, load_s=1.0),
)
NODES = (
    cpu_node("c0", cpu=4, mem=4096),
    cpu_node("c1", cpu=2, mem=2048),
    gpu_node("g0", gpus=4, domains=[[0, 1], [2, 3]]),
)
FIN = (Status.SUCCEEDED, Status.FAILED, Status.TIMED_OUT, Status.RUNNING)  # RUNNING: bogus report

cpu_specs = st.builds(
    lambda cpu, mem, el, idem, sess, traj, task, w, hint: dict(
        demand=Resources(cpu=cpu, memory_mb=mem), elasticity=el, idempotent=idem, session=sess,
        trajectory=traj, task=task, weight=w, hints=WorkHints(expected_s=hint)),
    st.sampled_from([0.5, 1, 2, 3, 8]),
    st.sampled_from([128, 512, 3000]),
    st.one_of(st.none(), st.builds(lambda hi: Elasticity(1, hi, speedup=Speedup(0.8)), st.sampled_from([2, 4]))),
    st.booleans(),
    st.one_of(st.none(), st.sampled_from(["s1", "s2"])),
    st.sampled_from(["t1", "t2", "t3"]),
    st.sampled_from(["a", "b"]),
    st.sampled_from([1.0, 2.0]),
    st.one_of(st.none(), st.sampled_from([0.1, 5.0, 50.0])),
)


class CoreMachine(RuleBasedStateMachine):
    policy = "tangram"

    def __init__(self) -> None:
        super().__init__()
        self.d = Driver(NODES, MODELS, policy=self.policy, trajectories=3, aging_s=20.0,
                        task_shares={"a": 2, "b": 1}, model_idle_s=15.0, session_ttl_s=30.0)
        self.n = 0
        self.lost: list[str] = []
        self.seen = 0

    @property
    def core(self):
        return self.d.core

    def _advance(self, dt: float) -> None:
        self.d.t += dt

    def _new_id(self) -> str:
        self.n += 1
        return f"a{self.n}"

    @rule(kw=cpu_specs, dt=st.sampled_from([0.0, 0.5, 3.0]))
    def arrive_cpu(self, kw, dt) -> None:
        if kw["elasticity"] is not None:
            kw["demand"] = kw["demand"].with_amount("cpu", 1)
        self._advance(dt)
        self.d.arrive(ActionSpec(self._new_id(), kind=ActionKind.TEST, **kw))

    @rule(model=st.sampled_from(["rm", "rm", "tp2", "nope"]), idem=st.booleans())
    def arrive_reward(self, model, idem) -> None:
        self.d.arrive(ActionSpec(self._new_id(), kind=ActionKind.REWARD, model=model,
                                 demand=Resources(), idempotent=idem, hints=WorkHints(tokens=50)))

    @rule(data=st.data())
    def start_one(self, data) -> None:
        ids = sorted(a for a, r in self.core.actions.items() if r.status is Status.STARTING)
        if ids:
            aid = data.draw(st.sampled_from(ids))
            self.d.started(aid, self.core.actions[aid].node)

    @rule(data=st.data(), status=st.sampled_from(FIN), dt=st.sampled_from([0.1, 2.0]))
    def finish_one(self, data, status, dt) -> None:
        ids = sorted(a for a, r in self.core.actions.items()
                     if r.status in (Status.STARTING, Status.RUNNING) and r.batch is None)
        if ids:
            self._advance(dt)
            self.d.finish(data.draw(st.sampled_from(ids)), status=status, run_s=dt)

    @rule(data=st.data())
    def cancel(self, data) -> None:
        ids = [*sorted(self.core.actions), "ghost"]
        self.d(ev.CancelRequested(self.d.t, data.draw(st.sampled_from(ids))))

    @rule(sid=st.sampled_from(["s1", "s2", "s3"]), pin=st.sampled_from([None, "c0", "g0", "zz"]),
          warm_key=st.sampled_from([None, "image:a", "test"]))
    def session_open(self, sid, pin, warm_key) -> None:
        self.d(ev.SessionRequested(self.d.t, sid, demand=Resources(memory_mb=256), ttl_s=20.0, node=pin,
                                   warm_key=warm_key))

    @rule(sid=st.sampled_from(["s1", "s2", "s3"]))
    def session_close(self, sid) -> None:
        self.d(ev.SessionClosed(self.d.t, sid))

    @rule(name=st.sampled_from(["c0", "c1", "g0"]))
    def lose_node(self, name) -> None:
        if self.core.nodes[name].alive:
            self.lost.append(name)
        self.d(ev.NodeLost(self.d.t, name))

    @precondition(lambda self: self.lost)
    @rule()
    def add_back(self) -> None:
        name = self.lost.pop(0)
        self.d(ev.NodeAdded(self.d.t, next(n for n in NODES if n.name == name)))

    @rule(data=st.data(), ok=st.booleans())
    def model_loaded(self, data, ok) -> None:
        ids = sorted(i for i, r in self.core.planner.instances.items() if r.state is InstState.LOADING)
        if ids:
            self.d(ev.ModelLoaded(self.d.t, data.draw(st.sampled_from(ids)), ok=ok, reason="test"))

    @rule(data=st.data())
    def batch_finished(self, data) -> None:
        inflight = sorted((i.batch[0], i.id, i.batch[1]) for i in self.core.planner.instances.values() if i.batch)
        if inflight:
            bid, iid, ids = data.draw(st.sampled_from(inflight))
            fail = set(data.draw(st.sampled_from([(), ids[:1], ids[-1:], ids[:2]])))
            self.d(ev.BatchFinished(self.d.t, bid, iid, outputs={a: 1.0 for a in ids if a not in fail},
                                    failed={a: "bad" for a in fail}))

    @rule(node=st.sampled_from(["c0", "g0"]), n=st.integers(0, 3), key=st.sampled_from(["test", "image:a"]))
    def warm_report(self, node, n, key) -> None:
        self.d(ev.WarmPoolReport(self.d.t, node, key, n))

    @rule(dt=st.sampled_from([1.0, 25.0]))
    def tick(self, dt) -> None:
        self._advance(dt)
        self.d.tick()

    @invariant()
    def commands_are_sane(self) -> None:
        new, self.seen = self.d.log[self.seen:], len(self.d.log)
        for c in new:
            if isinstance(c, cmd.LoadModel):
                node = next(n for n in NODES if n.name == c.node)
                assert any(set(c.devices) <= set(dom) for dom in node.gpu_domains)
            if isinstance(c, cmd.StartAction) and c.action.session is not None:
                sess = self.core.st.sessions.get(c.action.session)
                assert sess is None or sess.node == c.node

    def teardown(self) -> None:
        d = self.d
        while self.lost:
            self.add_back()
        for _ in range(80):
            if not self.core.actions:
                break
            d.t += 25.0
            for iid, inst in sorted(self.core.planner.instances.items()):
                if inst.state is InstState.LOADING:
                    d(ev.ModelLoaded(d.t, iid))
            for inst in sorted(self.core.planner.instances.values(), key=lambda i: i.id):
                if inst.batch:
                    bid, ids = inst.batch
                    d(ev.BatchFinished(d.t, bid, inst.id, outputs={a: 1.0 for a in ids}))
            for aid in sorted(self.core.actions):
                r = self.core.actions.get(aid)
                if r is not None and r.status in (Status.STARTING, Status.RUNNING) and r.batch is None:
                    d.finish(aid, run_s=1.0)
            d.tick()
        left = {a: r.status.name for a, r in self.core.actions.items()}
        assert not left, f"actions waiting forever while capacity is free: {left}"
        assert self.core.arrived == len(d.delivered)


def _machine(policy: str):
    cls = type(f"Machine_{policy.replace('-', '_')}", (CoreMachine,), {"policy": policy})
    return cls


@pytest.mark.parametrize("policy", POLICIES)
def test_random_event_sequences(policy: str) -> None:
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        _machine(policy),
        settings=settings(max_examples=100, stateful_step_count=50, deadline=None,
                          suppress_health_check=list(HealthCheck), derandomize=True),
    )


def _random_kw(rng) -> dict:
    el = None if rng.random() < 0.6 else Elasticity(1, rng.choice([2, 4]), speedup=Speedup(0.8))
    cpu = 1 if el is not None else rng.choice([0.5, 1, 2, 3, 8])
    return dict(
        demand=Resources(cpu=cpu, memory_mb=rng.choice([128, 512, 3000])), elasticity=el,
        idempotent=rng.random() < 0.5, session=rng.choice([None, None, "s1", "s2"]),
        trajectory=rng.choice(["t1", "t2", "t3"]), task=rng.choice(["a", "b"]),
        weight=rng.choice([1.0, 2.0]), hints=WorkHints(expected_s=rng.choice([None, 0.1, 5.0, 50.0])),
    )


class _Draw:
    """Stands in for hypothesis' ``data`` in the seeded random walk."""

    def __init__(self, rng) -> None:
        self.rng = rng

    def draw(self, strategy):
        return self.rng.choice(list(strategy.elements))  # the rules only draw sampled_from


@pytest.mark.parametrize("policy", POLICIES)
def test_seeded_random_walks(policy: str) -> None:
    """Longer walks than hypothesis tends to build: 100 seeds x 80 events per policy."""
    import random

    for seed in range(100):
        rng = random.Random(seed)
        m = _machine(policy)()
        data = _Draw(rng)
        for _ in range(80):
            r = rng.randrange(13)
            if r < 3:
                m.arrive_cpu(_random_kw(rng), rng.choice([0.0, 0.5, 3.0]))
            elif r == 3:
                m.arrive_reward(rng.choice(["rm", "rm", "tp2", "nope"]), rng.random() < 0.5)
            elif r == 4:
                m.start_one(data)
            elif r in (5, 6):
                m.finish_one(data, rng.choice(FIN), rng.choice([0.1, 2.0]))
            elif r == 7:
                m.cancel(data)
            elif r == 8:
                m.session_open(rng.choice(["s1", "s2", "s3"]), rng.choice([None, "c0", "g0", "zz"]),
                               rng.choice([None, "image:a", "test"]))
                m.session_close(rng.choice(["s1", "s2", "s3"])) if rng.random() < 0.3 else None
            elif r == 9:
                m.lose_node(rng.choice(["c0", "c1", "g0"])) if rng.random() < 0.5 else (
                    m.add_back() if m.lost else None)
            elif r == 10:
                m.model_loaded(data, rng.random() < 0.8)
            elif r == 11:
                m.batch_finished(data)
            else:
                m.warm_report(rng.choice(["c0", "g0"]), rng.randint(0, 3), rng.choice(["test", "image:a"])) \
                    if rng.random() < 0.3 else m.tick(
                    rng.choice([1.0, 25.0]))
            m.commands_are_sane()
        m.teardown()
