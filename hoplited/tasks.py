"""The owner of every background task the daemon starts.

A task started here stays referenced until it ends, and its end is always handled: a typed
error is logged as one line (the operation's caller got it already), anything else is logged
with its traceback as a bug. Stopping the daemon cancels what is still running.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

from hoplite_client.wire.errors import HopliteError

log = logging.getLogger("hoplited.tasks")

T = TypeVar("T")


class Tasks:
    """Spawns, tracks and, at shutdown, cancels background tasks."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        """Run ``coro`` in the background; its failure is logged, never lost."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        if isinstance(exc, HopliteError):
            log.info("task %s ended: %s", task.get_name(), exc)
        else:
            log.error("task %s crashed", task.get_name(), exc_info=exc)

    def __len__(self) -> int:
        return len(self._tasks)

    async def cancel_all(self) -> None:
        """Cancel every task still running and wait for them to finish."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
