"""The owner of every background task the daemon starts.

A task started here stays referenced until it ends, and its end is always handled: its
exception is retrieved and handed to the callback of the code that started it (``on_error``:
a fetch fails its copy, a reduce feeds its plan), or, without one, logged: a typed error as one
line (the operation's caller got it already), anything else with its traceback as a bug. The
daemon starts tasks no other way (tests/unit/test_tasks.py checks; only a peer link reaps its
own), so asyncio never has to report "Task exception was never retrieved". Stopping the daemon
cancels what is still running.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from hoplite_client.wire.errors import HopliteError

log = logging.getLogger("hoplited.tasks")

T = TypeVar("T")

# What a task's owner does with the exception its task ended with (never a cancellation).
OnError = Callable[[BaseException], None]


class Tasks:
    """Spawns, tracks and, at shutdown, cancels background tasks."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T], name: str,
              on_error: OnError | None = None) -> asyncio.Task[T]:
        """Run ``coro`` in the background; if it fails, ``on_error`` gets the exception (no
        callback: it is logged). Either way it is retrieved, never lost."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._done(done, on_error))
        return task

    def _done(self, task: asyncio.Task[Any], on_error: OnError | None) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        if on_error is None:
            _log_end(task.get_name(), exc)
            return
        try:
            on_error(exc)
        except Exception as bug:  # the owner's handler must not lose the task's error either
            log.error("task %s: handling its failure (%s) crashed", task.get_name(), exc,
                      exc_info=bug)

    def __len__(self) -> int:
        return len(self._tasks)

    async def cancel_all(self) -> None:
        """Cancel every task still running and wait for them to finish."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)


def _log_end(name: str, exc: BaseException) -> None:
    """How a failed task nobody asked to hear about is reported: typed errors in one line."""
    if isinstance(exc, HopliteError):
        log.info("task %s ended: %s", name, exc)
    else:
        log.error("task %s crashed", name, exc_info=exc)
