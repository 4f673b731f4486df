"""The directory shard's source choice: chains, fan-out, no cycles, waits."""

from __future__ import annotations

import asyncio

import pytest

from hoplite_client.wire.errors import HopliteTimeoutError, NotOwnerError, ObjectExistsError
from hoplite_client.wire.ids import ObjectID
from hoplited.directory.shard import DirectoryShard

SIZE = 1 << 20


def shard(fanout: int = 1, dead: frozenset[str] = frozenset()) -> DirectoryShard:
    return DirectoryShard(fanout, lambda n: n not in dead, lambda oid: "me", "me")


def put(s: DirectoryShard, oid: ObjectID, holder: str = "src") -> None:
    s.publish(oid, holder, SIZE, "<f4", [SIZE // 4], b"v1", None)


async def test_simultaneous_receivers_form_a_chain() -> None:
    """With fan-out 1, each new receiver is served by the previous one."""
    s, oid = shard(), ObjectID.random()
    put(s, oid)
    sources = [(await s.locate(oid, f"r{i}", 1, [], 0)).node for i in range(5)]
    assert sources == ["src", "r0", "r1", "r2", "r3"]


async def test_fanout_two_builds_a_tree() -> None:
    """With fan-out 2, every holder serves two receivers before a deeper one is used."""
    s, oid = shard(fanout=2), ObjectID.random()
    put(s, oid)
    sources = [(await s.locate(oid, f"r{i}", 1, [], 0)).node for i in range(6)]
    assert sources.count("src") == 2 and max(sources.count(x) for x in set(sources)) == 2


async def test_complete_holder_preferred_and_slot_freed_when_done() -> None:
    """A finished transfer frees its source's slot; a complete copy beats a partial one."""
    s, oid = shard(), ObjectID.random()
    put(s, oid)
    assert (await s.locate(oid, "a", 1, [], 0)).node == "src"
    s.transfer_done(oid, "src", "a", complete=True)
    assert (await s.locate(oid, "b", 1, [], 0)).node in ("src", "a")
    assert s.entries[oid].holders["a"].received == SIZE


async def test_resume_never_picks_a_later_partial_holder() -> None:
    """A receiver re-attaching excludes partial holders enrolled after it (no cycles)."""
    s, oid = shard(), ObjectID.random()
    put(s, oid)
    await s.locate(oid, "a", 1, [], 0)           # a <- src
    await s.locate(oid, "b", 1, [], 0)           # b <- a
    with pytest.raises(HopliteTimeoutError):      # a loses src: b is downstream of a
        await s.locate(oid, "a", 0.05, ["src"], 100)


async def test_dead_holders_are_not_sources() -> None:
    """Sources on dead members are skipped."""
    s, oid = shard(dead=frozenset({"src"})), ObjectID.random()
    put(s, oid)
    put(s, oid, holder="other")
    assert (await s.locate(oid, "r", 1, [], 0)).node == "other"


async def test_locate_waits_for_publish_and_times_out() -> None:
    """A locate before the put is answered by the put; without a put it times out."""
    s, oid = shard(), ObjectID.random()
    waiting = asyncio.ensure_future(s.locate(oid, "r", 5, [], 0))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    put(s, oid)
    assert (await waiting).node == "src"
    with pytest.raises(HopliteTimeoutError):
        await s.locate(ObjectID.random(), "r", 0.05, [], 0)


def test_second_put_with_another_version_is_refused() -> None:
    """An id whose copy is alive cannot be put again with different bytes."""
    s, oid = shard(), ObjectID.random()
    put(s, oid)
    with pytest.raises(ObjectExistsError):
        s.publish(oid, "x", SIZE, "<f4", [SIZE // 4], b"v2", None)


async def test_requests_for_foreign_ids_name_the_owner() -> None:
    """A shard asked about an id it does not own answers NotOwner with the owner's id."""
    s = DirectoryShard(1, lambda n: True, lambda oid: "elsewhere", "me")
    with pytest.raises(NotOwnerError) as info:
        await s.locate(ObjectID.random(), "r", 1, [], 0)
    assert info.value.data["owner"] == "elsewhere"
