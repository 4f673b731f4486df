"""A copy made from a shard's answer after the owners moved is announced to the new owner.

The move's re-announcement ran before the copy existed, so only the shard that answered lists
it; when that stand-in gives the id back to its trusted owner, that owner's delete would leave
the copy behind, listed nowhere (docs/design.md §5, "Deletes and moving owners"). A real arena
and store; the owner shard is a plain object standing in for the peer, recording what it hears.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from hoplite_client.wire.frames import INLINE_MAX
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import Announce, Publish
from hoplited.cluster.membership import OwnerSet
from hoplited.directory.client import DirectoryClient
from hoplited.memory.arena import PAGE, Arena
from hoplited.memory.store import ObjectStore, StoredObject
from hoplited.tasks import Tasks

pytestmark = pytest.mark.unit

OWNER = "owner"
WAIT = 30.0  # the announcement ends at once; this only bounds a bug


class Owner:
    """The current owner shard: accepts everything and records it."""

    retry_window = 30.0

    def __init__(self) -> None:
        self.heard: list[Any] = []

    async def call_node(self, node: str, msg: Announce) -> None:
        assert node == OWNER
        self.heard.append(msg)

    async def call_owner(self, oid: ObjectID, msg: Publish, payload: Any = None,
                         **kwargs: Any) -> None:
        self.heard.append(msg)


class Membership:
    owner_set = OwnerSet([OWNER])

    def owner(self, oid: ObjectID) -> str:
        return OWNER


@pytest.fixture
def store() -> Iterator[ObjectStore]:
    arena = Arena(8 * (INLINE_MAX + PAGE))
    yield ObjectStore(arena)
    arena.close()


def copy(store: ObjectStore, size: int, complete: bool) -> StoredObject:
    """A copy fetched here: all of it, or a third so far."""
    obj = store.create(ObjectID.random(), size, "uint8", [size])
    obj.advance(size if complete else size // 3)
    return obj


async def announced(owner: Owner, tasks: Tasks) -> list[Any]:
    for _ in range(int(WAIT / 0.01)):
        if not len(tasks):
            break
        await asyncio.sleep(0.01)
    assert not len(tasks), "the announcement never ended"
    return owner.heard


@pytest.mark.parametrize("size, complete, heard", [
    (INLINE_MAX + PAGE, False, Announce),  # a partial large copy: its holding, moved
    (INLINE_MAX + PAGE, True, Announce),
    (64, True, Publish),  # a small copy goes with its bytes, as a move republishes it
    (64, False, None),  # a small partial copy is never listed
])
async def test_a_copy_asked_for_before_the_owners_moved_is_announced_to_the_new_owner(
        store: ObjectStore, size: int, complete: bool, heard: type | None) -> None:
    owner, tasks = Owner(), Tasks()
    client = DirectoryClient(owner, store, Membership(), tasks)  # type: ignore[arg-type]
    obj = copy(store, size, complete)
    client.announce_late(obj, OwnerSet(["gone"]), lambda _: "source")
    messages = await announced(owner, tasks)
    if heard is None:
        assert messages == []
        return
    [msg] = messages
    assert type(msg) is heard and msg.moved
    if isinstance(msg, Announce):
        [holding] = msg.holdings
        assert (holding.oid, holding.version, holding.received) == (obj.oid, obj.version,
                                                                      obj.received)
        assert holding.source == (None if complete else "source")
    else:
        assert (msg.oid, msg.version) == (obj.oid, obj.version)


async def test_a_copy_asked_for_under_the_current_owners_is_not_announced_again(
        store: ObjectStore) -> None:
    owner, tasks = Owner(), Tasks()
    client = DirectoryClient(owner, store, Membership(), tasks)  # type: ignore[arg-type]
    client.announce_late(copy(store, INLINE_MAX + PAGE, True), Membership.owner_set,
                         lambda _: None)
    assert await announced(owner, tasks) == []
