"""Work per decision stays flat as sessions grow (issue 24): counted in operations, not time.

The pure core runs in a subprocess under a profile hook that counts Python function calls; the
calls to open one more session are compared with 200 and with 1,600 sessions already open on the
same nodes. Summing every open session's demand per candidate node (as `Sessions.room` once did)
makes the second figure ~8x the first; a running sum keeps them about equal."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = r"""
import json, sys
from arl_tangram.core.cluster import ClusterSpec, NodeSpec
from arl_tangram.core.core import Core
from arl_tangram.core.config import CoreConfig
from arl_tangram.core import events as ev
from arl_tangram.core.resources import Resources

def calls_per_open(before, probes=20):
    nodes = tuple(NodeSpec(f"n{i}", Resources(cpu=192, memory_mb=786432)) for i in range(4))
    core = Core(ClusterSpec(nodes), CoreConfig(policy="tangram"))
    t = 0.0
    for i in range(before):
        t += 0.001
        core.handle(ev.SessionRequested(t, f"s{i}", Resources(memory_mb=64)))
    count = [0]
    def hook(frame, event, arg):
        if event == "call":
            count[0] += 1
    sys.setprofile(hook)
    for i in range(probes):
        t += 0.001
        core.handle(ev.SessionRequested(t, f"p{i}", Resources(memory_mb=64)))
    sys.setprofile(None)
    return count[0] / probes

print(json.dumps([calls_per_open(200), calls_per_open(1600)]))
"""


def test_opening_a_session_costs_the_same_with_eight_times_the_sessions_open() -> None:
    env = dict(os.environ, ARL_TANGRAM_PURE="1")
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         check=True, timeout=300)
    small, large = json.loads(out.stdout.strip().splitlines()[-1])
    assert small > 0
    # linear work in the open sessions would be ~8x; allow what does not grow with them
    assert large < 1.5 * small, (small, large)
