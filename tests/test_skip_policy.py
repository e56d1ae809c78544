"""The skip policy (issue 27): an isolation skip fails on root Linux, and `.ci/check_skips.py`
fails a run on any skip not listed with its reason in tests/allowed_skips.txt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = '''
import pytest
from arl_tangram.core.errors import IsolationUnavailable

@pytest.fixture
def sandbox():
    try:
        raise IsolationUnavailable("probe: the sandbox runs as uid 0")
    except IsolationUnavailable as e:
        pytest.skip(f"isolation unavailable here: {e}")

def test_needs_a_sandbox(sandbox):
    assert False, "never reached"

def test_plain_skip():
    pytest.skip("no frobnicator on this machine")
'''


def _pytest(tmp: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    (tmp / "test_probe.py").write_text(PROBE)
    log = tmp / "skips.json"
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"),
                                                         os.environ.get("PYTHONPATH", "")]),
            "TANGRAM_SKIP_LOG": str(log), **env}
    full.pop("PYTEST_ADDOPTS", None)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                          "-p", "_skip_policy", "--rootdir", str(tmp), "-c", os.devnull,
                          str(tmp / "test_probe.py")],
                         cwd=tmp, env=full, capture_output=True, text=True, timeout=120)
    return out, json.loads(log.read_text())


def _check(log: Path, allowed: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / ".ci" / "check_skips.py"), str(log),
                           str(allowed)], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                    reason="the policy applies to root Linux, the supported machine")
def test_isolation_skip_is_a_failure_on_root_linux(tmp_path: Path) -> None:
    out, log = _pytest(tmp_path, TANGRAM_TESTS_ALLOW_NO_ISOLATION="")
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "isolation unavailable on a root Linux machine" in text
    assert "the sandbox runs as uid 0" in text  # the product's reason is named
    assert "1 error" in text or "1 failed" in text, text
    assert [nid for nid, _ in log["skipped"]] == ["test_probe.py::test_plain_skip"]


def test_unlisted_skips_fail_the_check_and_listed_ones_pass(tmp_path: Path) -> None:
    out, _ = _pytest(tmp_path, TANGRAM_TESTS_ALLOW_NO_ISOLATION="1")
    assert out.returncode == 0, out.stdout + out.stderr  # both skipped: pytest alone is green
    log = tmp_path / "skips.json"
    allowed = tmp_path / "allowed.txt"
    allowed.write_text("# nothing allowed\n")
    r = _check(log, allowed)
    assert r.returncode == 1
    assert "UNEXPECTED SKIP: test_probe.py::test_needs_a_sandbox" in r.stderr
    assert "UNEXPECTED SKIP: test_probe.py::test_plain_skip" in r.stderr
    # listed with the wrong reason: still unexpected
    allowed.write_text("test_probe.py::test_plain_skip | no widget | reason differs\n")
    assert _check(log, allowed).returncode == 1
    allowed.write_text("test_probe.py::test_plain_skip | no frobnicator | a test of the list\n"
                       "test_probe.py::test_needs_* | isolation unavailable | a test\n")
    r = _check(log, allowed)
    assert r.returncode == 0, r.stderr
    assert "2 skipped (2 allowed" in r.stderr


def test_a_missing_log_fails_the_check(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed.txt"
    allowed.write_text("")
    r = _check(tmp_path / "nowhere.json", allowed)
    assert r.returncode == 1 and "no skip log" in r.stderr


def test_the_committed_list_parses() -> None:
    r = subprocess.run([sys.executable, "-c",
                        "import sys; sys.path.insert(0, '.ci'); import check_skips as c;"
                        "from pathlib import Path; print(len(c.load_allowed("
                        "Path('tests/allowed_skips.txt'))))"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) >= 1
