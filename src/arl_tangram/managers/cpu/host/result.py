"""Results of CPU actions, in SandboxFusion's RunCodeResponse shape plus our extras.

Invariant: `RunResult.to_dict()` always has SandboxFusion's keys (status, message, compile_result,
run_result, executor_pod_name, files) with its value sets; stage stdout/stderr are strings, never
null. Our extras (memory_exceeded, output_truncated, cpu_time, peak_memory_mb, cases) are
additional keys, so a SandboxFusion client ignores them.

This module is the one owner of that shape: the CPU manager builds it once (`to_dict`), and
``POST /run_code`` answers with it unchanged (`run_code_response`, which also gives the shape to
an action no sandbox answered: timed out before it ran, cancelled, its node lost).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from arl_tangram.core.actions import Status

# Run statuses (SandboxFusion RunStatus) and stage statuses (CommandRunStatus).
SUCCESS, FAILED, SANDBOX_ERROR = "Success", "Failed", "SandboxError"
FINISHED, ERROR, TIME_LIMIT = "Finished", "Error", "TimeLimitExceeded"
RUN_STATUSES = (SUCCESS, FAILED, SANDBOX_ERROR)


@dataclass(frozen=True, slots=True)
class StageResult:
    """One compile or run stage (SandboxFusion CommandRunResult)."""

    status: str  # Finished | Error | TimeLimitExceeded
    execution_time: float | None = None  # wall seconds
    return_code: int | None = None  # exit code; -N when killed by signal N
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False  # stdout or stderr went past the output cap

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "execution_time": self.execution_time,
                "return_code": self.return_code, "stdout": self.stdout, "stderr": self.stderr}

    @classmethod
    def from_wire(cls, d: dict[str, Any] | None) -> StageResult | None:
        if d is None:
            return None
        return cls(status=str(d["status"]), execution_time=d.get("execution_time"),
                   return_code=d.get("return_code"), stdout=str(d.get("stdout") or ""),
                   stderr=str(d.get("stderr") or ""), truncated=bool(d.get("truncated")))

    @property
    def ok(self) -> bool:
        return self.status == FINISHED and self.return_code == 0


@dataclass(frozen=True, slots=True)
class CaseResult:
    """One test case of a TEST action."""

    index: int
    passed: bool
    run: StageResult | None  # None when skipped (stop_on_first_failure)
    skipped: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "passed": self.passed, "skipped": self.skipped,
                "run_result": self.run.to_dict() if self.run else None}


@dataclass(frozen=True, slots=True)
class RunResult:
    """What a CPU action produced."""

    status: str  # Success | Failed | SandboxError
    message: str = ""
    compile_result: StageResult | None = None
    run_result: StageResult | None = None
    executor_pod_name: str | None = None  # the node / sandbox that ran it
    files: dict[str, str] = field(default_factory=dict)  # fetched files, path -> base64
    memory_exceeded: bool = False  # the memory cgroup killed something
    output_truncated: bool = False  # some stdout/stderr was dropped past the cap
    cpu_time: float | None = None  # CPU seconds the whole sandbox used
    peak_memory_mb: float | None = None  # peak memory of the sandbox
    cases: tuple[CaseResult, ...] | None = None  # TEST actions: one per case
    # session actions: what thawing, re-quota and freezing the session cost (`overlay`)
    session_switch: dict[str, Any] | None = None
    # the action's own `timeout_s` ended it (a TEST action's cases together; the message says
    # how many finished): timed out even when no stage was running at that moment
    timeout_s_exceeded: bool = False

    @classmethod
    def sandbox_error(cls, message: str, pod: str | None = None) -> RunResult:
        return cls(status=SANDBOX_ERROR, message=message, executor_pod_name=pod)

    @property
    def timed_out(self) -> bool:
        if self.timeout_s_exceeded:
            return True
        stages = [self.compile_result, self.run_result]
        stages += [c.run for c in self.cases or ()]
        return any(s is not None and s.status == TIME_LIMIT for s in stages)

    @property
    def action_status(self) -> Status:
        if self.status == SUCCESS:
            return Status.SUCCEEDED
        if self.timed_out:
            return Status.TIMED_OUT
        return Status.FAILED

    def to_dict(self, extras: bool = True) -> dict[str, Any]:
        """SandboxFusion's RunCodeResponse; with ``extras``, our keys after its own."""
        d: dict[str, Any] = {
            "status": self.status,
            "message": self.message,
            "compile_result": self.compile_result.to_dict() if self.compile_result else None,
            "run_result": self.run_result.to_dict() if self.run_result else None,
            "executor_pod_name": self.executor_pod_name,
            "files": dict(self.files),
        }
        if not extras:
            return d
        d.update({
            "memory_exceeded": self.memory_exceeded,
            "output_truncated": self.output_truncated,
            "cpu_time": self.cpu_time,
            "peak_memory_mb": self.peak_memory_mb,
        })
        if self.cases is not None:
            d["cases"] = [c.to_dict() for c in self.cases]
        if self.session_switch is not None:
            d["session_switch"] = dict(self.session_switch)
        return d


def run_code_response(output: Any, status: Status, reason: str,
                      pod: str | None) -> dict[str, Any]:
    """A finished CODE action as SandboxFusion's RunCodeResponse: ``output`` as the CPU manager
    built it (`RunResult.to_dict`, extras kept; ``pod`` where it names none), else the shape of
    an action no sandbox answered, from its ``status`` and ``reason``."""
    if isinstance(output, Mapping) and output.get("status") in RUN_STATUSES:
        d = dict(output)
        for key, empty in (("message", ""), ("compile_result", None), ("run_result", None),
                           ("files", {})):  # (what a producer other than RunResult left out)
            d.setdefault(key, empty)
        d.setdefault("executor_pod_name", pod)
        return d
    reason = reason or status.name.lower()
    if status == Status.TIMED_OUT:
        return RunResult(status=FAILED, message=reason, run_result=StageResult(TIME_LIMIT),
                         executor_pod_name=pod).to_dict(extras=False)
    return RunResult.sandbox_error(f"{status.name.lower()}: {reason}", pod).to_dict(extras=False)
