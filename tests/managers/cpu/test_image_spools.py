"""Issue 41 (review M7): `spools.sweep` removes the upload spools a killed service left, and never
one a live service may still use (changed since this process started, or a file of it open)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from arl_tangram.managers.cpu.images import spools


def _spool(base: Path, name: str, age_s: float) -> Path:
    d = base / f"tangram-upload-{name}"
    d.mkdir()
    (d / "image.tar").write_bytes(b"x" * 10)
    t = time.time() - age_s
    for p in (d / "image.tar", d):
        os.utime(p, (t, t))
    return d


def test_sweep_removes_only_spools_nobody_holds_and_nothing_changed(tmp_path: Path) -> None:
    started = time.time() - 60  # (this service started a minute ago)
    old = _spool(tmp_path, "old", 3600)
    fresh = _spool(tmp_path, "fresh", 1)  # written since the start: a live upload's
    held = _spool(tmp_path, "held", 3600)
    inner = _spool(tmp_path, "inner", 3600)
    (inner / "late").write_bytes(b"y")  # a file changed since the start, the directory not
    os.utime(inner, (time.time() - 3600, time.time() - 3600))
    other = tmp_path / "not-a-spool"
    other.mkdir()
    os.utime(other, (time.time() - 3600, time.time() - 3600))
    with open(held / "image.tar", "rb"):
        gone = spools.sweep(str(tmp_path), started)
    assert gone == [str(old)]
    assert sorted(os.listdir(tmp_path)) == ["not-a-spool", "tangram-upload-fresh",
                                            "tangram-upload-held", "tangram-upload-inner"]
    assert fresh.is_dir() and held.is_dir()
    assert spools.sweep(str(tmp_path / "missing"), started) == []


def test_process_start_time_is_when_the_process_started() -> None:
    import subprocess
    import sys

    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    after = time.time()
    try:
        t = spools.process_start_time(child.pid)
        # (clock ticks: 10 ms; /proc/stat's btime, whole seconds, was up to 1 s early)
        assert before - 0.02 <= t <= after + 0.02, (before, t, after)
    finally:
        child.kill()
        child.wait()
