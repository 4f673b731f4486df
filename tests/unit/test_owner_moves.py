"""A request pending at an object's owner while that object moves to another shard.

The request runs in its caller's task; a move cancels that task and takes the cancellation
back (docs/design.md §2.4, "Small requests"), then asks the new owner. These tests drive a real
``Rpc`` whose links are plain objects standing in for two peers: ``silent`` never answers (a
member that fell under suspicion), ``standin`` answers at once.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from hoplite_client.net.handshake import Identity
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import Locate
from hoplited.rpc import Rpc
from hoplited.tasks import Tasks

WAIT = 30.0  # bounds a bug only: every answer here comes at once


class Peer:
    """A member's link: answers every request with its own name, or never (``silent``)."""

    def __init__(self, name: str, silent: bool) -> None:
        self.name = name
        self.silent = silent
        self.asked: list[ObjectID] = []
        self.pending = 0

    async def request(self, msg: Locate, payload: Any, timeout: float | None) -> Any:
        self.asked.append(msg.oid)
        if not self.silent:
            return SimpleNamespace(msg=self.name)
        self.pending += 1
        try:
            await asyncio.Event().wait()
        finally:
            self.pending -= 1
        raise AssertionError("a silent member answered")


class Cluster:
    """Membership and links as an ``Rpc`` sees them; ``owners`` is who owns which id now."""

    suspected: set[str] = set()

    def __init__(self) -> None:
        self.peers = {"silent": Peer("silent", True), "standin": Peer("standin", False)}
        self.owners: dict[ObjectID, str] = {}

    def owner(self, oid: ObjectID) -> str:
        return self.owners[oid]

    def get(self, node: str) -> Peer:
        return self.peers[node]


def make_rpc(cluster: Cluster) -> Rpc:
    return Rpc(Identity("me", b""), cluster, cluster, Tasks(),  # type: ignore[arg-type]
               retry_window=WAIT)


def locate(oid: ObjectID) -> Locate:
    return Locate(oid=oid, timeout=None, exclude=[], offset=0)


async def pending_at(peer: Peer, count: int = 1) -> None:
    for _ in range(int(WAIT / 0.001)):
        if peer.pending == count:
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"{peer.name} never had {count} requests pending")


async def test_a_move_sends_the_pending_request_to_the_new_owner() -> None:
    """The silent owner's request is given up when the id moves; the caller's task gets the
    new owner's answer and carries on uncancelled."""
    cluster, oid = Cluster(), ObjectID.random()
    cluster.owners[oid] = "silent"
    rpc = make_rpc(cluster)

    async def caller() -> tuple[Any, int]:
        frame = await rpc.call_owner(oid, locate(oid))
        await asyncio.sleep(0)  # a cancellation left pending would land here
        task = asyncio.current_task()
        assert task is not None
        return frame.msg, task.cancelling()

    task = asyncio.create_task(caller())
    await pending_at(cluster.peers["silent"])
    cluster.owners[oid] = "standin"
    rpc.owners_changed()
    assert await asyncio.wait_for(task, WAIT) == ("standin", 0)
    assert cluster.peers["silent"].pending == 0, "the abandoned request still waits"
    assert cluster.peers["standin"].asked == [oid]


async def test_a_move_of_other_ids_leaves_a_pending_request_alone() -> None:
    cluster, oid, other = Cluster(), ObjectID.random(), ObjectID.random()
    cluster.owners |= {oid: "silent", other: "silent"}
    rpc = make_rpc(cluster)
    task = asyncio.create_task(rpc.call_owner(oid, locate(oid)))
    await pending_at(cluster.peers["silent"])
    cluster.owners[other] = "standin"
    rpc.owners_changed()
    await asyncio.sleep(0.01)
    assert not task.done() and cluster.peers["silent"].pending == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("order", ["cancel, then move", "move, then cancel"])
async def test_a_caller_cancelled_around_a_move_stays_cancelled(order: str) -> None:
    """A cancellation from outside is never taken back as the move's own, whichever of the
    two comes first."""
    cluster, oid = Cluster(), ObjectID.random()
    cluster.owners[oid] = "silent"
    rpc = make_rpc(cluster)
    task = asyncio.create_task(rpc.call_owner(oid, locate(oid)))
    await pending_at(cluster.peers["silent"])
    cluster.owners[oid] = "standin"
    if order == "cancel, then move":
        task.cancel()
        rpc.owners_changed()
    else:
        rpc.owners_changed()
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, WAIT)
    assert cluster.peers["standin"].asked == []


async def test_a_move_seen_by_the_requests_own_task_cancels_nothing() -> None:
    """``owners_changed`` run by the very task whose request is watched (it is running, so
    not waiting on the request) must not leave a cancellation for its next await."""
    cluster, oid = Cluster(), ObjectID.random()
    cluster.owners[oid] = "standin"
    rpc = make_rpc(cluster)
    peer = cluster.peers["standin"]
    answer = peer.request

    async def moving_request(msg: Locate, payload: Any, timeout: float | None) -> Any:
        cluster.owners[oid] = "silent"
        rpc.owners_changed()  # on this task, before the answer is handed back
        return await answer(msg, payload, timeout)

    peer.request = moving_request  # type: ignore[method-assign]

    async def caller() -> Any:
        frame = await rpc.call_owner(oid, locate(oid))
        await asyncio.sleep(0)
        return frame.msg

    assert await asyncio.wait_for(caller(), WAIT) == "standin"


async def test_a_cancellation_swallowed_below_is_taken_back_all_the_same() -> None:
    """A request that swallows the move's cancellation and answers anyway: its answer is the
    caller's, and the caller's task is left with no cancellation counted."""
    cluster, oid = Cluster(), ObjectID.random()
    cluster.owners[oid] = "silent"
    rpc = make_rpc(cluster)
    waiting = asyncio.Event()

    async def stubborn(msg: Locate, payload: Any, timeout: float | None) -> Any:
        waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass  # a layer below that ends its wait its own way
        return SimpleNamespace(msg="stubborn")

    cluster.peers["silent"].request = stubborn  # type: ignore[method-assign]

    async def caller() -> tuple[Any, int]:
        frame = await rpc.call_owner(oid, locate(oid))
        await asyncio.sleep(0)
        task = asyncio.current_task()
        assert task is not None
        return frame.msg, task.cancelling()

    task = asyncio.create_task(caller())
    await asyncio.wait_for(waiting.wait(), WAIT)
    cluster.owners[oid] = "standin"
    rpc.owners_changed()
    assert await asyncio.wait_for(task, WAIT) == ("stubborn", 0)
