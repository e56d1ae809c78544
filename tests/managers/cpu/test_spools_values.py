"""Upload spools a dead service left (`managers/cpu/images/spools.py`), asserted exactly (issue 43).

- `process_start_time`: /proc/PID/stat's 20th field after the command (its starttime, in clock
  ticks since boot), a command holding ") " too; now - (boot time - ticks / CLK_TCK);
- `_open_paths`: every fd target of every numeric /proc entry; a process or fd gone meanwhile
  skipped, the rest still read;
- `_newest_mtime`: the newest lstat mtime of the directory and everything under it (a link's
  own, not its target's);
- `sweep`: the system's temporary directory by default; only ``tangram-upload-*`` directories
  (no file, no link) changed strictly before the start and not held (the directory itself or a
  path under it; a sibling sharing its prefix does not count); sorted; one warning naming at
  most 8; what rmtree could not remove is not reported.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from arl_tangram.managers.cpu.images import spools


def test_prefix():
    assert spools.SPOOL_PREFIX == "tangram-upload-"


def _fake_clock(monkeypatch, stat_text: str, opened: list[str]):
    real_open = open

    def fake_open(path, *a, **kw):
        if str(path).startswith("/proc/") and str(path).endswith("/stat"):
            opened.append(path)
            return _Text(stat_text)
        return real_open(path, *a, **kw)

    monkeypatch.setattr(spools, "open", fake_open, raising=False)

    def clock(c):
        assert c == time.CLOCK_BOOTTIME
        return 1000.0

    monkeypatch.setattr(
        spools,
        "time",
        SimpleNamespace(
            clock_gettime=clock, CLOCK_BOOTTIME=time.CLOCK_BOOTTIME, time=lambda: 5000.0
        ),
    )
    real_sysconf = os.sysconf
    monkeypatch.setattr(os, "sysconf", lambda n: 100 if n == "SC_CLK_TCK" else real_sysconf(n))


class _Text:
    def __init__(self, s: str) -> None:
        self.s = s

    def read(self) -> str:
        return self.s

    def __enter__(self):
        return self

    def __exit__(self, *a) -> None:
        return None


def _stat(comm: str, starttime: int) -> str:
    # fields 3.. (state .. ); starttime is field 22, the 20th after the command
    rest = ["S"] + [str(i) for i in range(4, 22)] + [str(starttime)] + ["7", "8", "9"]
    return f"42 ({comm}) " + " ".join(rest) + "\n"


def test_process_start_time_arithmetic(monkeypatch):
    opened: list[str] = []
    _fake_clock(monkeypatch, _stat("py) x) y", 12345), opened)
    assert spools.process_start_time() == pytest.approx(5000.0 - (1000.0 - 123.45), abs=1e-9)
    assert spools.process_start_time(77) == pytest.approx(4123.45, abs=1e-9)
    assert spools.process_start_time("9") == pytest.approx(4123.45, abs=1e-9)
    assert opened == ["/proc/self/stat", "/proc/77/stat", "/proc/9/stat"]


def test_process_start_time_self_real():
    t = spools.process_start_time()
    assert t == pytest.approx(spools.process_start_time(os.getpid()), abs=0.02)
    assert t <= time.time()


def test_open_paths(monkeypatch):
    fds = {"/proc/12/fd": OSError, "/proc/13/fd": ["0", "1", "2"], "/proc/14/fd": ["5"]}
    links = {
        "/proc/13/fd/0": "/a",
        "/proc/13/fd/1": OSError,
        "/proc/13/fd/2": "/b/c",
        "/proc/14/fd/5": "/d",
    }

    def listdir(p):
        if p == "/proc":
            return ["self", "12", "x1", "13", "acpi", "14"]
        v = fds[p]
        if v is OSError:
            raise OSError(2, "gone")
        return v

    def readlink(p):
        v = links[p]
        if v is OSError:
            raise OSError(2, "gone")
        return v

    monkeypatch.setattr(spools, "os", SimpleNamespace(listdir=listdir, readlink=readlink))
    assert spools._open_paths() == {"/a", "/b/c", "/d"}


def test_open_paths_real(tmp_path):
    p = tmp_path / "held"
    p.write_bytes(b"")
    with open(p):
        assert str(p) in spools._open_paths()


def test_newest_mtime(tmp_path):
    d = tmp_path / "s"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "f").write_bytes(b"")
    (d / "g").write_bytes(b"")
    target = tmp_path / "target"
    target.write_bytes(b"")
    os.symlink(target, d / "link")
    for p, t in [(d / "sub" / "f", 300), (d / "g", 200), (d / "sub", 100), (d, 150)]:
        os.utime(p, (t, t))
    os.utime(d / "link", (250, 250), follow_symlinks=False)
    os.utime(target, (900, 900))
    assert spools._newest_mtime(str(d)) == 300.0
    os.utime(d / "sub" / "f", (50, 50))
    assert spools._newest_mtime(str(d)) == 250.0  # the link's own time, not its target's
    os.utime(d / "link", (10, 10), follow_symlinks=False)
    assert spools._newest_mtime(str(d)) == 200.0
    os.utime(d / "g", (10, 10))
    assert spools._newest_mtime(str(d)) == 150.0  # the directory itself
    os.utime(d / "sub", (170, 170))
    os.utime(d, (150, 150))
    assert spools._newest_mtime(str(d)) == 170.0


def _spool(base: Path, name: str, t: float) -> Path:
    d = base / f"tangram-upload-{name}"
    d.mkdir()
    (d / "image.tar").write_bytes(b"x")
    os.utime(d / "image.tar", (t, t))
    os.utime(d, (t, t))
    return d


def test_sweep_default_dir_and_start(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    start = spools.process_start_time()
    old = _spool(tmp_path, "old", start - 100)
    new = _spool(tmp_path, "new", time.time() + 100)
    assert spools.sweep() == [str(old)]
    assert new.is_dir() and not old.exists()


def test_sweep_nothing(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(spools, "process_start_time", lambda *a: calls.append(a) or 0.0)
    assert spools.sweep(str(tmp_path / "missing"), None) == []
    (tmp_path / "other").mkdir()
    assert spools.sweep(str(tmp_path), None) == []
    assert calls == []  # (no spool: nothing read)
    _spool(tmp_path, "a", 10.0)
    assert spools.sweep(str(tmp_path), None) == []  # started at 0: changed since
    assert calls == [()]


def test_sweep_rules(tmp_path, monkeypatch, caplog):
    since = 1000.0
    a = _spool(tmp_path, "a", 500.0)
    ab = _spool(tmp_path, "ab", 500.0)
    edge = _spool(tmp_path, "edge", since)  # changed at the start itself: kept
    just = _spool(tmp_path, "just", since - 0.5)
    held_dir = _spool(tmp_path, "held", 500.0)
    (tmp_path / "tangram-upload-file").write_bytes(b"")
    os.utime(tmp_path / "tangram-upload-file", (1, 1))
    os.symlink(a, tmp_path / "tangram-upload-link")
    os.utime(tmp_path / "tangram-upload-link", (1, 1), follow_symlinks=False)
    monkeypatch.setattr(
        spools, "_open_paths", lambda: {str(ab) + "/image.tar", str(held_dir), str(tmp_path)}
    )
    caplog.set_level(logging.WARNING, logger=spools.__name__)
    gone = spools.sweep(str(tmp_path), since)
    assert gone == [str(a), str(just)]
    assert sorted(os.listdir(tmp_path)) == [
        "tangram-upload-ab",
        "tangram-upload-edge",
        "tangram-upload-file",
        "tangram-upload-held",
        "tangram-upload-link",
    ]
    assert edge.is_dir() and held_dir.is_dir() and ab.is_dir()
    assert [r.getMessage() for r in caplog.records] == [
        f"removed 2 upload spool(s) a stopped service left: {a}, {just}"
    ]
    assert [r.levelno for r in caplog.records] == [logging.WARNING]


def test_sweep_logs_at_most_eight(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(spools, "_open_paths", set)
    ds = [_spool(tmp_path, f"{i}", 5.0) for i in (9, 8, 7, 6, 5, 4, 3, 2, 1)]
    caplog.set_level(logging.WARNING, logger=spools.__name__)
    gone = spools.sweep(str(tmp_path), 10.0)
    assert gone == sorted(str(d) for d in ds)
    assert [r.getMessage() for r in caplog.records] == [
        "removed 9 upload spool(s) a stopped service left: " + ", ".join(gone[:8])
    ]


def test_sweep_not_removed_not_reported(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(spools, "_open_paths", set)
    d = _spool(tmp_path, "stuck", 5.0)
    calls = []
    monkeypatch.setattr(spools.shutil, "rmtree", lambda p, **kw: calls.append((p, kw)))
    caplog.set_level(logging.WARNING, logger=spools.__name__)
    assert spools.sweep(str(tmp_path), 10.0) == []
    assert calls == [(str(d), {"ignore_errors": True})]
    assert caplog.records == []


def test_sweep_newest_mtime_error_skips(tmp_path, monkeypatch):
    monkeypatch.setattr(spools, "_open_paths", set)
    a = _spool(tmp_path, "a", 5.0)
    b = _spool(tmp_path, "b", 5.0)

    def newest(d):
        if d == str(a):
            raise OSError(2, "gone")
        return 5.0

    monkeypatch.setattr(spools, "_newest_mtime", newest)
    assert spools.sweep(str(tmp_path), 10.0) == [str(b)]
    assert a.is_dir()


def test_newest_mtime_entry_gone_meanwhile(monkeypatch):
    # an entry removed between os.walk's listing and its lstat is skipped, the rest still read
    times = {"/s": 10.0, "/s/sub": 30.0, "/s/sub/f": 40.0}

    def lstat(p):
        if p not in times:
            raise FileNotFoundError(2, "gone", p)
        return SimpleNamespace(st_mtime=times[p])

    def walk(d):
        assert d == "/s"
        return iter([("/s", ["sub", "vanished"], ["gone"]), ("/s/sub", [], ["f"])])

    monkeypatch.setattr(spools, "os", SimpleNamespace(lstat=lstat, walk=walk, path=os.path))
    assert spools._newest_mtime("/s") == 40.0
