"""core/fit.py's values (issue 43 item 2: the survivors of `make mutation` on it): a demand's
leftover on a node (-1.0 when any dimension is short by more than 1e-9, else the largest
fraction of capacity left free in a demanded dimension, 0.0 for an exact fit), the best-fit
scan's choice (warm first, then the least leftover, the first on a tie; reserved, lost and
too-small nodes passed over; at most ``enough`` fits among the first ``most`` names, counted
across groups), the unbounded scan's bound, and the fit of every dimension but CPU."""

from __future__ import annotations

from arl_tangram.core import fit
from arl_tangram.core.cluster import NodeSpec
from arl_tangram.core.fit import UNBOUNDED, best_fit, fits_besides_cpu, leftover
from arl_tangram.core.records import NodeState
from arl_tangram.core.resources import Resources


def node(name: str, **cap: float) -> NodeState:
    return NodeState(NodeSpec(name, Resources(**cap)))


def test_the_unbounded_scan_is_2_to_the_62() -> None:
    assert UNBOUNDED == 2**62
    assert fit.UNBOUNDED == 4611686018427387904


# ---- leftover -------------------------------------------------------------------------------


def test_an_exact_fit_leaves_zero() -> None:
    n = node("n", cpu=4, memory_mb=100)
    assert leftover(n, (("cpu", 4.0),)) == 0.0
    assert leftover(n, (("cpu", 4.0), ("memory_mb", 100.0))) == 0.0


def test_the_leftover_is_the_largest_free_fraction_of_a_demanded_dimension() -> None:
    n = node("n", cpu=4, memory_mb=100, gpu=2)
    assert leftover(n, (("cpu", 1.0),)) == 0.75
    assert leftover(n, (("cpu", 3.0), ("memory_mb", 50.0))) == 0.5
    assert leftover(n, (("cpu", 1.0), ("memory_mb", 90.0))) == 0.75
    # an undemanded dimension (gpu, all free) does not count
    assert leftover(n, (("cpu", 4.0),)) == 0.0
    n.take({"cpu": 2.0})
    assert leftover(n, (("cpu", 1.0),)) == 0.25


def test_a_small_capacity_counts_in_the_leftover() -> None:
    # capacity under 1: (free - demand) / cap = (0.5 - 0.25) / 0.5
    n = node("n", cpu=0.5)
    assert leftover(n, (("cpu", 0.25),)) == 0.5


def test_a_demand_short_by_more_than_1e_9_does_not_fit() -> None:
    n = node("n", cpu=1, memory_mb=100)
    assert leftover(n, (("cpu", 1.0 + 1e-9),)) == 0.0
    assert leftover(n, (("cpu", 1.0 + 3e-9),)) == -1.0
    assert leftover(n, (("cpu", 1.5),)) == -1.0
    assert leftover(n, (("memory_mb", 50.0), ("cpu", 2.0))) == -1.0
    # a dimension the node lacks
    assert leftover(n, (("gpu", 0.5),)) == -1.0
    assert leftover(n, (("gpu", 1e-9),)) == 0.0


# ---- best fit -------------------------------------------------------------------------------


def scan(
    groups: list[list[str]],
    nodes: dict[str, NodeState],
    shape: tuple[tuple[str, float], ...],
    *,
    reserved: dict[str, str] | None = None,
    enough: int = 100,
    most: int = UNBOUNDED,
    warm_key: str = "",
) -> str | None:
    g = [{n: None for n in group} for group in groups]
    best = best_fit(g, nodes, reserved or {}, shape, enough, most, warm_key)
    return None if best is None else best.name


def cluster() -> dict[str, NodeState]:
    # free cpu 4, 2, 1, 2 (of 4 each): leftovers for 1 cpu 0.75, 0.25, 0.0, 0.25
    ns = {n: node(n, cpu=4) for n in ("a", "b", "c", "d")}
    ns["b"].take({"cpu": 2.0})
    ns["c"].take({"cpu": 3.0})
    ns["d"].take({"cpu": 2.0})
    return ns


CPU1 = (("cpu", 1.0),)


def test_the_least_leftover_wins_and_an_exact_fit_counts() -> None:
    ns = cluster()
    assert scan([["a", "b", "c", "d"]], ns, CPU1) == "c"
    assert scan([["a", "b", "d"]], ns, CPU1) == "b"  # b and d tie: the first
    assert scan([["a", "d", "b"]], ns, CPU1) == "d"
    assert scan([["a"]], ns, CPU1) == "a"
    assert scan([["d", "a"]], ns, CPU1) == "d"


def test_none_fits() -> None:
    ns = cluster()
    assert scan([["b", "c", "d"]], ns, (("cpu", 3.0),)) is None
    assert scan([], ns, CPU1) is None
    assert scan([["a"]], ns, (("cpu", 3.0),)) == "a"


def test_reserved_and_lost_nodes_are_passed_over() -> None:
    ns = cluster()
    assert scan([["a", "b", "c"]], ns, CPU1, reserved={"c": "s1"}) == "b"
    assert scan([["c", "a"]], ns, CPU1, reserved={"b": "s1"}) == "c"
    ns["c"].alive = False
    assert scan([["a", "b", "c"]], ns, CPU1) == "b"
    assert scan([["c", "a"]], ns, CPU1) == "a"


def test_a_node_too_small_is_passed_over_not_the_end() -> None:
    ns = cluster()
    assert scan([["c", "b", "a"]], ns, (("cpu", 2.0),)) == "b"
    assert scan([["c", "a"]], ns, (("cpu", 2.0),)) == "a"


def test_at_most_enough_fits_are_weighed() -> None:
    ns = cluster()
    order = [["a", "b", "c", "d"]]
    assert scan(order, ns, CPU1, enough=1) == "a"
    assert scan(order, ns, CPU1, enough=2) == "b"
    assert scan(order, ns, CPU1, enough=3) == "c"
    # a node that does not fit is not counted
    assert scan([["c", "a", "b"]], ns, (("cpu", 2.0),), enough=1) == "a"
    assert scan([["c", "a", "b"]], ns, (("cpu", 2.0),), enough=2) == "b"
    # nor one reserved or lost
    assert scan([["b", "a", "c"]], ns, CPU1, reserved={"b": "s"}, enough=1) == "a"
    ns["b"].alive = False
    assert scan([["b", "a", "c"]], ns, CPU1, enough=1) == "a"


def test_at_most_most_names_are_looked_at_across_groups() -> None:
    ns = cluster()
    groups = [["a", "b"], ["c", "d"]]
    assert scan(groups, ns, CPU1, most=1) == "a"
    assert scan(groups, ns, CPU1, most=2) == "b"
    assert scan(groups, ns, CPU1, most=3) == "c"
    assert scan(groups, ns, CPU1, most=0) is None
    # reserved, lost and too-small names count towards the bound
    assert scan([["c", "a", "b"]], ns, CPU1, reserved={"c": "s"}, most=2) == "a"
    assert scan([["c", "a", "b"]], ns, (("cpu", 2.0),), most=2) == "a"
    ns["c"].alive = False
    assert scan([["c", "a", "b"]], ns, CPU1, most=2) == "a"


def test_a_warm_node_first_then_the_least_leftover() -> None:
    ns = cluster()
    ns["a"].warm["python"] = 1
    ns["d"].warm["python"] = 2
    ns["b"].warm["go"] = 1
    order = [["a", "b", "c", "d"]]
    assert scan(order, ns, CPU1, warm_key="python") == "d"
    assert scan([["a", "b", "c"]], ns, CPU1, warm_key="python") == "a"
    assert scan([["c", "b", "a"]], ns, CPU1, warm_key="python") == "a"
    assert scan(order, ns, CPU1, warm_key="go") == "b"
    assert scan(order, ns, CPU1, warm_key="rust") == "c"
    assert scan(order, ns, CPU1) == "c"
    # a warm count of 0 is not warm
    ns["c"].warm["zig"] = 0
    ns["a"].warm["zig"] = 1
    assert scan(order, ns, CPU1, warm_key="zig") == "a"
    # with no warm key, a node's "" entry does not count
    ns["a"].warm[""] = 1
    assert scan(order, ns, CPU1) == "c"


def test_a_warm_node_is_not_given_up_for_a_cold_one_with_less_leftover() -> None:
    ns = cluster()
    ns["b"].warm["py"] = 1
    assert scan([["b", "c"]], ns, CPU1, warm_key="py") == "b"
    assert scan([["c", "b"]], ns, CPU1, warm_key="py") == "b"
    ns["a"].warm["py"] = 1
    assert scan([["a", "c", "b"]], ns, CPU1, warm_key="py") == "b"
    assert scan([["b", "c", "a"]], ns, CPU1, warm_key="py") == "b"


# ---- every dimension but CPU -------------------------------------------------------------------


def test_fits_besides_cpu() -> None:
    n = node("n", cpu=1, memory_mb=100)
    assert fits_besides_cpu(n, (("cpu", 8.0), ("memory_mb", 100.0))) is True
    assert fits_besides_cpu(n, (("cpu", 8.0),)) is True
    assert fits_besides_cpu(n, (("cpu", 0.5), ("memory_mb", 100.0 + 1e-9))) is True
    assert fits_besides_cpu(n, (("cpu", 0.5), ("memory_mb", 100.0 + 3e-9))) is False
    assert fits_besides_cpu(n, (("memory_mb", 150.0),)) is False
    assert fits_besides_cpu(n, (("gpu", 0.5),)) is False
    assert fits_besides_cpu(n, (("gpu", 1e-9),)) is True
    assert fits_besides_cpu(n, ()) is True
    n.take({"memory_mb": 60.0})
    assert fits_besides_cpu(n, (("memory_mb", 40.0),)) is True
    assert fits_besides_cpu(n, (("memory_mb", 50.0),)) is False
