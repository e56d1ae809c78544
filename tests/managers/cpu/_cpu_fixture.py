"""A real CPU manager for integration tests. Where this machine cannot isolate it skips, and on
root Linux that skip is reported as a failure naming why (tests/_skip_policy.py, issue 27)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from _cpu_helpers import TEST_IDS, TEST_UID

from arl_tangram.core.errors import IsolationUnavailable
from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig

OUTPUT_CAP = 64 << 10
WORKDIR_MB = 32


def _direct_override() -> dict[str, bool]:
    """TANGRAM_CPU_DIRECT_PYTHON=0/1 runs the suite with that Python path (default: config's)."""
    v = os.environ.get("TANGRAM_CPU_DIRECT_PYTHON")
    return {} if v is None else {"direct_python": v == "1"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mgr() -> AsyncIterator[CpuManager]:
    if os.geteuid() != 0:
        pytest.skip("sandboxes need root (namespaces, cgroups)")
    root = tempfile.mkdtemp(prefix="tangram-cpu-test-")
    m = CpuManager(CpuManagerConfig(work_root=root, sandbox_uid=TEST_UID, sandbox_gid=TEST_UID,
                                    output_limit_bytes=OUTPUT_CAP, workdir_max_mb=WORKDIR_MB,
                                    warm_min=2, warm_max=8, session_reap_interval_s=0.2,
                                    **TEST_IDS, **_direct_override()))
    try:
        await m.start()
    except IsolationUnavailable as e:
        pytest.skip(f"isolation unavailable here: {e}")
    yield m
    await m.aclose()
