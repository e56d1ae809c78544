"""The isolation report (managers/cpu/host/isolation.py `report`/`missing`) from what the fork
server said and what the probe saw inside a sandbox, unit by unit: each property is true only
on its own evidence, an error or no probe makes every sandbox property false, and every problem
is named (issue 27, mutation testing: the report only ever met a fully isolating machine)."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest

from arl_tangram.managers.cpu import CpuManagerConfig
from arl_tangram.managers.cpu.host.isolation import REQUIRED, missing, report

CFG = CpuManagerConfig(sandbox_uid=4242, hostname="box", sandbox_id_count=0)  # one shared uid
HELLO = {"ok": True, "filter": ["ptrace"]}
SEEN: dict[str, Any] = {"pid1": True, "ro": True, "ifaces": ["lo"], "lo_up": False,
                        "hostname": "box", "cwd": "/workdir", "uid": 4242, "nnp": True,
                        "core0": True, "cgroup": True, "hidden": [], "filter": True}
ROOT = os.geteuid() == 0
PROBED = ("pid_namespace", "mount_namespace", "network_namespace", "ipc_namespace",
          "uts_namespace", "readonly_system", "private_workdir", "unprivileged_user",
          "no_new_privs", "rlimits", "host_paths_hidden", "syscall_filter")


def _cg(version: str | None = "v1", problem: str | None = None) -> Any:
    return SimpleNamespace(version=version, problem=problem)


def _false(rep: dict[str, bool | str]) -> set[str]:
    return {k for k in REQUIRED if k != "root" and rep[k] is not True}


def test_a_fully_isolating_sandbox() -> None:
    rep = report(HELLO, SEEN, _cg(), CFG)
    assert _false(rep) == set() and "problems" not in rep and rep["cgroup_version"] == "v1"
    assert missing(rep) == ([] if ROOT else ["root"])


@pytest.mark.parametrize(("seen", "false"), [
    ({"pid1": False}, {"pid_namespace", "ipc_namespace"}),
    ({"ro": False}, {"mount_namespace", "readonly_system"}),
    ({"ifaces": ["lo", "eth0"]}, {"network_namespace"}),
    ({"lo_up": True}, {"network_namespace"}),
    ({"hostname": "host"}, {"uts_namespace"}),
    ({"cwd": "/"}, {"private_workdir"}),
    ({"uid": 0}, {"unprivileged_user"}),
    ({"nnp": False}, {"no_new_privs"}),
    ({"core0": False}, {"rlimits"}),
    ({"cgroup": False}, {"cgroup_memory", "cgroup_pids", "cgroup_cpu"}),
    ({"filter": False}, {"syscall_filter"}),
])
def test_each_property_rests_on_its_own_evidence(seen: dict[str, Any], false: set[str]) -> None:
    rep = report(HELLO, {**SEEN, **seen}, _cg(), CFG)
    assert _false(rep) == false and "problems" not in rep


def test_visible_host_paths_are_named() -> None:
    rep = report(HELLO, {**SEEN, "hidden": ["/srv/tangram"]}, _cg(), CFG)
    assert _false(rep) == {"host_paths_hidden"}
    assert rep["problems"] == "host paths visible in the sandbox: ['/srv/tangram']"


def test_a_fork_server_without_its_filter_fails_the_filter_and_says_why() -> None:
    rep = report({"ok": True, "filter_error": "libseccomp: export: Out of memory"}, SEEN, _cg(),
                 CFG)
    assert _false(rep) == {"syscall_filter"}
    assert rep["problems"] == "libseccomp: export: Out of memory"


@pytest.mark.parametrize("seen", [None, {}, {"error": "probe failed: Timeout"}])
def test_no_probe_or_a_failed_one_leaves_no_sandbox_property_true(seen: Any) -> None:
    rep = report(HELLO, seen, _cg(), CFG)
    assert _false(rep) >= set(PROBED) and rep["cgroup_memory"] is False
    assert rep.get("problems") == (None if not seen else "probe failed: Timeout")


def test_every_problem_is_named_in_order() -> None:
    cfg = CpuManagerConfig(sandbox_uid=4242, hostname="box", syscall_filter=False,
                           sandbox_id_count=0)
    rep = report({"ok": False, "error": "fork server died"}, {"error": "cannot spawn"},
                 _cg(None, "no cgroup tree"), cfg)
    assert rep["fork_server"] is False and rep["cgroup_version"] == "none"
    assert rep["problems"] == ("fork server died; cannot spawn; no cgroup tree; "
                               "the syscall filter is off (syscall_filter=False)")
    assert set(missing(rep)) >= {"fork_server", *PROBED}


@pytest.mark.parametrize(("uid", "ok"), [(1 << 29, True), ((1 << 29) + 65535, True),
                                         ((1 << 29) - 1, False), ((1 << 29) + 65536, False),
                                         (65534, False), (4242, False), (0, False)])
def test_with_sandbox_ids_the_probe_ran_as_one_of_the_nodes_ids(uid: int, ok: bool) -> None:
    """(issue 35, M2) The default: each sandbox on an id of its own from the node's range; the
    shared `sandbox_uid` (65534, nobody) or any id outside the range is not isolation."""
    cfg = CpuManagerConfig(sandbox_uid=4242, hostname="box")
    assert (cfg.sandbox_id_base, cfg.sandbox_id_count) == (1 << 29, 65536)
    rep = report(HELLO, {**SEEN, "uid": uid}, _cg(), cfg)
    assert _false(rep) == (set() if ok else {"unprivileged_user"})
