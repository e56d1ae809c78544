"""A real `tangram serve` for the tests that need one (uvicorn, real sandboxes): started on a free
loopback port with a config file, waited for until `/v1/health` answers 200, stopped at the end.
One copy of what the real-server tests share."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def tangram_serve(cfg: Path, *, preexec_fn: Callable[[], None] | None = None,
                  ) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``(url, process)`` of `tangram serve --config cfg --no-models`, ready; terminated after
    (killed past 15 s). Fails the test when it exits or is not ready within 60 s."""
    port = free_port()
    tangram = os.path.join(os.path.dirname(sys.executable), "tangram")
    proc = subprocess.Popen([tangram, "serve", "--config", str(cfg), "--no-models", "--port",
                             str(port), "--log-level", "warning"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=preexec_fn)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if proc.poll() is not None:
                assert proc.stderr is not None
                pytest.fail(f"tangram serve exited: {proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            pytest.fail("tangram serve did not become ready")
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
