"""The outcome of a CPU action, as the manager's modules name it: `arl_tangram.kinds`' typed
`RunResult` (SandboxFusion's RunCodeResponse, plus our extras) and its statuses.

The shape's one owner is `arl_tangram.kinds`; only `api/` renders it. This module gives the
manager's modules its names (and the status members under the names they had here).
"""

from __future__ import annotations

from arl_tangram.kinds import CaseResult, CommandRunStatus, RunResult, RunStatus, StageResult

# Run statuses (SandboxFusion RunStatus) and stage statuses (CommandRunStatus).
SUCCESS, FAILED, SANDBOX_ERROR = RunStatus.Success, RunStatus.Failed, RunStatus.SandboxError
FINISHED, ERROR, TIME_LIMIT = (CommandRunStatus.Finished, CommandRunStatus.Error,
                               CommandRunStatus.TimeLimitExceeded)

__all__ = ["ERROR", "FAILED", "FINISHED", "SANDBOX_ERROR", "SUCCESS", "TIME_LIMIT", "CaseResult",
           "RunResult", "StageResult"]
