"""The review's M1 scenario in virtual time (`arl_tangram.sim.tenants`, issue 41 item 3):
carol's flood of one-second loops, alice's eight 4 ms ``print(1)`` at t=1.5, on 2 CPUs --
today (one order), under the ``cpu_share`` cap, with the core's fair share without taking
lent CPU back (``wait``) and with it (``fair``). Exact values (virtual time is deterministic)."""

from __future__ import annotations

import pytest

from arl_tangram.sim.tenants import m1_streams, run


def test_today_alice_waits_for_the_whole_flood() -> None:
    carol, alice = m1_streams(100, alice_at=1.5)
    o = run([carol, alice], 2, "today")
    assert o.mean_act("alice") == pytest.approx(48.51)  # (the review: 49.2-49.3 s at t=1)
    assert o.last["carol"] == 50.0


def test_the_cap_keeps_alice_fast_but_idles_half_the_cluster() -> None:
    carol, alice = m1_streams(100, alice_at=1.5)
    o = run([carol, alice], 2, "cap")
    assert o.mean_act("alice") == pytest.approx(0.018)  # one at a time: 4, 8, ..., 32 ms
    assert o.last["carol"] == 100.0  # one core of two: twice as long as alone


def test_fair_share_without_taking_back_waits_one_flood_action_at_most() -> None:
    carol, alice = m1_streams(100, alice_at=1.5)
    o = run([carol, alice], 2, "wait")
    alone = run([alice], 2, "today")
    assert alone.mean_act("alice") == pytest.approx(0.010)  # 8 x 4 ms on 2 cores
    # t=2: both of carol's running loops end; alice (holds nothing) gets each freed core
    # before carol, in turns with carol's (equal shares): her eight run 2.000-2.032 on one
    # core, carol's next on the other; the wait for the loops to end is the 0.5 s of a
    # flood action left when she arrived (nothing running is preempted)
    assert o.mean_act("alice") == pytest.approx(0.518)
    assert o.last["carol"] == pytest.approx(50.032)  # + alice's 32 ms of work, no more
    assert o.starts[:6] == ["carol-0", "carol-1", "carol-2", "carol-3", "alice-0", "carol-4"]
    assert o.resizes == 0


@pytest.mark.parametrize("flood", [100, 300])
def test_fair_share_takes_the_lent_core_back_at_once(flood: int) -> None:
    carol, alice = m1_streams(flood, alice_at=1.5)
    o = run([carol, alice], 2, "fair")
    # t=1.5: carol's two running loops go to half a core each, alice's first starts at once;
    # her eight run one after another on her share (one core): 4, 8, ..., 32 ms -- exactly
    # alone on one core, GPS's guarantee (alone on both cores: 10 ms, her eight two at a time)
    assert o.mean_act("alice") == pytest.approx(0.018)
    assert o.mean_act("alice") == pytest.approx(run([alice], 1, "today").mean_act("alice"))
    assert o.starts[4:12] == [f"alice-{i}" for i in range(8)]
    # squeezed at 1.5, grown back at 1.552 (a squeeze and a regrowth between alice's actions
    # cancel out; after her last, her core stays hers for `lend_anticipation_s`, 20 ms, in
    # case another comes): carol's two loops lost 16 ms each, plus 10 ms each at half a
    # core for the hold
    assert o.resizes == 4
    assert o.last["carol"] == pytest.approx(flood / 2 + 0.026)


def test_a_bad_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="mode must be one of today, cap, wait, fair"):
        run(m1_streams(1), 2, "preempt")


def test_a_sequential_tenant_within_her_share_runs_as_alone_under_fair_share() -> None:
    """Alice's eight print(1) one at a time (a trajectory's tool calls: each sent at the last
    one's answer) while carol floods 2 CPUs: within her share, so GPS owes her alone's ACT."""
    carol, alice = m1_streams(100, alice_at=1.5, sequential=True)
    assert alice.sequential and not carol.sequential
    alone = run([alice], 2, "today")
    assert alone.acts["alice"] == pytest.approx([0.004] * 8) and alone.last["alice"] == 1.532
    shares = {"alice": 0.5, "carol": 0.5}
    fair = run([carol, alice], 2, "fair", shares)
    # each starts at its send: the first on a core squeezed from carol's two loops (half a
    # core each), the others on that core, held for her (anticipation: 20 ms past each of
    # her actions' ends); carol's grow back once the last hold runs out: 4 quota changes in
    # all, where growing back at each end took 4 per action
    assert fair.acts["alice"] == pytest.approx([0.004] * 8)
    assert fair.resizes == 4 and fair.last["carol"] == pytest.approx(50.026)
    # without taking lent CPU back: her first waits for a loop to end (0.5 s), each next one
    # for the next loop's end (the freed core goes to carol's queue before her next arrives)
    wait = run([carol, alice], 2, "wait", shares)
    assert wait.acts["alice"][:3] == pytest.approx([0.504, 1.0, 1.004])
    assert wait.mean_act("alice") == pytest.approx(0.9395)
    # today: her first waits behind the whole flood, then the cluster is hers
    today = run([carol, alice], 2, "today")
    assert today.acts["alice"] == pytest.approx([48.504] + [0.004] * 7)
