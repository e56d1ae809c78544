"""The program `/run_jupyter` runs inside a sandbox: notebook cells through IPython, one by one.

It is shipped as the source of a one-shot Python action (not imported by the service), so it
imports nothing from arl_tangram. It reads its input from ``IN_FILE`` in the work directory and,
after every cell, rewrites ``OUT_FILE`` atomically, so whatever ran is reported even when the
sandbox is killed at the total deadline.

Semantics are Jupyter's (IPython's InteractiveShell, as in a python3 kernel, without the kernel
process and its sockets): variables persist across cells, the value of a cell's last expression
is an ``execute_result`` and ``display()`` a ``display_data`` (both as mime bundles in
``display``), magics and ``!shell`` work, an exception is recorded as ``error`` (ename, evalue,
traceback lines, no colour codes) and the next cells still run. ``cell_timeout`` (0: none) and
``total_timeout`` stop the run with status ``TimeLimitExceeded``; later cells are not run.
Captured text is capped per cell (``max_output`` characters) with ``truncated`` set.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

IN_FILE = "_tangram_jupyter_in.json"
OUT_FILE = "_tangram_jupyter_out.json"


class _CellTimeout(BaseException):
    """Raised in the cell by SIGALRM (a BaseException so user ``except Exception`` cannot eat it)."""


class _Capped:
    """A text stream that keeps at most ``limit`` characters and says whether it cut."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, limit: int) -> None:
        self.parts: list[str] = []
        self.size, self.limit, self.truncated = 0, limit, False

    def write(self, s: str) -> int:
        s = str(s)
        room = self.limit - self.size
        if len(s) > room:
            s, self.truncated = s[:max(room, 0)], True
        if s:
            self.parts.append(s)
            self.size += len(s)
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def value(self) -> str:
        return "".join(self.parts)


def _shell(cell: dict[str, Any]) -> Any:
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    class Hook(DisplayHook):  # execute_result: the value of the last expression
        def start_displayhook(self) -> None:
            pass

        def write_output_prompt(self) -> None:
            pass

        def write_format_data(self, format_dict: Any, md_dict: Any = None) -> None:
            cell["display"].append(dict(format_dict))

        def finish_displayhook(self) -> None:
            pass

    class Pub(DisplayPublisher):  # display_data
        def publish(self, data: Any, metadata: Any = None, *args: Any, **kw: Any) -> None:
            cell["display"].append(dict(data))

        def clear_output(self, wait: bool = False) -> None:
            cell["display"].clear()

    cfg = Config()
    cfg.HistoryManager.enabled = False
    cfg.InteractiveShell.colors = "nocolor"
    sh = InteractiveShell.instance(config=cfg, displayhook_class=Hook, display_pub_class=Pub)

    def show(etype: Any, evalue: Any, stb: list[str]) -> None:
        cell["error"].append({"ename": getattr(etype, "__name__", str(etype)),
                              "evalue": str(evalue), "traceback": list(stb)})

    sh._showtraceback = show  # type: ignore[method-assign]  # what ipykernel overrides too
    return sh


def _alarm(_sig: int, _frame: Any) -> None:
    raise _CellTimeout()


def _write(out: dict[str, Any]) -> None:
    tmp = OUT_FILE + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, OUT_FILE)


def _run_one(sh: Any, code: str, cell: dict[str, Any], limit_s: float, max_output: int) -> bool:
    """Run one cell; False when it hit its time limit."""
    out, err = _Capped(max_output), _Capped(max_output)
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    timed_out = False
    try:
        if limit_s > 0:
            signal.setitimer(signal.ITIMER_REAL, limit_s)
        try:
            sh.run_cell(code, store_history=True)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _CellTimeout:
        timed_out = True
    finally:
        sys.stdout, sys.stderr = saved
    if timed_out or any(e["ename"] == "_CellTimeout" for e in cell["error"]):
        timed_out = True
        cell["error"] = [{"ename": "TimeoutError", "evalue": f"cell exceeded {limit_s:g} s",
                          "traceback": [f"TimeoutError: cell exceeded {limit_s:g} s"]}]
    cell.update(stdout=out.value(), stderr=err.value(),
                truncated=out.truncated or err.truncated)
    return not timed_out


def main() -> None:
    with open(IN_FILE) as f:
        spec = json.load(f)
    os.unlink(IN_FILE)
    cells_in: list[str] = spec["cells"]
    cell_timeout, total = float(spec["cell_timeout"]), float(spec["total_timeout"])
    max_output = int(spec.get("max_output", 1 << 20))
    signal.signal(signal.SIGALRM, _alarm)
    out: dict[str, Any] = {"status": "Finished", "cells": []}
    _write(out)
    cell: dict[str, Any] = {}
    sh = _shell(cell)
    deadline = time.monotonic() + total
    for code in cells_in:
        left = deadline - time.monotonic()
        limit = min(cell_timeout, left) if cell_timeout > 0 else left
        cell.clear()
        cell.update(stdout="", stderr="", display=[], error=[])
        if limit <= 0:
            out["status"] = "TimeLimitExceeded"
            break
        ok = _run_one(sh, code, cell, limit, max_output)
        out["cells"].append(dict(cell))
        if not ok:
            out["status"] = "TimeLimitExceeded"
            break
        _write(out)
    _write(out)


if __name__ == "__main__":
    main()
