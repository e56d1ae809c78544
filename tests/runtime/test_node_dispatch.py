"""A node's commands go through one table (`runtime.node.dispatch`, issue 36 item 2): each
type to its path and the key of its task; a type the table lacks is ignored with a warning, a
ResizeWarmPool runs at once (no task), and a second task under a key in use is kept apart."""

from __future__ import annotations

import asyncio
import logging

import pytest

from arl_tangram.core import commands as C
from arl_tangram.core.errors import ClosedError
from arl_tangram.runtime.images import in_use
from arl_tangram.runtime.node import NodeHost
from arl_tangram.runtime.node.dispatch import Dispatcher


class _Cpu:
    def __init__(self) -> None:
        self.targets: list[tuple[str, int]] = []

    def set_warm_target(self, key: str, size: int) -> None:
        self.targets.append((key, size))


async def test_the_table_names_every_command_and_ignores_others(caplog) -> None:
    cpu = _Cpu()
    host = NodeHost("n0", emit=lambda e: None, cpu_manager=cpu)  # type: ignore[arg-type]
    assert set(host.dispatcher.table) == {
        C.StartAction, C.RunBatch, C.LoadModel, C.UnloadModel, C.CancelAction, C.ResizeAction,
        C.OpenSession, C.CloseSession, C.ResizeWarmPool}
    caplog.set_level(logging.WARNING, logger="arl_tangram.runtime.node.dispatch")
    host.submit("not a command")  # type: ignore[arg-type]
    assert caplog.records[-1].getMessage() == "node n0: ignoring unknown command 'not a command'"
    host.submit(C.ResizeWarmPool("n0", "python", 3))
    assert cpu.targets == [("python", 3)] and host.dispatcher.tasks == {}


async def test_tasks_under_one_key_are_kept_apart_and_forgotten_when_done() -> None:
    d = Dispatcher("n0", {})
    gate = asyncio.Event()
    d.spawn("k", gate.wait())
    d.spawn("k", gate.wait())
    keys = sorted(d.tasks)
    assert keys[0] == "k" and keys[1].startswith("k#")
    gate.set()
    await asyncio.sleep(0.01)
    assert d.tasks == {}


def test_a_node_not_started_has_no_cpu_manager() -> None:
    host = NodeHost("n0", emit=lambda e: None)
    with pytest.raises(ClosedError, match="node n0: not started"):
        host.cpu  # noqa: B018
    assert str(in_use("x", 2, "n0")) == ("image 'x' is in use by 2 session(s)/action(s) on "
                                         "node n0; close them first")
