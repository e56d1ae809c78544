"""A node's commands to their handlers (`Dispatcher`): a table from command type to the
handler that runs it and the key of the task it runs in, like the core's dispatch of events.

A handler does at once what must precede the next command (note an action being handed, a
session opening) and returns the coroutine to run as a task, or None when nothing is left to
run. A command of a subclass runs as its base (an `EvictSession` is a `CloseSession`). Tasks
are kept by key until they end; `cancel` ends every one (`NodeHost.aclose`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from ...core import commands as C

log = logging.getLogger(__name__)

Run = Coroutine[Any, Any, None]
# command type -> (the key of its task, its handler)
Table = Mapping[type, tuple[Callable[[Any], str], Callable[[Any], Run | None]]]


class Dispatcher:
    """Runs each command with the handler its type names in ``table``."""

    def __init__(self, node: str, table: Table) -> None:
        self.node, self.table = node, dict(table)
        self.tasks: dict[str, asyncio.Task[Any]] = {}

    def submit(self, cmd: C.Command) -> None:
        """Start executing one command; its outcome comes back through the node's events."""
        got = self.table.get(type(cmd))
        if got is None:  # a subclass (EvictSession is a CloseSession) runs as its base
            got = next((self.table[t] for t in type(cmd).__mro__ if t in self.table), None)
        if got is None:
            log.warning("node %s: ignoring unknown command %r", self.node, cmd)
            return
        key, handler = got
        coro = handler(cmd)
        if coro is not None:
            self.spawn(key(cmd), coro)

    def spawn(self, key: str, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        if key in self.tasks:
            key = f"{key}#{id(task)}"
        self.tasks[key] = task

        def forget(_t: asyncio.Task[Any], k: str = key) -> None:
            self.tasks.pop(k, None)

        task.add_done_callback(forget)

    async def cancel(self) -> None:
        """Cancel every task and wait for them to end."""
        tasks = list(self.tasks.values())
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
