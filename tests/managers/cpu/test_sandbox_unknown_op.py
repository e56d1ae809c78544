"""A request to a sandbox with an op it does not know is refused by name, not run as code (the
sandbox's init once ran any op but prepare, session and image as a run); the sandbox then ends,
as after a one-shot action, and the manager keeps serving."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from _cpu_helpers import TEST_UID

from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig


@pytest.mark.needs_root
async def test_a_request_with_an_unknown_op_is_refused_by_name() -> None:
    if os.geteuid() != 0:
        pytest.fail("sandboxes need root (namespaces, cgroups)")
    root = tempfile.mkdtemp(prefix="tangram-op-test-")
    m = CpuManager(CpuManagerConfig(work_root=root, sandbox_uid=TEST_UID, sandbox_gid=TEST_UID,
                                    warm_min=0, warm_max=1))
    await m.start()
    try:
        pool = m._pool
        for op in ("bogus", None):
            sb = await pool.spawn()
            try:
                req = {"code": "print('ran')", "lang": {"name": "python", "file": "main.py"}}
                if op is not None:
                    req["op"] = op
                reply = await sb.request(req)
            finally:
                pool.release(sb)
            assert reply == {"error": f"unknown op {op!r}: expected run, prepare, session or image"}
    finally:
        await m.aclose()
        shutil.rmtree(root, ignore_errors=True)
