"""Issue 41, review M3: one tenant could take a node's whole layer budget, and another's session
then failed to open with its reason lost ("session ... is not open on this node"). Each owner
(tenant) may have MiB of the budget kept for it (`CpuManager.set_layer_reservations`): below its
reservation it is never refused because others filled the node; an action naming a session
whose open failed is told why. Real sandboxes, real disk layers."""

from __future__ import annotations

import asyncio
import os
import tempfile

import pytest
from _cpu_fixture import mgr  # noqa: F401
from _cpu_helpers import action, allot

from arl_tangram.core.actions import ActionKind
from arl_tangram.core.resources import Resources
from arl_tangram.managers.cpu import CpuManager
from arl_tangram.managers.cpu.images import imagekit
from arl_tangram.managers.cpu.images.store import ImageError

pytestmark = [pytest.mark.integration, pytest.mark.needs_root, pytest.mark.asyncio(loop_scope="module")]

R = Resources(cpu=0.5, memory_mb=128)


@pytest.fixture(scope="module")
def mini_rootfs() -> str:
    d = tempfile.mkdtemp(prefix="tangram-mini-")
    return imagekit.host_rootfs(os.path.join(d, "rootfs"))


async def _image(m: CpuManager, rootfs: str) -> str:
    assert m.images is not None
    if not m.images.has("mini"):
        await asyncio.to_thread(m.images.import_path, rootfs, "mini")
    return "mini"


async def test_an_action_naming_a_session_whose_open_failed_is_told_why(
        mgr: CpuManager, mini_rootfs: str) -> None:  # noqa: F811
    assert mgr.layers is not None and mgr.layers.used_mb == 0
    img = await _image(mgr, mini_rootfs)
    budget = mgr.layers.budget_mb
    mgr.layers.budget_mb = 16
    try:
        with pytest.raises(ImageError):
            await mgr.open_session("m3-big", R, 60, image=img, layer_mb=32)
        r = await mgr.run(action("echo x", kind=ActionKind.TOOL, session="m3-big",
                                 language="bash"), allot())
        assert (r.status, r.message) == (
            "SandboxError", "session 'm3-big' is not open on this node: it could not be opened "
            "(ImageError: the node's layer budget is spent: 0 of 16 MiB held by open layers, "
            "32 MiB asked)")
        # a later open of the same id that works forgets the reason
        await mgr.open_session("m3-big", R, 60, image=img, layer_mb=8)
        r = await mgr.run(action("echo ok", kind=ActionKind.TOOL, session="m3-big",
                                 language="bash"), allot())
        assert r.status == "Success" and r.run_result is not None and r.run_result.stdout == "ok\n"
        await mgr.close_session("m3-big")
        r = await mgr.run(action("echo x", kind=ActionKind.TOOL, session="m3-big",
                                 language="bash"), allot())
        assert (r.status, r.message) == ("SandboxError", "session 'm3-big' is not open on this node")
    finally:
        mgr.layers.budget_mb = budget
        await mgr.close_session("m3-big")


async def test_a_tenant_below_its_reservation_is_not_refused_because_another_filled_the_node(
        mgr: CpuManager, mini_rootfs: str) -> None:  # noqa: F811
    assert mgr.layers is not None and mgr.layers.used_mb == 0
    img = await _image(mgr, mini_rootfs)
    budget = mgr.layers.budget_mb
    mgr.layers.budget_mb = 40
    try:
        with pytest.raises(ValueError, match="reservations of 48 MiB in all exceed"):
            mgr.set_layer_reservations({"alice": 24, "bob": 24})
        mgr.set_layer_reservations({"alice": 16, "bob": 16})  # (8 MiB shared)
        await mgr.open_session("b1", R, 60, image=img, layer_mb=16, owner="bob")
        await mgr.open_session("b2", R, 60, image=img, layer_mb=8, owner="bob")  # the shared 8
        with pytest.raises(ImageError) as e:
            await mgr.open_session("b3", R, 60, image=img, layer_mb=8, owner="bob")
        assert str(e.value) == ("the node's layer budget is spent: 24 of 40 MiB held by open "
                                "layers, 16 MiB kept for other tenants below their reservation, "
                                "8 MiB asked")
        with pytest.raises(ImageError):  # (nor a one without an owner: it is no tenant's)
            await mgr.open_session("n1", R, 60, image=img, layer_mb=8)
        await mgr.open_session("a1", R, 60, image=img, layer_mb=8, owner="alice")
        await mgr.open_session("a2", R, 60, image=img, layer_mb=8, owner="alice")
        assert (mgr.layers.used_mb, mgr.layers.held) == (40, {"bob": 24, "alice": 16})
        for sid in ("a1", "a2", "b1", "b2"):
            r = await mgr.run(action("echo $((6 * 7)) > /srv/f && cat /srv/f",
                                     kind=ActionKind.TOOL, session=sid, language="bash"), allot())
            assert r.status == "Success" and r.run_result is not None, r
            assert r.run_result.stdout == "42\n", r
        await mgr.close_session("a2")
        assert mgr.layers.held == {"bob": 24, "alice": 8}
        with pytest.raises(ImageError, match="8 MiB kept for other tenants"):
            await mgr.open_session("b3", R, 60, image=img, layer_mb=8, owner="bob")
    finally:
        mgr.layers.budget_mb = budget
        mgr.set_layer_reservations({})
        for sid in ("a1", "a2", "b1", "b2", "b3", "n1"):
            await mgr.close_session(sid)
    assert (mgr.layers.used_mb, mgr.layers.held) == (0, {})
