"""DirectoryShard, the asyncio adapter over DirectoryState: waits, wake-ups and timeouts.

Source choice itself (chains, fan-out, no cycles, tombstones) is tested without a loop in
tests/unit/test_directory_state.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hoplite_client.wire.errors import (
    HopliteTimeoutError,
    NotOwnerError,
    ObjectExistsError,
    PeerUnavailableError,
)
from hoplite_client.wire.ids import ObjectID
from hoplited.directory.shard import DirectoryShard

SIZE = 1 << 20
SHORT = 0.05  # seconds: a timeout that must expire


def shard(fanout: int = 1, owners: dict[ObjectID, str] | None = None) -> DirectoryShard:
    owned = owners if owners is not None else {}
    return DirectoryShard(fanout, lambda n: True, lambda oid: owned.get(oid, "me"), "me")


def put(s: DirectoryShard, oid: ObjectID, holder: str = "src", version: bytes = b"v1",
        received: int | None = None) -> None:
    s.publish(oid, holder, SIZE, "<f4", [SIZE // 4], version, None, received)


async def parked(s: DirectoryShard, waiting: asyncio.Future[Any], n: int = 1) -> None:
    """Let ``waiting`` run until ``n`` requests wait on the shard."""
    for _ in range(100):
        if s.stats()["waiting_gets"] == n:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not waiting: {waiting}")


async def test_locate_waits_for_publish() -> None:
    """A locate before the put is answered by the put."""
    s, oid = shard(), ObjectID.random()
    waiting = asyncio.ensure_future(s.locate(oid, "r", 5, [], 0))
    await parked(s, waiting)
    put(s, oid)
    assert (await waiting).node == "src"
    stats = s.stats()
    assert (stats["entries"], stats["waiting_gets"]) == (1, 0)
    [described] = stats["sample"]
    assert (described["oid"], described["holders"]) == (oid.hex(), {"src": SIZE, "r": 0})
    assert described["story"] and all(isinstance(r, str) for r in described["story"])


async def test_locate_times_out_saying_why() -> None:
    """Without a put a locate times out, naming the reason; nothing is left waiting."""
    s, oid = shard(), ObjectID.random()
    with pytest.raises(HopliteTimeoutError, match=r"not put yet") as info:
        await s.locate(oid, "r", SHORT, [], 0)
    assert info.value.data["oid"] == oid.hex()
    assert s.stats()["waiting_gets"] == 0


async def test_zero_timeout_answers_or_fails_at_once() -> None:
    """Timeout 0 is one attempt: an answer if there is one, else a timeout."""
    s, oid = shard(), ObjectID.random()
    with pytest.raises(HopliteTimeoutError):
        await s.locate(oid, "r", 0, [], 0)
    put(s, oid)
    assert (await s.locate(oid, "r", 0, [], 0)).node == "src"


async def test_reattach_waits_until_a_complete_copy_appears() -> None:
    """A re-attach blocked by the no-cycle rule is answered once a later holder completes."""
    s, oid = shard(), ObjectID.random()
    put(s, oid)
    await s.locate(oid, "a", 1, [], 0)           # a <- src
    await s.locate(oid, "b", 1, [], 0)           # b <- a
    with pytest.raises(HopliteTimeoutError, match="no eligible source"):
        await s.locate(oid, "a", SHORT, ["src"], 100)
    waiting = asyncio.ensure_future(s.locate(oid, "a", 5, ["src"], 100))
    await parked(s, waiting)
    s.transfer_done(oid, "a", "b", complete=True)
    assert (await waiting).node == "b"


async def test_wait_object_waits_for_a_complete_copy() -> None:
    """wait_object returns once some live member holds every byte."""
    s, oid = shard(), ObjectID.random()
    put(s, oid, received=SIZE // 2)
    waiting = asyncio.ensure_future(s.wait_object(oid, 5))
    await parked(s, waiting)
    s.progress(oid, "src", SIZE - 1)
    put(s, oid)
    entry = await waiting
    assert entry.complete_holders() == ["src"]


async def test_fail_wakes_waiters_with_the_error() -> None:
    """A waiter for an id that will never exist gets the tombstone's error at once."""
    s, oid = shard(), ObjectID.random()
    error = PeerUnavailableError("reduce input lost", node="n9")
    waiting = asyncio.ensure_future(s.wait_object(oid, 5))
    await parked(s, waiting)
    s.fail(oid, error)
    with pytest.raises(PeerUnavailableError):
        await waiting
    put(s, oid)  # a put lifts the tombstone
    assert (await s.wait_object(oid, 0)).version == b"v1"


async def test_membership_change_sends_waiters_to_the_new_owner() -> None:
    """Entries owned elsewhere are dropped and every waiter re-checks its owner."""
    owners: dict[ObjectID, str] = {}
    s = shard(owners=owners)
    kept, moved, pending = ObjectID.random(), ObjectID.random(), ObjectID.random()
    put(s, kept)
    put(s, moved)
    waiting = asyncio.ensure_future(s.locate(pending, "r", 5, [], 0))
    await parked(s, waiting)
    owners[moved] = owners[pending] = "other"
    assert s.membership_changed() == 1
    with pytest.raises(NotOwnerError) as info:
        await waiting
    assert info.value.data["owner"] == "other"
    assert list(s.entries) == [kept]


async def test_requests_for_foreign_ids_name_the_owner() -> None:
    """A shard asked about an id it does not own answers NotOwner with the owner's id."""
    s = DirectoryShard(1, lambda n: True, lambda oid: "elsewhere", "me")
    with pytest.raises(NotOwnerError) as info:
        await s.locate(ObjectID.random(), "r", 1, [], 0)
    assert info.value.data["owner"] == "elsewhere"


def test_adapter_forwards_results() -> None:
    """delete names the holders, a second version is refused, the story is readable."""
    s, oid = shard(), ObjectID.random()
    put(s, oid)
    with pytest.raises(ObjectExistsError):
        put(s, oid, holder="x", version=b"v2")
    s.forget_node("gone")
    assert s.entries[oid].holders["src"].received == SIZE
    assert s.delete(oid) == (b"v1", ["src"])
    assert [outcome for _, outcome in s.story(oid)] == [
        "new entry", "refused: a complete copy of another version is on src",
        "holders ['src'] drop their copies"]
