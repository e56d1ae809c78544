"""The start-up isolation probe (managers/cpu/host/isolation.py `probe`): what a sandbox really
lets its code see, and every way the probe itself can fail (issue 27, mutation testing: the probe
only ever met a sandbox that hides everything, so which host paths it looks for, and what it says
when it cannot run, were untested).

A real manager whose sandboxes are given the host paths the probe looks for (read-only binds, the
way a misconfigured `extra_ro_paths` would) must see each of them, name them, and refuse to start;
the failure paths run `probe` on a pool that fails the way a real one can.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import tempfile
from types import SimpleNamespace
from typing import Any

import pytest
from _cpu_helpers import TEST_UID

import arl_tangram
from arl_tangram.core.errors import IsolationUnavailable
from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig
from arl_tangram.managers.cpu.host import isolation

PKG = os.path.dirname(os.path.abspath(arl_tangram.__file__))  # the service's own code


def _exposed() -> list[str]:
    """The host paths the probe checks that a sandbox can be given at their own path (the order
    is the probe's: a bound path under /tmp appears elsewhere inside, see `sandbox_path`)."""
    return [p for p in ("/root/.bashrc", "/home", PKG) if os.path.exists(p)
            and not p.startswith("/tmp/")]


def _cfg(root: str, *, reduced: bool) -> CpuManagerConfig:
    return CpuManagerConfig(work_root=root, sandbox_uid=TEST_UID, sandbox_gid=TEST_UID,
                            warm_min=0, warm_max=1, extra_ro_paths=tuple(_exposed()),
                            allow_reduced_isolation=reduced)


@pytest.mark.needs_root
async def test_host_paths_a_sandbox_can_see_are_named_and_refused() -> None:
    if os.geteuid() != 0:
        pytest.fail("sandboxes need root (namespaces, cgroups)")
    exposed = _exposed()  # (the package too, unless this copy of it lies under /tmp)
    assert "/home" in exposed, (exposed, "this test needs /home on the host")
    root = tempfile.mkdtemp(prefix="tangram-probe-test-")
    try:
        m = CpuManager(_cfg(root, reduced=False))
        with pytest.raises(IsolationUnavailable, match="missing: host_paths_hidden \\("):
            await m.start()  # (only that one: the rest of the sandbox is as isolated as ever)
        m = CpuManager(_cfg(root, reduced=True))
        await m.start()
        try:
            rep = m.isolation_report()
        finally:
            await m.aclose()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert rep["host_paths_hidden"] is False
    assert isolation.missing(rep) == ["host_paths_hidden"], rep
    problems = str(rep["problems"])
    head = "host paths visible in the sandbox: "
    assert head in problems, problems
    seen = ast.literal_eval(problems.split(head, 1)[1].split("]", 1)[0] + "]")
    assert seen == exposed  # each of them, at its own path, and nothing else


class _Sandbox:
    def __init__(self, reply: Any = None, fail: BaseException | None = None,
                 slot: str | None = "slot-0") -> None:
        self.reply, self.fail, self.slot = reply, fail, slot
        self.requests: list[dict[str, Any]] = []

    async def request(self, req: dict[str, Any]) -> Any:
        self.requests.append(req)
        if self.fail is not None:
            raise self.fail
        return self.reply


class _Pool:
    def __init__(self, sb: _Sandbox | None = None, fail: BaseException | None = None) -> None:
        self.sb, self.fail = sb, fail
        self.released: list[Any] = []

    async def spawn(self) -> _Sandbox:
        if self.fail is not None:
            raise self.fail
        assert self.sb is not None
        return self.sb

    def release(self, sb: Any) -> None:
        self.released.append(sb)


CFG = CpuManagerConfig(sandbox_uid=4242, hostname="box")
HELLO = {"ok": True, "filter": ["ptrace"]}


def _cg() -> Any:
    return SimpleNamespace(version="v1", problem=None)


async def _probe(pool: _Pool) -> dict[str, Any]:
    return await isolation.probe(pool, HELLO, _cg(), CFG)  # type: ignore[arg-type]


async def test_what_the_program_printed_is_what_the_probe_saw() -> None:
    out = {"pid1": True, "uid": 4242, "hidden": []}
    for slot, cgroup in (("slot-3", True), (None, False)):
        sb = _Sandbox({"run_result": {"stdout": json.dumps(out) + "\n", "stderr": ""}}, slot=slot)
        pool = _Pool(sb)
        assert await _probe(pool) == {**out, "cgroup": cgroup}  # (a slot: its cgroup is set)
        assert pool.released == [sb] and len(sb.requests) == 1


async def test_a_sandbox_that_cannot_be_spawned_is_the_probes_error() -> None:
    pool = _Pool(fail=OSError("fork server gone"))
    seen = await _probe(pool)
    assert seen == {"error": "cannot spawn a sandbox: fork server gone"}
    assert pool.released == []
    rep = isolation.report(HELLO, seen, _cg(), CFG)
    assert "cannot spawn a sandbox: fork server gone" in str(rep["problems"])
    assert rep["pid_namespace"] is False and "pid_namespace" in isolation.missing(rep)


async def test_a_request_that_fails_is_the_probes_error_and_the_sandbox_is_released() -> None:
    sb = _Sandbox(fail=TimeoutError("no reply within 10 s"))
    pool = _Pool(sb)
    seen = await _probe(pool)
    assert seen == {"error": "probe failed: TimeoutError: no reply within 10 s"}
    assert pool.released == [sb]
    rep = isolation.report(HELLO, seen, _cg(), CFG)
    assert "probe failed: TimeoutError: no reply within 10 s" in str(rep["problems"])


@pytest.mark.parametrize("reply", [
    {"error": "KeyError: 'lang'"},  # the sandbox's init refused the request
    {"run_result": {"stdout": "", "stderr": "sandbox: cannot start: EPERM\n", "return_code": 127}},
    {"run_result": {"stdout": " \n", "stderr": "", "return_code": 0}},
], ids=["init-error", "no-output", "blank-output"])
async def test_a_probe_that_printed_nothing_reports_the_whole_reply(reply: dict[str, Any]) -> None:
    sb = _Sandbox(reply)
    pool = _Pool(sb)
    seen = await _probe(pool)
    assert seen == {"error": str(reply), "cgroup": True}
    assert pool.released == [sb]
    rep = isolation.report(HELLO, seen, _cg(), CFG)
    assert str(reply) in str(rep["problems"])
    assert not any(rep[k] is True for k in ("pid_namespace", "host_paths_hidden"))
