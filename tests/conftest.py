"""Suite-wide settings, applied before any test module (or ray) is imported."""

import os

import pytest

# Ray: no usage stats, and one-machine clusters on the loopback address only (Ray's
# single-machine mode), so no test traffic leaves 127.0.0.0/8.
os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


# Markers (pyproject.toml): `integration` is a test of real parts (sandboxes, models, an HTTP
# server, Ray), so `pytest -m "not integration"` is the unit suite. `needs_root` is a test that
# needs root (namespaces, cgroups, mounts, loop devices): it counts as integration, and is
# skipped, saying so, where the suite does not run as root.
def pytest_itemcollected(item):  # type: ignore[no-untyped-def]
    if item.get_closest_marker("needs_root") is None:
        return
    item.add_marker(pytest.mark.integration)
    if os.geteuid() != 0:
        item.add_marker(pytest.mark.skip(reason="needs root (namespaces, cgroups, mounts)"))


# Tests marked `pure_core` replace methods of `Core` to compare a shortcut with its reference
# loop. A compiled core (mypyc, `arl_tangram.core._native`) calls its methods directly, so a
# replaced method would not run: there such a test runs in a subprocess on the pure-Python core
# (`ARL_TANGRAM_PURE=1`). That the compiled core decides exactly as the pure one is
# tests/core/test_native.py's job.
#
# Tests marked `own_process` fork the test process and run Python in the child (a sandbox's own
# steps driven from the test). After the thousands of tests before them in one process (threads
# and loops left running, module state), 23 such children hung and printed nothing, though each
# file passed alone; a fork copies the locks other threads hold (stdout's, the import lock), not
# the threads -- the likely cause, not shown. They run in a fresh interpreter of their own
# (`ARL_TANGRAM_OWN_PROCESS=1` there).
def pytest_pyfunc_call(pyfuncitem):  # type: ignore[no-untyped-def]
    if pyfuncitem.get_closest_marker("pure_core") is not None:
        from arl_tangram.core import FORM

        if FORM == "compiled":
            return _in_a_subprocess(pyfuncitem, {"ARL_TANGRAM_PURE": "1"}, "on the pure core")
    if (pyfuncitem.get_closest_marker("own_process") is not None
            and os.environ.get("ARL_TANGRAM_OWN_PROCESS") != "1"):
        return _in_a_subprocess(pyfuncitem, {"ARL_TANGRAM_OWN_PROCESS": "1"}, "in its own process")
    return None  # (runs here, as usual)


def _in_a_subprocess(pyfuncitem, extra, where):  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    env = {**os.environ, **extra}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", pyfuncitem.nodeid],
        env=env, cwd=str(pyfuncitem.config.rootpath), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{where}:\n{out.stdout[-4000:]}{out.stderr[-2000:]}"
    assert " passed" in out.stdout, out.stdout[-2000:]
    return True


# Under `coverage run` (.ci/run), each test's lines are recorded under its node id (issue 43).
from _coverage_context import pytest_runtest_setup  # noqa: E402,F401

# The skip policy (issue 27): isolation skips fail on root Linux; skips are logged for .ci/run.
from _skip_policy import (  # noqa: E402,F401
    pytest_runtest_logreport,
    pytest_runtest_makereport,
    pytest_sessionfinish,
)
