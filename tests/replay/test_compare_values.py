"""replay/compare.py's values (issue 43 item 2: the survivors of `make mutation` on it): which
runs `tangram replay --compare` makes on a cluster (`policy_labels`: every policy and every
static-pool allotment some node could give, by hand from the largest node's cores), and what
`replay_all` does around each policy's run -- the process warmed once before the first run, the
runs in the order given, each told the trace's whole number of actions, every argument passed
through, the reports keyed by the policy that ran and handed to ``on_done`` as each ends. The
real runs (`driver.replay_policy`, sandboxes and models) are replaced by a recording fake: what
is pinned here is compare.py's own work, not a replay's."""

from __future__ import annotations

from typing import Any

import pytest

from arl_tangram.core.actions import ActionKind
from arl_tangram.core.cluster import ClusterSpec, NodeSpec
from arl_tangram.core.resources import Resources
from arl_tangram.replay import compare
from arl_tangram.replay.driver import ReplayReport
from arl_tangram.sim.trace import SimAction, Trajectory

POLICIES = ["tangram", "trajectory-bound", "task-isolated", "fifo"]


def _cluster(*cpus: float) -> ClusterSpec:
    return ClusterSpec(tuple(NodeSpec(f"n{i}", Resources(cpu=c, memory_mb=4096))
                             for i, c in enumerate(cpus)))


# ---- policy_labels --------------------------------------------------------------------------


def test_the_static_allotments_kept_are_those_the_largest_node_can_give() -> None:
    # nodes of 2 and 4 cores: the largest gives 4, so static-pool:8 is dropped; 4 itself is kept
    # (an allotment equal to a node's cores fits it), and :max always is
    assert compare.policy_labels(_cluster(2, 4)) == [
        *POLICIES, "static-pool:1", "static-pool:2", "static-pool:4", "static-pool:max"]
    # the order of the nodes does not matter: it is the largest, not the first or the last
    assert compare.policy_labels(_cluster(4, 2)) == compare.policy_labels(_cluster(2, 4))


def test_a_node_of_eight_cores_keeps_every_run() -> None:
    assert compare.policy_labels(_cluster(8)) == [
        *POLICIES, "static-pool:1", "static-pool:2", "static-pool:4", "static-pool:8",
        "static-pool:max"]


def test_under_one_core_only_the_maximum_static_run_is_left() -> None:
    # 0.5 cores: no fixed allotment (1, 2, 4, 8) fits; the dropped ones sit between policies
    # that are kept (static-pool:max comes after them)
    assert compare.policy_labels(_cluster(0.5, 0.25)) == [*POLICIES, "static-pool:max"]
    assert compare.policy_labels(_cluster(1)) == [*POLICIES, "static-pool:1", "static-pool:max"]


def test_the_labels_are_the_simulators_comparison_less_the_dropped_ones() -> None:
    from arl_tangram.sim import runner

    labels = compare.policy_labels(_cluster(3))
    assert labels == [p for p in runner.policies() if p not in ("static-pool:4", "static-pool:8")]


# ---- replay_all -----------------------------------------------------------------------------


def _act() -> SimAction:
    return SimAction(ActionKind.CODE, 1.0, Resources(cpu=1, memory_mb=256))


def _steps() -> list[list[Trajectory]]:
    # two RL steps: 2 + 1 actions in the first, 3 in the second: 6 actions in all
    a = _act()
    return [[Trajectory("t0", "x", ((0.0, a), (0.0, a))), Trajectory("t1", "x", ((0.0, a),))],
            [Trajectory("t2", "x", ((0.0, a), (0.0, a), (0.0, a)), rl_step=1)]]


class _Fake:
    def __init__(self, served: str | None = None) -> None:
        self.log: list[Any] = []
        self.served = served

    def warm(self, cluster: ClusterSpec) -> None:
        self.log.append(("warm", cluster))

    async def replay(self, cluster: ClusterSpec, steps: Any, policy: str, *, trace: str,
                     units_per_s: float, train_s: float, url: str | None, progress: Any,
                     images: Any) -> ReplayReport:
        self.log.append(("run", cluster, steps, policy, trace, units_per_s, train_s, url,
                         progress, images))
        # a service at ``url`` runs its own policy: the report names that one
        return ReplayReport(policy=self.served or f"ran-{policy}", trace=trace)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> _Fake:
    f = _Fake()
    monkeypatch.setattr(compare, "warm_process", f.warm)
    monkeypatch.setattr(compare, "replay_policy", f.replay)
    return f


def test_replay_all_warms_once_then_runs_each_policy_in_order_with_every_argument(
        fake: _Fake) -> None:
    cluster, steps = _cluster(4), _steps()
    images = {"py": "/images/py.tar"}
    started: list[tuple[str, int]] = []
    ticks: dict[str, Any] = {}

    def start_run(label: str, total: int) -> Any:
        started.append((label, total))
        ticks[label] = lambda n: None
        return ticks[label]

    done: list[ReplayReport] = []
    reports = compare.replay_all(cluster, steps, ["fifo", "tangram"], trace="t.jsonl",
                                 units_per_s=1234.5, train_s=2.5, url="http://h:1",
                                 start_run=start_run, on_done=done.append, images=images)
    assert started == [("fifo", 6), ("tangram", 6)]
    assert fake.log == [
        ("warm", cluster),
        ("run", cluster, steps, "fifo", "t.jsonl", 1234.5, 2.5, "http://h:1", ticks["fifo"],
         images),
        ("run", cluster, steps, "tangram", "t.jsonl", 1234.5, 2.5, "http://h:1",
         ticks["tangram"], images),
    ]
    assert list(reports) == ["ran-fifo", "ran-tangram"]
    assert [r.policy for r in reports.values()] == ["ran-fifo", "ran-tangram"]
    assert all(isinstance(r, ReplayReport) and r.trace == "t.jsonl" for r in reports.values())
    assert done == list(reports.values())
    assert done[0] is reports["ran-fifo"] and done[1] is reports["ran-tangram"]


def test_replay_all_without_callbacks_runs_with_no_progress(fake: _Fake) -> None:
    cluster, steps = _cluster(2), _steps()
    reports = compare.replay_all(cluster, steps, ["fifo"], trace="t", units_per_s=1.0,
                                 train_s=0.0, url=None)
    assert fake.log == [("warm", cluster),
                        ("run", cluster, steps, "fifo", "t", 1.0, 0.0, None, None, None)]
    assert list(reports) == ["ran-fifo"] and reports["ran-fifo"].policy == "ran-fifo"


def test_replay_all_counts_every_action_of_every_step(fake: _Fake) -> None:
    seen: list[int] = []
    compare.replay_all(_cluster(2), _steps()[:1], ["a"], trace="t", units_per_s=1.0,
                       train_s=0.0, url=None, start_run=lambda _l, n: seen.append(n))
    compare.replay_all(_cluster(2), [], ["b"], trace="t", units_per_s=1.0, train_s=0.0,
                       url=None, start_run=lambda _l, n: seen.append(n))
    assert seen == [3, 0]


def test_runs_of_a_service_that_answers_with_its_own_policy_are_one_report(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # at ``url`` every run is the service's own policy: the reports are keyed by it, the last
    # run's report kept; ``on_done`` still sees each run
    f = _Fake(served="tangram")
    monkeypatch.setattr(compare, "warm_process", f.warm)
    monkeypatch.setattr(compare, "replay_policy", f.replay)
    done: list[ReplayReport] = []
    reports = compare.replay_all(_cluster(2), _steps(), ["fifo", "task-isolated"], trace="t",
                                 units_per_s=1.0, train_s=0.0, url="http://h:1",
                                 on_done=done.append)
    assert list(reports) == ["tangram"]
    assert len(done) == 2 and reports["tangram"] is done[1]
