"""A peer's requests take effect in the order they arrive (docs/design.md §5, "Deletes and
moving owners"): a producer announces its result, then records that the reduce failed; if the
announcement were handled after the record (as an asynchronous handler would be), it would
erase the record, and every get of the result would wait out its timeout instead of failing
at once. The soak test found that ordering broken by a change that made ``Announce``
asynchronous."""

from __future__ import annotations

import asyncio
import os

import pytest
from helpers import IO_TIMEOUT, dial_as_peer

from hoplite_client.wire.errors import CapacityError
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import Announce, FailEntry, Holding
from hoplited.memory.store import VERSION_SIZE

pytestmark = pytest.mark.net

SIZE = 1 << 20


async def test_an_announcement_then_a_failure_record_fail_the_get(make_cluster, connect) -> None:  # type: ignore[no-untyped-def]
    cluster = await make_cluster(1)  # one shard: it owns every id
    protocol, channel = await dial_as_peer(cluster, "producer")
    client = await connect(cluster.sockets[0])
    oid = ObjectID.random()
    try:
        holding = Holding(oid=oid, size=SIZE, dtype="|u1", shape=[SIZE],
                          version=os.urandom(VERSION_SIZE), received=0, producing=True,
                          source=None, serving=0, receivers=0)
        announced = asyncio.ensure_future(channel.request(Announce(holdings=[holding])))
        failed = asyncio.ensure_future(channel.request(FailEntry(
            oid=oid, code=CapacityError.code, message="the reduce ran out of memory")))
        await asyncio.gather(announced, failed)  # sent back to back, answered in turn
        with pytest.raises(CapacityError, match="ran out of memory"):
            await asyncio.wait_for(client.get(oid, timeout=IO_TIMEOUT), IO_TIMEOUT / 2)
    finally:
        protocol.abort()
