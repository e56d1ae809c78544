"""Two CPU managers in one process (the nodes of a local executor) never share cgroups: each
writes its own slots' limits, so a shared slot would let one node's quota overwrite the
other's (found when a two-node replay's sandboxes landed in the same ``tangram-<pid>/sN``)."""

from __future__ import annotations

import asyncio
import os

import pytest

from arl_tangram.core.actions import ActionKind, ActionSpec
from arl_tangram.core.errors import IsolationUnavailable
from arl_tangram.core.resources import Resources

pytestmark = pytest.mark.needs_root


async def _two() -> None:
    from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig

    ms = [CpuManager(CpuManagerConfig(warm_min=1, warm_max=2)) for _ in range(2)]
    try:
        for m in ms:
            await m.start()
    except IsolationUnavailable as e:
        pytest.skip(f"isolation unavailable here: {e}")
    try:
        a, b = (m._cgroups for m in ms)
        assert a.tag != b.tag
        assert not set(a.bases.values()) & set(b.bases.values())
        fa, fb = (m._freezers for m in ms)
        if fa is not None and fb is not None and fa.base is not None:
            assert fa.base != fb.base
        # both run, each under its own quota
        runs = [m.run(ActionSpec(id=f"a{i}", kind=ActionKind.CODE,
                                 payload={"code": "print(sum(range(10**5)))", "language": "python"}),
                      Resources(cpu=c, memory_mb=256))
                for i, (m, c) in enumerate(zip(ms, (0.5, 1.0), strict=True))]
        for r in await asyncio.gather(*runs):
            assert r.status == "Success", r
        slots = [s for m in ms for s in os.listdir(m._cgroups.bases["cpu"])]
        assert slots  # (each tree holds its own slots)
    finally:
        for m in ms:
            await m.aclose()


def test_two_managers_in_one_process_have_their_own_cgroups() -> None:
    asyncio.run(_two())
