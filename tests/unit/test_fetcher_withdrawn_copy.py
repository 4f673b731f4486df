"""A fetch that joins, in the same step, a fetch ended by its local copy's withdrawal
starts anew instead of spinning.

``bench/chaos.py`` seed 42, trial 19 (2026-11-28): a ring member's node had a fetch of the
result waiting on the member's own copy (the shard named this node as its source). The caller
withdrew that copy, and in the same step this node began fetching the result from the others.
The first fetch ended with ``CopyWithdrawn``, but its done-callbacks had not run yet, so the
new caller joined it, got ``CopyWithdrawn`` at once, asked again and joined it again, for ever
and without a pause: the daemon answered no ping and was declared dead. The fetcher here is
real, with a real store; the shard is a stand-in that names this node as the source (the
requester holds it) and fails every later ask.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from hoplite_client.net.handshake import Identity
from hoplite_client.wire.errors import ObjectNotFoundError
from hoplite_client.wire.frames import Frame
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import Located, MemberInfo
from hoplited.cluster.link_model import LinkModel
from hoplited.cluster.membership import Membership
from hoplited.memory.arena import Arena
from hoplited.memory.space import Space
from hoplited.memory.store import VERSION_SIZE, CopyWithdrawn, ObjectStore, StoredObject
from hoplited.tasks import Tasks
from hoplited.transfer.data_connections import DataConnections
from hoplited.transfer.fetcher import Fetcher
from hoplited.transfer.traffic import Traffic

SIZE = 4096
GONE = ObjectNotFoundError("no such object")


class Shard:
    """Answers the first locate, once ``here`` is set, with this node as the source (a
    ring member's copy, published as it completes), and fails every later one."""

    def __init__(self) -> None:
        self.asked = 0
        self.here = asyncio.Event()

    async def locate(self, oid: ObjectID, *args: Any) -> Frame[Located]:
        self.asked += 1
        if self.asked > 1:
            raise GONE
        await self.here.wait()
        return Frame(Located(source="me", size=SIZE, dtype="|u1", shape=[SIZE],
                             version=bytes(VERSION_SIZE)))


@pytest.mark.timeout(60)  # a spin blocks the loop: only the plugin's alarm would end it
async def test_a_fetch_joining_one_ended_by_a_withdrawn_copy_starts_anew() -> None:
    tasks = Tasks()
    arena = Arena(1 << 20)
    try:
        membership = Membership(MemberInfo(node_id="me", host="127.0.0.1", port=1, socket="",
                                           host_id="h"))
        identity = Identity("me", b"token")
        store = ObjectStore(arena)

        async def may_drop(obj: StoredObject) -> bool:
            return False

        shard = Shard()
        fetcher = Fetcher(identity, store, arena, cast(Any, shard), membership, LinkModel(),
                          Traffic(), tasks, stall_timeout=30.0, refused=lambda node: None,
                          space=Space(store, may_drop, tasks),
                          connections=DataConnections(identity, tasks, membership.is_alive))
        oid = ObjectID.random()
        first = asyncio.ensure_future(fetcher.fetch(oid, timeout=30.0))
        await asyncio.sleep(0.05)  # its fetch asks the shard, which holds the answer
        assert shard.asked == 1 and not first.done()
        # a ring member's copy, being written here: the fetch is told to wait on it
        store.create(oid, SIZE, "|u1", [SIZE], bytes(VERSION_SIZE), temporary=True)
        shard.here.set()
        await asyncio.sleep(0.05)
        assert not first.done()
        store.remove(oid, CopyWithdrawn("the ring was given up"))  # as a withdraw does,
        second = asyncio.ensure_future(fetcher.fetch(oid, timeout=30.0))  # then fetches
        async with asyncio.timeout(10.0):
            for fetch in (first, second):
                with pytest.raises(ObjectNotFoundError):
                    await fetch
        assert 2 <= shard.asked <= 3  # asked once more, by one new fetch per caller at most
    finally:
        await tasks.cancel_all()
        arena.close()
