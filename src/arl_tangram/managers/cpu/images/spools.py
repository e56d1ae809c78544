"""Upload spools a dead service left (issue 41, M7): swept when a service starts.

`PUT /v1/images/NAME` (`api/images.py`) streams the body into a directory
``tangram-upload-XXXX`` under ``images.upload_dir`` (the system's temporary directory when
unset) and removes it when the request ends; a service killed mid-upload left it for ever.
Invariant: `sweep` removes such a directory only when no process of the host has a file of it
open (an upload or import in flight, of this service or another one on the same directory)
and nothing in it changed since this process started: a spool of a live service is never
touched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time

log = logging.getLogger(__name__)

SPOOL_PREFIX = "tangram-upload-"  # (`api/images.py`: ``tempfile.mkdtemp(prefix=...)``)


def process_start_time(pid: int | str = "self") -> float:
    """When process ``pid`` started, in seconds since the epoch (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        ticks = int(f.read().rsplit(") ", 1)[1].split()[19])  # (since boot, in clock ticks)
    # (not /proc/stat's btime: whole seconds, up to 1 s early)
    ago = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - ago


def _open_paths() -> set[str]:
    """Every path a process of the host has open now (its fds' targets)."""
    out: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                out.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return out


def _newest_mtime(d: str) -> float:
    newest = os.lstat(d).st_mtime
    for root, dirs, files in os.walk(d):
        for n in dirs + files:
            with contextlib.suppress(OSError):
                newest = max(newest, os.lstat(os.path.join(root, n)).st_mtime)
    return newest


def sweep(upload_dir: str | None = None, started: float | None = None) -> list[str]:
    """Remove the upload spools under ``upload_dir`` (None: the system's temporary directory)
    that no process holds open and that did not change since ``started`` (default: this
    process's start): the directories removed."""
    base = upload_dir or tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(base) if n.startswith(SPOOL_PREFIX)]
    except OSError:
        return []
    if not names:
        return []
    since = process_start_time() if started is None else started
    held = _open_paths()
    gone = []
    for n in sorted(names):
        d = os.path.join(base, n)
        try:
            if not os.path.isdir(d) or os.path.islink(d) or _newest_mtime(d) >= since:
                continue
        except OSError:
            continue
        if any(p == d or p.startswith(d + "/") for p in held):
            continue
        shutil.rmtree(d, ignore_errors=True)
        if not os.path.lexists(d):
            gone.append(d)
    if gone:
        log.warning("removed %d upload spool(s) a stopped service left: %s", len(gone),
                    ", ".join(gone[:8]))
    return gone
