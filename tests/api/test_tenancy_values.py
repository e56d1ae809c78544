"""api/tenancy.py's values (issue 43 item 2: survivors of `make mutation` on it): the tenants'
quotas are reserved in the service-wide caps only while they add up to at most the cap (equal
included), and past it a warning names the quota, the sum and the cap, word for word.

The survivors read after that (docs/testing.md, "Tenancy, left"), over a fake engine: the places
kept for others (quota less what each holds, never below 0) and the shed count; what is counted
against max_concurrent_actions and cpu_share (each started action not answered yet; CPU only,
the cluster's CPUs from nodes that have CPU; the 1e-9 tolerance); how many owners and closed
sessions are remembered (max_pending + max_results, the oldest forgotten, a running action
kept); idempotency keys' scope; the default tenant's and a long name's images; the 404/403/429
messages word for word; hidden warm keys added up."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from arl_tangram.api.tenancy import QuotaExceeded, Tenancy
from arl_tangram.core.actions import ActionKind as Kind
from arl_tangram.core.actions import ActionSpec
from arl_tangram.core.images import check_name
from arl_tangram.core.resources import Resources
from arl_tangram.core.view import NodeView
from arl_tangram.runtime.config import LimitsConfig, ServiceConfig, TenantConfig
from arl_tangram.runtime.engine import Overloaded, UnknownAction
from arl_tangram.runtime.views import NodeRow

A = "alice-token-0123456789abcdef"
B = "bob-token-0123456789abcdef"


class _Engine:
    nodes: dict = {}


def _tenancy(alice: int, bob: int, cap: int = 3) -> Tenancy:
    cfg = ServiceConfig(
        limits=LimitsConfig(max_sessions=cap, max_pending=cap),
        tenants=(TenantConfig(name="alice", token=A, max_sessions=alice, max_concurrent_actions=alice),
                 TenantConfig(name="bob", token=B, max_sessions=bob, max_concurrent_actions=bob)))
    return Tenancy(_Engine(), cfg)  # type: ignore[arg-type]


def test_quotas_adding_up_to_the_cap_exactly_are_reserved_without_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="arl_tangram.api.tenancy"):
        t = _tenancy(1, 2)
    assert caplog.messages == []
    # alice asks: bob's 2 places are kept for him, and 1 of alice's for her when bob asks
    assert (t.reserved_sessions("alice"), t.reserved_sessions("bob")) == (2, 1)
    assert (t._reserved_actions("alice"), t._reserved_actions("bob")) == (2, 1)


def test_quotas_past_the_cap_reserve_nothing_and_say_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="arl_tangram.api.tenancy"):
        t = _tenancy(2, 2)
    assert caplog.messages == [
        "tenants' max_sessions add up to 4, more than the service's 3: no share of it is "
        "reserved for them",
        "tenants' max_concurrent_actions add up to 4, more than the service's 3: no share of it "
        "is reserved for them"]
    assert (t.reserved_sessions("alice"), t._reserved_actions("alice")) == (0, 0)


# ---- the survivors read after a322bb7 (each test below fails with the mutant it names) ------


class _Held:
    """An engine as `Tenancy` reads it: actions running or finished (else unknown, as the
    engine's `peek`), sessions open, images held (names checked as the nodes' stores do), the
    nodes' capacities and the shed count."""

    def __init__(self, *caps: Resources) -> None:
        self.nodes = {f"n{i}": SimpleNamespace(capacity=c) for i, c in enumerate(caps)}
        self.running: set[str] = set()
        self.done: dict[str, object] = {}
        self.sessions: set[str] = set()
        self.images: set[str] = set()
        self.stats_book = SimpleNamespace(shed=5)

    def peek(self, aid: str) -> object:
        if aid in self.done:
            return self.done[aid]
        if aid in self.running:
            return None
        raise UnknownAction(aid)

    def live_count(self) -> int:
        return len(self.running)

    def has_session(self, sid: str) -> bool:
        return sid in self.sessions

    def has_image(self, name: str) -> bool:
        check_name(name)  # (ImageError for a name that is not valid, as the image store)
        return name in self.images


def _with(eng: _Held, *tenants: TenantConfig, pending: int = 100, results: int = 100,
          sessions: int = 100) -> Tenancy:
    cfg = ServiceConfig(limits=LimitsConfig(max_pending=pending, max_results=results,
                                            max_sessions=sessions), tenants=tenants)
    return Tenancy(eng, cfg)  # type: ignore[arg-type]


def _act(aid: str, **demand: float) -> ActionSpec:
    return ActionSpec(aid, kind=Kind.CUSTOM, demand=Resources(demand))


def _start(t: Tenancy, eng: _Held, tenant: str, *specs: ActionSpec) -> None:
    t.admit(tenant, specs)
    for s in specs:
        eng.running.add(s.id)
    t.started(tenant, specs)


def test_nothing_is_reserved_for_tenants_without_quotas() -> None:
    t = _with(_Held(), TenantConfig(name="alice", token=A), TenantConfig(name="bob", token=B),
              sessions=2, pending=2)
    assert (t.reserved_sessions("alice"), t._reserved_actions("alice")) == (0, 0)


def test_the_places_kept_for_a_tenant_are_its_quota_less_what_it_holds() -> None:
    eng = _Held(Resources(cpu=64))
    t = _with(eng, TenantConfig(name="alice", token=A, max_sessions=1, max_concurrent_actions=1),
              TenantConfig(name="bob", token=B, max_sessions=3, max_concurrent_actions=3),
              sessions=4, pending=4)
    assert (t.reserved_sessions("alice"), t._reserved_actions("alice")) == (3, 3)
    eng.sessions.add("b1")
    t.own_session("bob", "b1")
    _start(t, eng, "bob", _act("b-1", cpu=1))
    assert (t.reserved_sessions("alice"), t._reserved_actions("alice")) == (2, 2)
    for sid in ("b2", "b3"):
        eng.sessions.add(sid)
        t.own_session("bob", sid)
    _start(t, eng, "bob", _act("b-2", cpu=1), _act("b-3", cpu=1))
    # bob at his quotas: nothing kept for him; alice's one place kept when bob asks
    assert (t.reserved_sessions("alice"), t._reserved_actions("alice")) == (0, 0)
    assert (t.reserved_sessions("bob"), t._reserved_actions("bob")) == (1, 1)


def test_a_submit_into_others_kept_places_is_shed_and_counted() -> None:
    eng = _Held(Resources(cpu=64))
    t = _with(eng, TenantConfig(name="alice", token=A, max_concurrent_actions=1),
              TenantConfig(name="bob", token=B, max_concurrent_actions=3), pending=4)
    _start(t, eng, "alice", _act("a-1", cpu=1))
    with pytest.raises(Overloaded) as e:
        t.admit("alice", [_act("a-2"), _act("a-3")])
    assert str(e.value) == ("1 actions pending and 3 places kept for tenants below their "
                            "max_concurrent_actions (max_pending=4); retry later")
    assert eng.stats_book.shed == 5 + 2


def test_results_and_sessions_no_tenant_holds_are_ignored() -> None:
    """The engine tells every delivery and every session gone; those of no capped tenant (no
    auth, an uncapped tenant) are not Tenancy's: its listeners do not raise on them (the
    engine would log a failed listener for each)."""
    t = _with(_Held(), TenantConfig(name="alice", token=A))
    t._delivered(SimpleNamespace(id="someone-elses"))
    t._gone("no-tenants", "closed")
    assert t.session_was("alice", "no-tenants") is False


def _open_close(t: Tenancy, eng: _Held, tenant: str, sid: str) -> None:
    eng.sessions.add(sid)
    t.own_session(tenant, sid)
    eng.sessions.discard(sid)
    t._gone(sid, "closed")


def test_closed_sessions_are_remembered_up_to_pending_plus_results_newest_kept() -> None:
    eng = _Held()
    t = _with(eng, TenantConfig(name="alice", token=A), pending=1, results=1)  # bound 2
    _open_close(t, eng, "alice", "s1")
    _open_close(t, eng, "alice", "s2")
    assert [t.session_was("alice", s) for s in ("s1", "s2")] == [True, True]
    _open_close(t, eng, "alice", "s3")
    assert [t.session_was("alice", s) for s in ("s1", "s2", "s3")] == [False, True, True]
    assert t.session_was("bob", "s3") is False


def test_a_session_id_open_again_is_the_newest_closed_when_it_closes_again() -> None:
    eng = _Held()
    t = _with(eng, TenantConfig(name="alice", token=A), TenantConfig(name="bob", token=B),
              pending=1, results=1)  # bound 2
    _open_close(t, eng, "alice", "s1")
    _open_close(t, eng, "alice", "s2")
    _open_close(t, eng, "bob", "s1")  # (the id free again: bob's now)
    _open_close(t, eng, "alice", "s3")  # s2, the oldest closed, is forgotten
    assert [t.session_was("bob", "s1"), t.session_was("alice", "s1")] == [True, False]
    assert [t.session_was("alice", s) for s in ("s2", "s3")] == [False, True]


def test_a_session_gone_before_it_was_owned_holds_no_place() -> None:
    eng = _Held()
    t = _with(eng, TenantConfig(name="alice", token=A, max_sessions=1))
    t.own_session("alice", "gone-at-once")  # (the engine no longer has it)
    assert t.session_visible("alice", "gone-at-once") is False
    t.admit_session("alice")  # its one place is free
    eng.sessions.add("s1")
    t.own_session("alice", "s1")
    with pytest.raises(QuotaExceeded) as e:
        t.admit_session("alice")
    assert str(e.value) == ("tenant 'alice': 1 sessions open (its max_sessions=1); close one "
                            "(DELETE /v1/sessions/{id}) or retry later")


def test_cpu_share_counts_only_cpu_and_the_cluster_cpus_of_nodes_with_cpu() -> None:
    """A GPU-only node (no ``cpu`` in its capacity) adds no CPU to the cluster's; an action
    demanding no CPU takes none of the share, even once the tenant is over it (a node lost)."""
    eng = _Held(Resources(cpu=4, memory_mb=1024), Resources(gpu=1, gpu_memory_mb=1000))
    t = _with(eng, TenantConfig(name="alice", token=A, cpu_share=0.5))
    _start(t, eng, "alice", _act("gpu-1", gpu=1), _act("cpu-1", cpu=1.5))
    with pytest.raises(QuotaExceeded) as e:
        t.admit("alice", [_act("cpu-2", cpu=1)])
    assert str(e.value) == ("tenant 'alice': its unfinished actions demand 1.5 CPUs, 1 more "
                            "would pass its cpu_share=0.5 of the cluster's 4 (2 CPUs); retry "
                            "when some of its actions have finished")
    eng.nodes["n0"] = SimpleNamespace(capacity=Resources(cpu=2))  # (now 1 CPU allowed, 1.5 held)
    t.admit("alice", [_act("gpu-2", gpu=1)])


def test_a_demand_at_the_cpu_share_plus_its_tolerance_is_admitted() -> None:
    eng = _Held(Resources(cpu=4))
    t = _with(eng, TenantConfig(name="alice", token=A, cpu_share=0.5))
    t.admit("alice", [_act("a-1", cpu=2.0 + 1e-9)])  # (allowed + 1e-9 exactly)


def test_every_started_action_not_answered_yet_is_counted() -> None:
    eng = _Held(Resources(cpu=64))
    t = _with(eng, TenantConfig(name="alice", token=A, max_concurrent_actions=4))
    specs = [_act(f"a-{i}", cpu=1) for i in range(4)]
    t.admit("alice", specs)
    eng.done["a-0"] = object()  # answered at once
    eng.running.update({"a-2", "a-3"})  # a-1: refused by the engine (unknown)
    t.started("alice", specs)  # a-2 and a-3 held
    with pytest.raises(QuotaExceeded) as e:
        t.admit("alice", [_act(f"b-{i}") for i in range(3)])
    assert str(e.value).startswith("tenant 'alice': 2 actions unfinished, 3 more would pass "
                                   "its max_concurrent_actions=4;")


def test_owners_are_kept_for_pending_plus_results_ids_a_running_one_longer() -> None:
    eng = _Held()
    t = _with(eng, TenantConfig(name="alice", token=A), TenantConfig(name="bob", token=B),
              pending=1, results=1)  # bound 2
    eng.done.update({"a-1": object(), "a-2": object()})
    t.own("alice", ["a-1", "a-2"])
    assert [t.owner("a-1"), t.owner("a-2")] == ["alice", "alice"]
    t.check_action("alice", "a-1")
    eng.running.add("b-1")
    t.own("bob", ["b-1"])  # the oldest, a-1 (finished), is forgotten
    assert [t.owner(a) for a in ("a-1", "a-2", "b-1")] == [None, "alice", "bob"]
    with pytest.raises(UnknownAction) as e:
        t.check_action("alice", "a-1")
    assert e.value.args == ("a-1",)
    del eng.done["a-2"]  # (the engine forgot it)
    t.own("alice", ["a-3"])
    assert [t.owner(a) for a in ("a-2", "b-1", "a-3")] == [None, "bob", "alice"]
    # b-1, still running, is the oldest: kept (moved to the newest end), its owner still known
    t.own("alice", ["a-4"])
    assert [t.owner(a) for a in ("b-1", "a-3", "a-4")] == ["bob", "alice", "alice"]
    t.check_action("bob", "b-1")


def test_idempotency_keys_are_scoped_by_tenant_name_and_a_unit_separator() -> None:
    t = _with(_Held(), TenantConfig(name="alice", token=A))
    assert t.idempotency_key("alice", "k") == "alice\x1fk"
    assert t.idempotency_key(None, "k") == "k"
    assert t.idempotency_key("alice", None) is None


def test_the_default_tenant_uses_shared_images_not_a_tenants_own() -> None:
    eng = _Held()
    eng.images.update({"py", "alice+py"})
    t = _with(eng, TenantConfig(name="default", token=B), TenantConfig(name="alice", token=A))
    assert t.image_for_use("default", "py") == "py"
    assert t.image_for_use("default", "alice+py") is None
    with pytest.raises(ValueError) as e:
        t.image_for_import("default", "alice+py")
    assert str(e.value) == "image names starting with a tenant's name and '+' are that tenant's"


def test_a_shared_image_whose_prefixed_name_is_too_long_is_the_shared_one() -> None:
    """``alice+`` and a valid 125-character name make a name the stores refuse (at most 128):
    alice means the shared image, and may not remove it (403)."""
    long = "i" * 125
    eng = _Held()
    eng.images.add(long)
    t = _with(eng, TenantConfig(name="alice", token=A))
    assert t.image_for_use("alice", long) == long
    with pytest.raises(PermissionError) as e:
        t.image_for_remove("alice", long)
    assert str(e.value) == (f"image {long!r} is shared (the operator's): only the 'default' "
                            "tenant removes it")


def test_removing_an_image_one_does_not_see_is_404_naming_it() -> None:
    eng = _Held()
    eng.images.add("bob+x")
    t = _with(eng, TenantConfig(name="default", token=B), TenantConfig(name="alice", token=A),
              TenantConfig(name="bob", token="bob-token-xxxxxxxxxxxxxxxx"))
    for tenant, name in (("default", "bob+x"), ("alice", "nothing"), ("alice", "bob+x")):
        with pytest.raises(LookupError) as e:
            t.image_for_remove(tenant, name)
        assert str(e.value) == f"no image {name!r}"


def test_hidden_warm_keys_on_a_node_are_added_up() -> None:
    t = _with(_Held(), TenantConfig(name="alice", token=A),
              TenantConfig(name="bob", token="bob-token-xxxxxxxxxxxxxxxx"))
    core = NodeView(name="n0", pool="cpu", capacity=Resources(cpu=4), used=Resources(),
                    free=Resources(cpu=4), running=0, alive=True,
                    warm={"image:bob+x": 2, "image:bob+y": 3, "image:alice+z": 1, "cpu": 4})
    row = t._node_view("alice", NodeRow(core=core))
    assert dict(row.core.warm) == {"image:z": 1, "cpu": 4}
    assert dict(row.of_others) == {"warm_of_others": 5}
