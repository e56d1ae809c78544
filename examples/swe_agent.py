"""A scripted SWE agent (issues 17, 26): one session in the SWE example image, as root inside,
where it inspects the repository (/testbed, root's), installs it into the image's environment
(/opt/testbed, root's) with pip, runs the failing test, applies a patch and runs the tests again.

``python examples/swe_agent.py [--url http://127.0.0.1:8080]`` (default: an embedded service
on this machine). It imports the image built by examples/swe_image.py if the service lacks it,
prints each step and exits 0 when the tests pass after the patch. `run_agent` is what
tests/api/test_swe_example.py runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import swe_image

from arl_tangram.client import Client

IMAGE = "swe-example"


def run_agent(client: Client, image: str = IMAGE, say: Any = print) -> list[dict[str, Any]]:
    """The trajectory: a list of steps ``{"cmd", "language", "rc", "stdout", "stderr",
    "session_switch"}``, all run in ONE session of ``image``."""
    steps: list[dict[str, Any]] = []
    with client.session(image=image, demand={"cpu": 1, "memory_mb": 512}, ttl_s=600) as s:

        def act(cmd: str, language: str = "bash") -> dict[str, Any]:
            r = s.run(cmd, language, timeout_s=120)
            rr = r.get("run_result") or {}
            step = {"cmd": cmd, "language": language, "rc": rr.get("return_code"),
                    "stdout": rr.get("stdout", ""), "stderr": rr.get("stderr", ""),
                    "session_switch": r.get("session_switch")}
            steps.append(step)
            more = " ..." if len(cmd.splitlines()) > 1 else ""
            say(f"$ {cmd.splitlines()[0]}{more}  -> rc {step['rc']}")
            for line in (step["stdout"] + step["stderr"]).strip().splitlines()[-6:]:
                say(f"    {line}")
            return step

        # inspect: root inside (a user namespace: uid 0 is an unprivileged host uid), the
        # repository and the environment root's, as in SWE-bench's images; the cwd is the
        # image's WorkingDir, /testbed
        act("id -u && cat /proc/self/uid_map && stat -c '%U %a %n' . /opt/testbed && pwd && "
            "git log --oneline && ls")
        act("cat calc.py && grep -n 'def test' test_calc.py")
        # install the repository into the image's environment (/opt/testbed, root's), offline
        act("pip install -q --no-index --no-build-isolation -e . 2>&1 | tail -3; "
            "python -c 'import calc, sys; print(sys.prefix, calc.__file__)'")
        test = "python -m pytest -q > /tmp/pytest.out 2>&1; rc=$?; tail -{} /tmp/pytest.out; (exit $rc)"
        act(test.format(5))  # fails: 1 test
        act("git apply <<'PATCH'\n" + swe_image.FIX + "PATCH\ngit diff --stat")  # edits /testbed
        act(test.format(3))  # passes
        act("import calc, sys; (sys.prefix, calc.mean([]))", "python")  # the env's python3
        act("git diff | head -20 && git status --short")
    return steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running service (default: embedded on this machine)")
    ap.add_argument("--cache", default=swe_image.DEFAULT_CACHE)
    args = ap.parse_args()
    layout = swe_image.build(args.cache, say=lambda m: print(m, file=sys.stderr))
    if args.url:
        client = Client(args.url)
    else:
        from arl_tangram.runtime.config import default_config

        client = Client.embedded(default_config(with_models=False))
    with client:
        have = client.images()["nodes"]
        if not all(any(i["name"] == IMAGE and i.get("source") == layout for i in rows)
                   for rows in have.values()):  # (none, or an older build of the recipe)
            client.import_image(layout, IMAGE)
        steps = run_agent(client)
    ok = steps[3]["rc"] != 0 and steps[5]["rc"] == 0
    print("tests fail before the patch and pass after it" if ok else "UNEXPECTED outcome")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
