"""The apps' Hoplite transport against a real daemon: a reduce that fails ends its caller's
wait with TransportError, whatever the failure (bench/apps/transport.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

import hoplite_client

pytest.importorskip("ray", reason="hoplite[ray] is not installed")
from bench.apps.transport import HopliteTransport, TransportError  # noqa: E402
from hoplite_client.wire.ids import ObjectID  # noqa: E402

BOUND = 60.0  # a wait that has not ended by now never will: the test fails


async def in_thread(call: Callable[[], Any]) -> Any:
    """``call()`` in a daemon thread (the app calls from a plain thread); its result, or
    TimeoutError after BOUND s, leaving a call that never returns behind."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def run() -> None:
        try:
            result = call()
        except BaseException as exc:  # handed to the test as it is
            loop.call_soon_threadsafe(done.set_exception, exc)
        else:
            loop.call_soon_threadsafe(done.set_result, result)

    threading.Thread(target=run, daemon=True, name="app-call").start()
    return await asyncio.wait_for(done, BOUND)


async def test_a_reduce_that_times_out_ends_the_wait(make_cluster) -> None:
    """The reduce's input never comes: its HopliteTimeoutError, itself a TimeoutError, was
    taken for the end of a poll and raised again at once, forever (the async SGD app's
    ParameterServer spun at full CPU with its memory growing by 100 MB/s)."""
    cluster = await make_cluster(1)
    transport = await asyncio.to_thread(
        HopliteTransport, lambda: hoplite_client.connect(cluster.sockets[0]))
    try:
        with pytest.raises(TransportError, match="HopliteTimeoutError"):
            await in_thread(lambda: transport.sum_first([ObjectID.random()], 1, 0.5))
    finally:
        await asyncio.to_thread(transport.close)


async def test_a_caller_that_gives_up_ends_the_wait(make_cluster) -> None:
    """An input that may still come, but whose producer the caller gave up on: the wait ends
    at the next poll, and the reduce is left to its own timeout."""
    cluster = await make_cluster(1)
    transport = await asyncio.to_thread(
        HopliteTransport, lambda: hoplite_client.connect(cluster.sockets[0]))
    asked = 0

    def give_up() -> bool:
        nonlocal asked
        asked += 1
        return asked >= 3

    try:
        with pytest.raises(TransportError, match="abandoned"):
            await in_thread(lambda: transport.sum_first([ObjectID.random()], 1, 30.0, give_up))
        assert asked == 3
    finally:
        await asyncio.to_thread(transport.close)
