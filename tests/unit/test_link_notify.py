"""A one-way message to a member whose connection is closing is only logged, never raised into
the sender's work (``PeerLink.notify``): the transport refuses the frame before the channel has
heard that the connection is lost, in the moment a peer dies."""

from __future__ import annotations

import asyncio
import socket

from hoplite_client.net.channel import Channel
from hoplite_client.net.handshake import Identity
from hoplite_client.net.protocol import FrameProtocol
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import MemberInfo, Progress
from hoplited.cluster.links import PeerLink


async def test_a_notice_on_a_closing_connection_is_not_raised() -> None:
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_connection(lambda: FrameProtocol(name="t"), sock=ours)
    member = MemberInfo(node_id="peer", host="127.0.0.1", port=1, socket="", host_id="h")
    link = PeerLink(member, Identity("me", b"token"), interval=0.5, timeout=4.0,
                on_dead=lambda node: None)
    try:
        link.channel = Channel(protocol)
        assert protocol.transport is not None
        protocol.transport.close()  # closing now; the channel hears of it a moment later
        assert link.channel.is_open
        link.notify(Progress(oid=ObjectID(bytes(20)), received=1))
    finally:
        protocol.abort()
        theirs.close()
        await asyncio.sleep(0)
