"""Fencing on the wire: a real daemon refuses everything from a member it declared dead, and a
link whose address answers under another node id declares its member dead at once
(docs/design.md §5, "Declared dead, then running again")."""

from __future__ import annotations

import asyncio
import signal

import pytest
from helpers import IO_TIMEOUT, dial_as_peer, wait_member_dead

from hoplite_client.net.handshake import Identity, dial
from hoplite_client.wire.errors import DeclaredDeadError, PeerUnavailableError
from hoplite_client.wire.frames import INLINE_MAX
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import Announce, Holding, Join, MemberInfo, MemberUp, Ping, Stats
from hoplited.cluster.links import PeerLink
from hoplited.memory.store import VERSION_SIZE


async def test_a_member_declared_dead_is_refused_on_every_connection(make_cluster,
                                                                     connect) -> None:
    """Node 1 is killed and node 0 declares it dead. Under node 1's id, a Ping, a Join, an
    Announce and a Stats get DeclaredDeadError naming node 0, a one-way (MemberUp) changes
    nothing, and a data connection is closed at once; another id is served."""
    cluster = await make_cluster(2)
    client = await connect(cluster.sockets[0])
    dead_id, survivor = cluster.nodes[1].node_id, cluster.nodes[0].node_id
    cluster.kill(1, signal.SIGKILL)
    await wait_member_dead(client, dead_id)
    protocol, channel = await dial_as_peer(cluster, dead_id)
    try:
        member = MemberInfo(node_id=dead_id, host="127.0.0.1", port=1, socket="", host_id="")
        smuggled = MemberInfo(node_id="smuggled", host="127.0.0.1", port=1, socket="",
                              host_id="")
        holding = Holding(oid=ObjectID.random(), size=INLINE_MAX + 1, dtype="|u1",
                          shape=[INLINE_MAX + 1], version=bytes(VERSION_SIZE),
                          received=INLINE_MAX + 1, producing=False, source=None, serving=0,
                          receivers=0)
        channel.notify(MemberUp(member=smuggled))  # a one-way: dropped, unanswered
        for request in (Ping(), Join(member=member), Announce(holdings=[holding]), Stats()):
            with pytest.raises(DeclaredDeadError) as refused:
                await channel.request(request, timeout=IO_TIMEOUT)
            assert refused.value.data["by"] == survivor
    finally:
        protocol.abort()
    with open(cluster.token_file, "rb") as f:
        me = Identity(dead_id, f.read().strip())
    host, port = cluster.nodes[0].listen.rsplit(":", 1)
    data, _ = await dial(host, int(port), "data", me)
    try:
        async with asyncio.timeout(IO_TIMEOUT):
            await data.closed
    finally:
        data.abort()
    other, other_channel = await dial_as_peer(cluster, "another-daemon")
    try:
        await other_channel.request(Ping(), timeout=IO_TIMEOUT)
    finally:
        other.abort()
    local = (await client.status(timeout=IO_TIMEOUT))["local"]
    assert {m["node_id"]: m["alive"] for m in local["members"]} == {survivor: True,
                                                                    dead_id: False}
    assert local["directory"]["entries"] == 0


async def test_an_address_answering_as_another_node_means_its_member_is_gone(
        make_cluster) -> None:
    """A link to a member whose address now answers as another node (its process is gone,
    a new daemon took its port) declares it dead at once, as a refused dial does."""
    cluster = await make_cluster(1)
    host, port = cluster.nodes[0].listen.rsplit(":", 1)
    with open(cluster.token_file, "rb") as f:
        me = Identity("a-member", f.read().strip())
    gone = MemberInfo(node_id="gone-before", host=host, port=int(port), socket="", host_id="")
    declared: list[str] = []
    link = PeerLink(gone, me, interval=0.5, timeout=4.0, on_dead=declared.append)
    try:
        with pytest.raises(PeerUnavailableError, match="not gone-before"):
            await link.request(Ping(), timeout=IO_TIMEOUT)
        assert link.liveness.dead and declared == ["gone-before"]
    finally:
        link.close()
