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
#
# One interpreter per module, not per test: the first such test of a module runs all of the
# module's selected ones of its kind in one `pytest` child (each reports through `_Report`),
# and each test then takes its own outcome from it (a child per test cost ~3 s of start-up each:
# 227 s for one module of 60 tests).
def pytest_pyfunc_call(pyfuncitem):  # type: ignore[no-untyped-def]
    if pyfuncitem.get_closest_marker("pure_core") is not None:
        from arl_tangram.core import FORM

        if FORM == "compiled":
            return _in_a_subprocess(pyfuncitem, "pure_core", {"ARL_TANGRAM_PURE": "1"},
                                    "on the pure core")
    if (pyfuncitem.get_closest_marker("own_process") is not None
            and os.environ.get("ARL_TANGRAM_OWN_PROCESS") != "1"):
        return _in_a_subprocess(pyfuncitem, "own_process", {"ARL_TANGRAM_OWN_PROCESS": "1"},
                                "in its own process")
    return None  # (runs here, as usual)


# (module path, marker) -> node id -> (its outcome in the child, what the child said of it)
_BATCHES: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}


def _in_a_subprocess(pyfuncitem, marker, extra, where):  # type: ignore[no-untyped-def]
    import json
    import subprocess
    import sys
    import tempfile

    key = (str(pyfuncitem.path), marker)
    got = _BATCHES.get(key)
    if got is None or pyfuncitem.nodeid not in got:
        ids = [i.nodeid for i in pyfuncitem.session.items
               if i.path == pyfuncitem.path and i.get_closest_marker(marker) is not None]
        if pyfuncitem.nodeid not in ids:  # (a test not among the session's items)
            ids = [pyfuncitem.nodeid]
        with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as rep:
            env = {**os.environ, **extra, "ARL_TANGRAM_BATCH_REPORT": rep.name}
            try:
                out = subprocess.run(
                    [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ids],
                    env=env, cwd=str(pyfuncitem.config.rootpath), capture_output=True, text=True,
                    timeout=300 + 30 * len(ids))
                said = f"{out.stdout[-4000:]}{out.stderr[-2000:]}"
            except subprocess.TimeoutExpired as e:
                said = f"the child timed out: {str(e.stdout)[-4000:]}"
            got = {i: ("not run", f"no report of it from its module's child:\n{said}") for i in ids}
            for line in rep:
                r = json.loads(line)
                # (the call's outcome, unless a phase failed: the first failure stays)
                if ((r["outcome"] != "passed" or r["when"] == "call")
                        and got[r["nodeid"]][0] in ("not run", "passed")):
                    got[r["nodeid"]] = (r["outcome"] if r["when"] == "call" else
                                        f"{r['when']} {r['outcome']}", r["text"] or said)
        _BATCHES[key] = got
    outcome, text = got.pop(pyfuncitem.nodeid)
    assert outcome == "passed", f"{where}: {outcome}\n{text}"
    return True


class _Report:
    """(In a batch's child.) Each test's phases and outcomes, one JSON line each."""

    def __init__(self, path: str) -> None:
        self.path = path

    def pytest_runtest_logreport(self, report):  # type: ignore[no-untyped-def]
        import json

        with open(self.path, "a") as f:
            f.write(json.dumps({"nodeid": report.nodeid, "when": report.when,
                                "outcome": report.outcome,
                                "text": report.longreprtext[-6000:]}) + "\n")


def pytest_configure(config):  # type: ignore[no-untyped-def]
    path = os.environ.pop("ARL_TANGRAM_BATCH_REPORT", None)  # (not for the child's children)
    if path:
        config.pluginmanager.register(_Report(path), "arl-tangram-batch-report")


# Under `coverage run` (.ci/run), each test's lines are recorded under its node id (issue 43).
from _coverage_context import pytest_runtest_setup  # noqa: E402,F401

# The skip policy (issue 27): isolation skips fail on root Linux; skips are logged for .ci/run.
from _skip_policy import (  # noqa: E402,F401
    pytest_runtest_logreport,
    pytest_runtest_makereport,
    pytest_sessionfinish,
)
