"""The SWE example (issue 17 item 6, issue 26 item 5): the Debian-built image
(examples/swe_image.py, built once per machine and cached under /var/cache/arl-tangram/images;
/testbed and /opt/testbed root's) and the scripted agent (examples/swe_agent.py) in ONE session
of it, as root inside: inspect, pip install into /opt/testbed, failing test, patch, passing
tests."""

from __future__ import annotations

import os
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
sys.path.insert(0, EXAMPLES)

pytestmark = [pytest.mark.slow, pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes need root")]


@pytest.fixture(scope="module")
def swe_layout() -> str:
    import swe_image

    try:
        return swe_image.build()
    except Exception as e:  # no mmdebstrap, or no access to Debian's mirror
        pytest.skip(f"cannot build the SWE example image here: {e}")


def test_scripted_agent_fixes_the_repository_in_one_session(tmp_path, swe_layout: str) -> None:
    import swe_agent

    from arl_tangram.client import Client
    from arl_tangram.managers.cpu import CpuManagerConfig
    from arl_tangram.runtime.config import NodeConfig, ServiceConfig

    cfg = ServiceConfig(nodes=(NodeConfig(cpu=CpuManagerConfig(work_root=str(tmp_path / "w"), warm_min=1),
                                          gpu=None),))
    with Client.embedded(cfg) as c:
        out = c.import_image(swe_layout, swe_agent.IMAGE)
        rec = out["nodes"]["local"]
        assert rec["format"] == "oci-dir" and len(rec["layers"]) == 2
        steps = swe_agent.run_agent(c, say=lambda m: None)
    who, show, pip, before, patch, after, py, diff = steps
    assert who["rc"] == 0, who
    lines = who["stdout"].splitlines()
    assert lines[0] == "0"  # root inside ...
    assert lines[1].split()[:2] == ["0", str(1 << 30)]  # ... which is an unprivileged host uid
    assert lines[2:5] == ["root 755 .", "root 755 /opt/testbed", "/testbed"], who
    assert "calc: mean" in who["stdout"] and "calc.py" in who["stdout"]
    assert "def mean" in show["stdout"]
    assert pip["rc"] == 0 and pip["stdout"].strip().endswith("/opt/testbed /testbed/calc.py"), pip
    assert before["rc"] == 1 and "1 failed, 2 passed" in before["stdout"]
    assert patch["rc"] == 0 and "1 file changed" in patch["stdout"]
    assert after["rc"] == 0 and "3 passed" in after["stdout"]  # the patch persisted
    assert py["rc"] == 0 and py["stdout"].strip() == "('/opt/testbed', 0.0)", py  # the env's python
    assert " M calc.py" in diff["stdout"]
    for s in steps:  # each action thawed with its quota and frozen again
        assert s["session_switch"] is not None and s["session_switch"]["frozen"]
