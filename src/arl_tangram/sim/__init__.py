"""Trace-driven discrete-event simulator that drives the same scheduler core as production.

Layers: `loop` (virtual clock + event heap) -> `executor` (answers commands in virtual time) ->
`simulator` (closed-loop trajectories, RL steps) -> `runner` (policies, compare, savings).
`workloads` and `trace` supply trajectories; `metrics` measures ACT, steps and utilization.
"""

from .loop import EventLoop, VirtualClock
from .metrics import SimReport
from .runner import Savings, compare, measured_task_shares, ratios, run_policy, savings
from .simulator import SimConfig, Simulator, group_by_step
from .trace import SessionDef, SimAction, Trajectory, dump_trace, load_trace
from .workloads import WORKLOADS, Workload, get_workload

__all__ = [
    "WORKLOADS",
    "EventLoop",
    "Savings",
    "SessionDef",
    "SimAction",
    "SimConfig",
    "SimReport",
    "Simulator",
    "Trajectory",
    "VirtualClock",
    "Workload",
    "compare",
    "dump_trace",
    "get_workload",
    "group_by_step",
    "load_trace",
    "measured_task_shares",
    "ratios",
    "run_policy",
    "savings",
]
