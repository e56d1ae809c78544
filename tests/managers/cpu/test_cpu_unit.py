"""Unit tests of the CPU manager's pure parts: config, payload validation, result shape."""

from __future__ import annotations

import asyncio
import base64
import math

import pytest

from arl_tangram.core.actions import ActionKind, ActionSpec, Elasticity, Status
from arl_tangram.core.errors import InvalidAction
from arl_tangram.core.resources import Resources
from arl_tangram.kinds import CaseResult, CodeRequest, RunResult, StageResult
from arl_tangram.managers import cpu
from arl_tangram.managers.cpu.host.languages import Language
from arl_tangram.managers.cpu.host.payload import (
    build_request,
    machine_cpus,
    memory_bytes,
    visible_cpus,
)

LANGS = {"python": Language("python", "main.py", None, None, "py"),
         "cpp": Language("cpp", "main.cpp", ("/usr/bin/g++", "{file}"), ("./main",), "g++")}
CFG = cpu.CpuManagerConfig(work_root="/tmp/x")


def test_exports() -> None:
    assert set(cpu.__all__) == {"POOL_KEY", "CaseResult", "CpuManager", "CpuManagerConfig",
                                "RunResult", "StageResult"}


@pytest.mark.parametrize(("field", "value"), [
    ("workdir_max_mb", 0), ("sandbox_uid", 0), ("warm_min", -1), ("output_limit_bytes", -5),
    ("work_root", "relative/dir"), ("pids_max", 3), ("default_cpus", 0),
    ("fork_server_max_crashes", 0), ("fork_server_max_crashes", 2.5),
    ("fork_server_crash_window_s", 0), ("fork_server_restart_backoff_s", -0.1),
    ("fork_server_down_retry_s", "30")])
def test_config_rejects_bad_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        cpu.CpuManagerConfig(**{field: value})  # type: ignore[arg-type]


def test_config_fork_server_restart_settings() -> None:
    cfg = cpu.CpuManagerConfig()
    assert (cfg.fork_server_max_crashes, cfg.fork_server_crash_window_s,
            cfg.fork_server_restart_backoff_s, cfg.fork_server_down_retry_s) == (5, 60.0, 0.1, 30.0)
    with pytest.raises(ValueError) as e:
        cpu.CpuManagerConfig(fork_server_max_crashes=True)
    assert str(e.value) == "fork_server_max_crashes must be an integer >= 1, got True"
    with pytest.raises(ValueError) as e:
        cpu.CpuManagerConfig(fork_server_down_retry_s=0.0)
    assert str(e.value) == "fork_server_down_retry_s must be a positive number, got 0.0"


def test_config_warm_max_below_min() -> None:
    with pytest.raises(ValueError, match="warm_max"):
        cpu.CpuManagerConfig(warm_min=5, warm_max=2)


def _req(payload: dict, kind: ActionKind = ActionKind.CODE, **kw: object) -> dict:
    return build_request(ActionSpec(id="a", kind=kind, payload=payload, **kw),  # type: ignore[arg-type]
                         Resources(cpu=2, memory_mb=300), LANGS, CFG)


@pytest.mark.parametrize(("payload", "field"), [
    ({}, "payload.code"),
    ({"code": 5}, "payload.code"),
    ({"code": "x", "language": "cobol"}, "payload.language"),
    ({"code": "x", "language": "go"}, "payload.language"),
    ({"code": "x", "run_timeout": -1}, "payload.run_timeout"),
    ({"code": "x", "files": {"../etc/passwd": ""}}, "payload.files"),
    ({"code": "x", "files": {"/etc/passwd": ""}}, "payload.files"),
    ({"code": "x", "files": {"a.txt": "***"}}, "payload.files"),
    ({"code": "x", "fetch_files": ["../../x"]}, "payload.fetch_files"),
    ({"code": "x", "stdin": 3}, "payload.stdin"),
])
def test_bad_payload_names_the_field(payload: dict, field: str) -> None:
    with pytest.raises(InvalidAction) as e:
        _req(payload)
    assert e.value.field == field


def test_test_payload_needs_cases_and_python_for_asserts() -> None:
    with pytest.raises(InvalidAction, match=r"payload\.cases"):
        _req({"code": "x"}, ActionKind.TEST)
    with pytest.raises(InvalidAction, match=r"cases\[0\].assert"):
        _req({"code": "x", "language": "cpp", "cases": [{"assert": "1"}]}, ActionKind.TEST)


def test_request_carries_allotment_and_limits() -> None:
    b64 = base64.b64encode(b"hi").decode()
    req = _req({"code": "print(1)", "files": {"d/a.txt": b64}, "run_timeout": 3})
    assert req["limits"]["cpus"] == 2 and req["env"]["TANGRAM_CPUS"] == "2"
    assert req["env"]["OMP_NUM_THREADS"] == "2" and req["run_timeout"] == 3
    assert req["files"] == {"d/a.txt": b64} and req["op"] == "run"
    half = build_request(ActionSpec(id="b", payload={"code": "1"}), Resources(cpu=0.5), LANGS, CFG)
    assert half["env"]["OMP_NUM_THREADS"] == "1" and half["limits"]["cpus"] == 0.5


def test_code_is_shown_an_elastic_maximum_and_a_rigid_allotment() -> None:
    def shown(el: Elasticity | None, quota: float, node: int = 4) -> float:
        return visible_cpus(ActionSpec(id="v", elasticity=el), quota, node)

    assert shown(None, 1) == 1 and shown(None, 0.5) == 0.5 and shown(None, 8) == 8  # rigid
    assert shown(Elasticity(2, 2), 2) == 2  # min == max: rigid
    assert shown(Elasticity(1, 3), 1) == 3 and shown(Elasticity(1, 3), 2.5) == 3
    assert shown(Elasticity(1, 16), 1) == 4  # at most the node's cores
    assert shown(Elasticity(1, 4, dim="gpu"), 1) == 1  # another dimension stretches
    el = ActionSpec(id="e", payload={"code": "1"}, elasticity=Elasticity(1, 64))
    req = build_request(el, Resources(cpu=1), LANGS, CFG)
    n = machine_cpus()
    assert req["quota"] == 1 and req["limits"]["cpus"] == n
    assert req["env"]["TANGRAM_CPUS"] == str(n) and req["env"]["OMP_NUM_THREADS"] == str(n)
    longest = max(req["run_timeout"], req["compile_timeout"])
    assert req["limits"]["cpu_s"] == math.ceil(longest * n) + 1  # RLIMIT_CPU for n cores


def test_memory_limit_smaller_payload_wins() -> None:
    assert memory_bytes(CodeRequest(code="", memory_limit_MB=100), Resources(memory_mb=300),
                        CFG) == 100 << 20
    assert memory_bytes(CodeRequest(code="", memory_limit_MB=900), Resources(memory_mb=300),
                        CFG) == 300 << 20
    assert memory_bytes(CodeRequest(code=""), Resources(), CFG) == CFG.default_memory_mb << 20


def test_session_payload_language_is_checked() -> None:
    with pytest.raises(InvalidAction, match=r"payload\.language"):
        _req({"code": "x", "language": "cpp"}, ActionKind.TOOL, session="s1")
    assert _req({"code": "x"}, ActionKind.TOOL, session="s1")["op"] == "session"


def test_result_shape_matches_sandboxfusion() -> None:
    r = RunResult(status="Success", run_result=StageResult("Finished", 0.01, 0, "1\n", ""))
    d = r.to_dict()
    for key in ("status", "message", "compile_result", "run_result", "executor_pod_name", "files"):
        assert key in d
    assert d["compile_result"] is None
    assert set(d["run_result"]) == {"status", "execution_time", "return_code", "stdout", "stderr"}
    assert r.action_status is Status.SUCCEEDED
    tle = RunResult(status="Failed", run_result=StageResult("TimeLimitExceeded", 1.0, -9))
    assert tle.action_status is Status.TIMED_OUT
    assert RunResult.sandbox_error("boom").action_status is Status.FAILED
    case = RunResult(status="Failed", cases=(CaseResult(0, False, None, skipped=True),))
    assert case.to_dict()["cases"][0] == {"index": 0, "passed": False, "skipped": True,
                                          "run_result": None}


def test_libc_calls_take_plain_ints_and_report_errors() -> None:
    """The ctypes wrappers pass ints unwrapped: out-of-range values are refused before the call,
    and a failing call raises OSError with its errno."""
    from arl_tangram.managers.cpu import _linux

    assert _linux.prctl(_linux.PR_GET_NO_NEW_PRIVS) in (0, 1)
    with pytest.raises(OverflowError):
        _linux.unshare(1 << 40)
    with pytest.raises(OverflowError):
        _linux.setns(-1, 0)
    with pytest.raises(OSError) as e:
        _linux.setns(987_654, 0)  # not an open fd
    assert e.value.errno == 9  # EBADF


def test_warm_type_cache_looks_up_what_sandbox_code_reads_of_modules() -> None:
    """The fork server pre-fills the type-attribute cache with every ``module.name`` the
    sandbox's code reads (so that no sandbox writes those entries): the names come from that
    code, and only names some module it uses has (a method name like ``append`` is not one)."""
    from arl_tangram.managers.cpu import _linux, wire
    from arl_tangram.managers.cpu.sandbox import child, init, prepared, proc
    from arl_tangram.managers.cpu.zygote import server

    names = server.warm_type_cache((server, init, proc, child, _linux, wire, prepared))
    assert {"mkdir", "setresuid", "F_DUPFD", "closerange", "die_with_parent", "mount",
            "read_request_fd", "raw_signal", "SIG_SETMASK"} <= names  # os, fcntl, _linux, wire
    assert "append" not in names and "items" not in names
    assert server.warm_type_cache((wire,)) < names


def test_fork_server_imports_no_threads_or_manager_side_modules() -> None:
    """Every sandbox is a fork of the fork server: a module it imports costs every action
    (``threading``'s after-fork hook and exit-time shutdown took ~100 page faults and ~0.3 ms
    per action when `layers` was imported on the sandbox side)."""
    import subprocess
    import sys

    heavy = ("threading", "subprocess", "asyncio", "arl_tangram.managers.cpu.host",
             "arl_tangram.managers.cpu.images", "arl_tangram.managers.cpu.images.layers",
             "arl_tangram.managers.cpu.host.manager", "arl_tangram.managers.cpu.host.overlay")
    out = subprocess.run(
        [sys.executable, "-c", "import sys, arl_tangram.managers.cpu.zygote.server; "
         f"print([m for m in {heavy!r} if m in sys.modules])"],
        capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_package_face_imports_nothing_else_of_it() -> None:
    """Importing ``arl_tangram.managers.cpu`` loads none of its modules (the lazy face): the
    fork server imports the package on its way to ``zygote.server``."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", "import sys, arl_tangram.managers.cpu; "
         "print(sorted(m for m in sys.modules if m.startswith('arl_tangram.managers.cpu.')))"],
        capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


async def test_cancel_and_wait() -> None:
    from arl_tangram.managers.cpu.host.tasks import cancel_and_wait

    await cancel_and_wait(None)
    t = asyncio.create_task(asyncio.sleep(60))
    await asyncio.sleep(0)
    await cancel_and_wait(t)
    assert t.cancelled()

    async def fails() -> None:
        raise OSError("gone")

    t2 = asyncio.create_task(fails())
    await asyncio.sleep(0)  # (it raised before the cancel: swallowed, kept on the task)
    await cancel_and_wait(t2)
    assert not t2.cancelled() and str(t2.exception()) == "gone"
