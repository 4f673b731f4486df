"""The owner of the daemon's background tasks: every end handled, no exception left unread.

A failed task nobody read makes asyncio report "Task exception was never retrieved" through the
loop's exception handler when the task is collected; these tests install their own handler and
assert it is never called for tasks started through ``Tasks`` (and is, for a bare task, so the
check can see what it looks for). A structural test keeps the daemon from starting tasks any
other way.
"""

from __future__ import annotations

import ast
import asyncio
import gc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import hoplited
from hoplite_client.wire.errors import HopliteError, ObjectDeletedError
from hoplited.tasks import Tasks

# Modules of the daemon allowed to start tasks themselves, and why.
OWNERS = {
    "tasks.py": "the owner itself",
    "cluster/links.py": "a link's heartbeat, first dial and deferred notices, reaped by Link._reap",
}
STARTERS = {"create_task", "ensure_future"}


@pytest.fixture
async def unhandled() -> AsyncIterator[list[dict[str, Any]]]:
    """What reaches the running loop's exception handler while the test runs."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: seen.append(context))
    yield seen
    loop.set_exception_handler(previous)


async def collected() -> None:
    """Let done callbacks run, then collect every dropped task."""
    for _ in range(3):
        await asyncio.sleep(0)
    gc.collect()


async def fail(error: BaseException) -> None:
    await asyncio.sleep(0)
    raise error


async def test_a_failed_task_goes_to_its_owners_callback(
        unhandled: list[dict[str, Any]]) -> None:
    tasks = Tasks()
    got: list[BaseException] = []
    error = ObjectDeletedError("object deleted while fetched")
    task = tasks.spawn(fail(error), name="fetch", on_error=got.append)
    await asyncio.wait([task])
    del task
    await collected()
    assert got == [error]
    assert len(tasks) == 0
    assert unhandled == []


@pytest.mark.parametrize("error", [HopliteError("typed"), RuntimeError("a bug")],
                         ids=["typed", "bug"])
async def test_a_failed_task_without_a_callback_is_still_read(
        unhandled: list[dict[str, Any]], error: BaseException) -> None:
    tasks = Tasks()
    task = tasks.spawn(fail(error), name="populate")
    await asyncio.wait([task])
    del task
    await collected()
    assert unhandled == []


async def test_a_callback_that_fails_loses_nothing(unhandled: list[dict[str, Any]]) -> None:
    tasks = Tasks()

    def broken(exc: BaseException) -> None:
        raise RuntimeError("the owner's handler has a bug")

    task = tasks.spawn(fail(HopliteError("typed")), name="x", on_error=broken)
    await asyncio.wait([task])
    del task
    await collected()
    assert unhandled == []
    ok = tasks.spawn(asyncio.sleep(0, result=7), name="after")  # the owner still works
    assert await ok == 7


async def test_success_and_cancellation_call_no_callback(
        unhandled: list[dict[str, Any]]) -> None:
    tasks = Tasks()
    got: list[BaseException] = []
    done = tasks.spawn(asyncio.sleep(0, result=1), name="ok", on_error=got.append)
    forever = tasks.spawn(asyncio.Event().wait(), name="forever", on_error=got.append)
    assert await done == 1
    await tasks.cancel_all()
    assert forever.cancelled() and got == [] and len(tasks) == 0
    del done, forever
    await collected()
    assert unhandled == []


async def test_the_check_sees_an_unowned_failure(unhandled: list[dict[str, Any]]) -> None:
    """The control: a bare task that fails and is dropped does reach the handler."""
    task = asyncio.get_running_loop().create_task(fail(HopliteError("lost")))
    await asyncio.wait([task])
    del task
    await collected()
    assert [c["message"] for c in unhandled] == ["Task exception was never retrieved"]


def test_the_daemon_starts_tasks_only_through_their_owners() -> None:
    """Every module the daemon runs; the developer tools (hoplited/tools) run in a bench's or
    a test's process, not in the daemon."""
    root = Path(hoplited.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root).as_posix()
        if name in OWNERS or name.startswith("tools/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
                called = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
                if called in STARTERS:
                    offenders.append(f"{name}:{node.lineno} {called}")
    assert not offenders, f"start these through Tasks.spawn (an owner handles their end): " \
                          f"{offenders}"
